//! Every enum that is written as text (phases, reasons, outcomes, decision
//! kinds, causes, the wire's channels and reply forms) is named in one
//! place: its `as_str`, which its [`Named`] impl hands on. Reading a name
//! back ([`Named::from_name`], and `FromStr` through it) takes any case,
//! since some readers have always taken any case (the Redis module's
//! arguments, the servers reading the module's lower-case replies); a name
//! that is none of them is an [`UnknownName`] that lists the ones there are.

/// Text that names none of an enum's variants.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {given:?} is not one; send {expected}")]
pub struct UnknownName {
    /// What was being named (`phase`, `reason`, `outcome`, ...).
    pub what: &'static str,
    /// The text given.
    pub given: String,
    /// The names there are, for the message.
    pub expected: String,
}

/// An enum named in one place: its variants, and each one's name.
pub trait Named: Copy + Sized + 'static {
    /// What the names name, in messages (`phase`, `reason`, ...).
    const WHAT: &'static str;

    /// Every variant.
    const VARIANTS: &'static [Self];

    /// The variant's name: the enum's `as_str`.
    fn name(self) -> &'static str;

    /// The variant `given` names, in any case; `None` when it names none.
    /// Bytes, not text: a command's argument is read without a UTF-8
    /// check first.
    #[inline]
    fn from_name(given: &[u8]) -> Option<Self> {
        Self::VARIANTS.iter().copied().find(|v| {
            let name = v.name().as_bytes();
            // Lengths first: most names are told apart by them alone.
            name.len() == given.len() && (name == given || name.eq_ignore_ascii_case(given))
        })
    }

    /// [`Named::from_name`] for `FromStr`: an [`UnknownName`] that lists
    /// the names when `given` is none of them.
    fn parse_name(given: &str) -> Result<Self, UnknownName> {
        Self::from_name(given.as_bytes()).ok_or_else(|| {
            let names: Vec<&str> = Self::VARIANTS.iter().map(|v| v.name()).collect();
            let expected = match names.split_last() {
                Some((last, [])) => (*last).to_owned(),
                Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                None => String::new(),
            };
            UnknownName {
                what: Self::WHAT,
                given: given.to_owned(),
                expected,
            }
        })
    }
}

/// Implements [`Named`] and `FromStr` for an enum from its `ALL` and its
/// `as_str`.
macro_rules! named {
    ($ty:ty, $what:literal) => {
        impl $crate::names::Named for $ty {
            const WHAT: &'static str = $what;
            const VARIANTS: &'static [Self] = &<$ty>::ALL;
            #[inline]
            fn name(self) -> &'static str {
                self.as_str()
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::names::UnknownName;
            /// A name `as_str` writes, in any case.
            fn from_str(text: &str) -> Result<Self, $crate::names::UnknownName> {
                <$ty as $crate::names::Named>::parse_name(text)
            }
        }
    };
}
pub(crate) use named;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Number {
        One,
        Two,
        Three,
    }

    impl Number {
        const ALL: [Number; 3] = [Number::One, Number::Two, Number::Three];
        fn as_str(self) -> &'static str {
            match self {
                Number::One => "one",
                Number::Two => "two",
                Number::Three => "three",
            }
        }
    }

    named!(Number, "number");

    #[test]
    fn a_name_is_found_in_any_case_and_an_unknown_one_lists_the_names() {
        assert_eq!("TWO".parse(), Ok(Number::Two));
        assert_eq!(Number::from_name(b"three"), Some(Number::Three));
        assert_eq!(Number::from_name(b"thre"), None);
        let e = "four".parse::<Number>().unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"number: "four" is not one; send one, two or three"#
        );
    }
}
