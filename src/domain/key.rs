//! The key syntax of SPEC K1, and how long a key at rest is kept (K2).

/// How long a key at rest (closed, no failures counted, no ticket, no
/// waiter) is kept before it is forgotten (SPEC K2): the embedded engine's
/// default `idle_after`, and the Redis module's expiry of a key at rest.
pub const IDLE_AFTER: crate::Millis = 600_000;

/// Why a key is not acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key is empty.
    #[error("key: must not be empty")]
    Empty,
    /// The key is longer than 256 bytes.
    #[error("key: must be at most 256 bytes of UTF-8, not {0}")]
    TooLong(usize),
    /// The key holds a control character, or a bidirectional formatting
    /// character that would make it read differently from what it is.
    #[error("key: must not contain control characters (found U+{0:04X})")]
    Control(u32),
}

/// True for the characters K1 refuses as control characters: the Unicode
/// controls (Cc) and the bidirectional formatting characters (the marks
/// U+200E, U+200F and U+061C, the embeddings and overrides U+202A to
/// U+202E, the isolates U+2066 to U+2069), which make a key display as
/// another key would.
pub fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

/// The longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 256;

/// Checks K1: UTF-8 (guaranteed by `&str`), 1 to 256 bytes, no control characters.
pub fn validate_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(KeyError::TooLong(key.len()));
    }
    if let Some(c) = key.chars().find(|&c| is_control(c)) {
        return Err(KeyError::Control(u32::from(c)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_to_256_bytes_without_control_characters_pass() {
        assert_eq!(validate_key(""), Err(KeyError::Empty));
        assert_eq!(validate_key("a"), Ok(()));
        assert_eq!(validate_key(&"é".repeat(128)), Ok(()));
        assert_eq!(validate_key(&"x".repeat(257)), Err(KeyError::TooLong(257)));
        assert_eq!(validate_key("a\nb"), Err(KeyError::Control(10)));
        assert_eq!(validate_key("a\u{7f}"), Err(KeyError::Control(0x7f)));
        assert!(validate_key("payments/eu-west/ünïcode").is_ok());
        for c in ['\u{202E}', '\u{2066}', '\u{2069}', '\u{200F}', '\u{061C}'] {
            let key = format!("pay{c}ments");
            assert_eq!(validate_key(&key), Err(KeyError::Control(u32::from(c))));
        }
        assert!(validate_key("\u{05D0}\u{05D1}/עברית").is_ok());
    }

    const BIDI: [char; 12] = [
        '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}',
        '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
    ];

    proptest::proptest! {
        #[test]
        fn a_bidi_character_anywhere_in_a_key_is_refused(
            before in "\\PC{0,40}",
            after in "\\PC{0,40}",
            which in 0..BIDI.len(),
        ) {
            let c = BIDI[which];
            let key = format!("{before}{c}{after}");
            let found = key.chars().find(|&c| is_control(c)).map(u32::from);
            proptest::prop_assert_eq!(validate_key(&key), Err(KeyError::Control(found.unwrap())));
        }

        #[test]
        fn printable_text_without_bidi_characters_is_a_key(key in "[^\\p{Cc}\\u{061C}\\u{200E}\\u{200F}\\u{202A}-\\u{202E}\\u{2066}-\\u{2069}]{1,64}") {
            proptest::prop_assert_eq!(validate_key(&key), Ok(()));
        }
    }
}
