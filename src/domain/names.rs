//! Every enum that is written as text (phases, reasons, outcomes, decision
//! kinds, causes, the wire's channels and reply forms) is named in one
//! place: its `as_str`. Its `FromStr` reads those names back, in any case,
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

/// The variant of `all` that `given` names (as `name` writes it, in any
/// case).
pub(crate) fn find<T: Copy>(
    what: &'static str,
    all: &[T],
    name: impl Fn(T) -> &'static str,
    given: &str,
) -> Result<T, UnknownName> {
    all.iter()
        .copied()
        .find(|v| name(*v).eq_ignore_ascii_case(given))
        .ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|v| name(*v)).collect();
            let expected = match names.split_last() {
                Some((last, [])) => (*last).to_owned(),
                Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                None => String::new(),
            };
            UnknownName {
                what,
                given: given.to_owned(),
                expected,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_found_in_any_case_and_an_unknown_one_lists_the_names() {
        let all = [1u8, 2, 3];
        let name = |n: u8| ["one", "two", "three"][usize::from(n) - 1];
        assert_eq!(find("number", &all, name, "TWO"), Ok(2));
        let e = find("number", &all, name, "four").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"number: "four" is not one; send one, two or three"#
        );
    }
}
