//! The rules (Y1): which policy a key gets, by ordered patterns and a
//! default; and the rules in force, validated once and shared by every
//! shard as one value with one `Arc<Policy>` per rule, so that a key holds
//! a pointer to its policy rather than a copy. A change makes a new
//! generation; each key adopts its new policy at its next operation (Y4).

use std::sync::Arc;

use super::error::EngineError;
use crate::domain::Policy;

/// How a rule matches keys (Y1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Exactly this key.
    Exact(String),
    /// Every key that starts with this prefix (written `prefix*`).
    Prefix(String),
}

impl Pattern {
    /// Parses `"a/b"` or `"a/*"`; `*` may only end a pattern.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        if text.is_empty() {
            return Err("must not be empty".into());
        }
        if let Some(c) = text.chars().find(|&c| crate::domain::key::is_control(c)) {
            return Err(format!(
                "{text:?}: must not contain control or bidirectional formatting characters (found U+{:04X}), like keys (K1)",
                u32::from(c)
            ));
        }
        match text.find('*') {
            None => Ok(Pattern::Exact(text.to_owned())),
            Some(i) if i == text.len() - 1 => Ok(Pattern::Prefix(text[..i].to_owned())),
            Some(_) => Err(format!(
                "{text:?}: '*' may appear only once, at the end of a prefix pattern"
            )),
        }
    }

    /// True when the pattern matches `key`.
    pub fn matches(&self, key: &str) -> bool {
        match self {
            Pattern::Exact(k) => k == key,
            Pattern::Prefix(p) => key.starts_with(p.as_str()),
        }
    }

    /// The pattern as written.
    pub fn text(&self) -> String {
        match self {
            Pattern::Exact(k) => k.clone(),
            Pattern::Prefix(p) => format!("{p}*"),
        }
    }
}

/// A validated rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Which keys.
    pub pattern: Pattern,
    /// Their policy.
    pub policy: Policy,
}

/// Validated, ordered rules and the default (Y1).
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// Ordered rules.
    pub rules: Vec<Rule>,
    /// The default policy.
    pub default: Policy,
}

impl Default for Rules {
    /// No rules and the built-in default of Y3.
    fn default() -> Self {
        Rules {
            rules: Vec::new(),
            default: Policy::default(),
        }
    }
}

impl Rules {
    /// The policy of the first rule that matches `key`, else the default.
    pub fn policy_for(&self, key: &str) -> &Policy {
        self.rules
            .iter()
            .find(|r| r.pattern.matches(key))
            .map_or(&self.default, |r| &r.policy)
    }
}

/// Rules as the shards use them.
#[derive(Debug)]
pub(super) struct Compiled {
    /// The rules as configured.
    pub rules: Arc<Rules>,
    /// Each rule's policy, in rule order.
    policies: Vec<Arc<Policy>>,
    /// The default policy.
    default: Arc<Policy>,
    /// Changes with every change of the rules.
    pub generation: u32,
}

impl Compiled {
    pub fn new(rules: Rules, generation: u32) -> Self {
        Compiled {
            policies: rules.rules.iter().map(|r| Arc::new(r.policy)).collect(),
            default: Arc::new(rules.default),
            rules: Arc::new(rules),
            generation,
        }
    }

    /// The policy of the first rule that matches `key`, else the default (Y1).
    pub fn policy_for(&self, key: &str) -> &Arc<Policy> {
        self.rules
            .rules
            .iter()
            .position(|r| r.pattern.matches(key))
            .map_or(&self.default, |i| &self.policies[i])
    }
}

/// Adds `rule` at the end (before the default), or puts it in place of the
/// rule with the same match; returns its position.
pub(super) fn put_rule(rules: &mut Rules, rule: Rule) -> usize {
    match rules.rules.iter().position(|r| r.pattern == rule.pattern) {
        Some(i) => {
            rules.rules[i] = rule;
            i
        }
        None => {
            rules.rules.push(rule);
            rules.rules.len() - 1
        }
    }
}

/// Removes the rule whose match is written `pattern`.
pub(super) fn drop_rule(rules: &mut Rules, pattern: &str) -> Result<(), EngineError> {
    let before = rules.rules.len();
    rules.rules.retain(|r| r.pattern.text() != pattern);
    if rules.rules.len() == before {
        return Err(EngineError::RuleNotFound {
            pattern: pattern.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_refuse_what_keys_refuse() {
        assert_eq!(Pattern::parse("a/*"), Ok(Pattern::Prefix("a/".into())));
        assert_eq!(Pattern::parse("a/b"), Ok(Pattern::Exact("a/b".into())));
        for bad in ["", "a*b", "pay\u{202E}ments/*", "a\u{0}b", "x\u{2066}*"] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Pattern::parse("a\u{202E}b/*")
            .unwrap_err()
            .contains("U+202E"));
    }
}
