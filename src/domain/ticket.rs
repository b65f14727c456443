//! A ticket's identity, and its one text form: 32 lower-case hex digits.
//!
//! The breaker, the book and the fuse all name tickets (and waiters, whose
//! id becomes their ticket's) by a [`TicketId`]; the fuse only compares
//! them. Their text form is the one every store and reply writes.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A ticket's identity: 128 bits chosen by the engine (from the operating
/// system's random source), never reused. The fuse only compares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TicketId(pub u128);

/// A [`TicketId`] as kept in a key's tables: two `u64`s in the same order,
/// without the 16-byte alignment of `u128`, so that tickets and waiters pay
/// no padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PackedId([u64; 2]);

impl From<TicketId> for PackedId {
    fn from(id: TicketId) -> Self {
        PackedId([(id.0 >> 64) as u64, id.0 as u64])
    }
}

impl From<PackedId> for TicketId {
    fn from(id: PackedId) -> Self {
        TicketId((u128::from(id.0[0]) << 64) | u128::from(id.0[1]))
    }
}

impl TicketId {
    /// The id as 32 lower-case hex digits.
    pub fn to_hex(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        // 16 bytes always fill 32 digits: the lengths cannot disagree.
        let _ = hex::encode_to_slice(self.0.to_be_bytes(), &mut out);
        out
    }

    /// The id written as 1 to 32 hex digits (either case); `None` for
    /// anything else.
    pub fn from_hex(text: &[u8]) -> Option<TicketId> {
        let mut bytes = [0u8; 16];
        match text.len() {
            // The form every id is written in: read as it is.
            32 => hex::decode_to_slice(text, &mut bytes).ok()?,
            1..32 => {
                // Fewer digits are the low end of the id: padded with
                // zeros in front to the 32 the decoder reads.
                let mut digits = [b'0'; 32];
                digits[32 - text.len()..].copy_from_slice(text);
                hex::decode_to_slice(digits, &mut bytes).ok()?;
            }
            _ => return None,
        }
        Some(TicketId(u128::from_be_bytes(bytes)))
    }
}

impl fmt::Display for TicketId {
    /// 32 lower-case hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.to_hex();
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl Serialize for TicketId {
    /// As 32 lower-case hex digits: exact in every format, `u128` or not.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TicketId {
    /// From 1 to 32 hex digits.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        TicketId::from_hex(text.as_bytes()).ok_or_else(|| {
            serde::de::Error::custom(format!("ticket id {text:?} is not 1 to 32 hex digits"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The hex form is what `format!` writes, and reads back.
        #[test]
        fn an_id_reads_back_from_its_hex(id: u128) {
            let id = TicketId(id);
            let hex = id.to_hex();
            prop_assert_eq!(std::str::from_utf8(&hex).unwrap(), format!("{:032x}", id.0));
            prop_assert_eq!(TicketId::from_hex(&hex), Some(id));
            prop_assert_eq!(id.to_string(), format!("{:032x}", id.0));
        }

        /// 1 to 32 hex digits in either case read as the number they
        /// write; nothing else reads.
        #[test]
        fn short_and_upper_case_ids_read_as_numbers(text in "[0-9a-fA-F]{0,34}|[0-9a-g+ -]{1,4}") {
            let ours = TicketId::from_hex(text.as_bytes());
            let plain = !text.is_empty()
                && text.len() <= 32
                && text.bytes().all(|b| b.is_ascii_hexdigit());
            let std = if plain { u128::from_str_radix(&text, 16).ok().map(TicketId) } else { None };
            prop_assert_eq!(ours, std);
        }
    }

    #[test]
    fn a_packed_id_keeps_its_order() {
        let (a, b) = (TicketId(1 << 64), TicketId((1 << 64) - 1));
        assert!(PackedId::from(a) > PackedId::from(b));
        assert_eq!(TicketId::from(PackedId::from(a)), a);
    }
}
