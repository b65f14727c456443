//! Lower-case hexadecimal, the text form of ticket ids, policy ids, keys
//! inside tickets and page tokens, and MACs: written and read by hand,
//! without formatting machinery, since a server writes some on every
//! decision.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lower-case hex digits, two per byte.
pub fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    push_hex(&mut text, bytes);
    text
}

/// Appends `bytes` to `text` as lower-case hex digits.
pub fn push_hex(text: &mut String, bytes: &[u8]) {
    for &b in bytes {
        text.push(char::from(DIGITS[usize::from(b >> 4)]));
        text.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}

/// The bytes lower-case hex digits name; `None` for an odd length or any
/// other character (upper-case digits included: every form here is
/// written in lower case, so another spelling is not one of ours).
pub fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    text.chunks_exact(2)
        .map(|pair| Some((digit(pair[0])? << 4) | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hex_reads_back_and_is_what_format_writes(bytes: Vec<u8>) {
            let text = hex(&bytes);
            let formatted: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            prop_assert_eq!(&text, &formatted);
            prop_assert_eq!(unhex(text.as_bytes()), Some(bytes));
        }

        #[test]
        fn anything_else_is_not_hex(text in "[0-9a-fA-Z]{0,9}") {
            let ours = text.len() % 2 == 0 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            prop_assert_eq!(unhex(text.as_bytes()).is_some(), ours);
        }
    }
}
