//! The rules in force: validated once, shared by every shard as one value
//! with one `Arc<Policy>` per rule, so that a key holds a pointer to its
//! policy rather than a copy. A change makes a new generation; each key
//! adopts its new policy at its next operation (Y4).

use std::sync::Arc;

use super::config::{Rule, Rules};
use super::durable::PolicyChange;
use super::{Engine, EngineError};
use crate::domain::Policy;

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

impl Engine {
    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.core.rules()
    }

    /// Replaces the rules; existing keys adopt their new policy at their
    /// next operation (Y4).
    pub fn set_rules(&self, rules: Rules) {
        let compiled = self.core.replace_rules(rules);
        for shard in 0..super::shards::SHARDS {
            self.shards.write(shard).rest.rules = compiled.clone();
        }
    }

    /// Adds a rule at the end (before the default), or replaces the rule
    /// with the same match where it stands (Y4: keys adopt it at their next
    /// operation). Returns the rule's position; fails only when the data
    /// dir cannot keep the change (which is in force all the same).
    pub fn set_rule(&self, rule: Rule) -> Result<usize, EngineError> {
        let change = || PolicyChange::set(&rule);
        self.change_policies(change, || Ok(self.set_rule_now(rule.clone())))
    }

    pub(super) fn set_rule_now(&self, rule: Rule) -> usize {
        let mut rules = (*self.rules()).clone();
        let position = put_rule(&mut rules, rule);
        self.set_rules(rules);
        position
    }

    /// Replaces the default rule; fails only when the data dir cannot
    /// keep the change (which is in force all the same).
    pub fn set_default(&self, policy: Policy) -> Result<(), EngineError> {
        let change = || PolicyChange::Default {
            policy: policy.spec(),
        };
        self.change_policies(change, || {
            self.set_default_now(policy);
            Ok(())
        })
    }

    pub(super) fn set_default_now(&self, policy: Policy) {
        let mut rules = (*self.rules()).clone();
        rules.default = policy;
        self.set_rules(rules);
    }

    /// Removes the rule whose match is written `pattern`.
    pub fn delete_rule(&self, pattern: &str) -> Result<(), EngineError> {
        let change = || PolicyChange::Delete {
            pattern: pattern.to_owned(),
        };
        self.change_policies(change, || self.delete_rule_now(pattern))
    }

    pub(super) fn delete_rule_now(&self, pattern: &str) -> Result<(), EngineError> {
        let mut rules = (*self.rules()).clone();
        drop_rule(&mut rules, pattern)?;
        self.set_rules(rules);
        Ok(())
    }

    /// Puts reloaded rules in force: every rule, those set at run time
    /// too (the data dir forgets them as well).
    pub fn reload_rules(&self, rules: Rules) {
        let _ = self.change_policies(
            || PolicyChange::Reload,
            || {
                self.set_rules(rules);
                Ok(())
            },
        );
    }

    /// The policy a fresh `key` would get now.
    pub(super) fn policy_for(&self, key: &str) -> Arc<Policy> {
        self.core.policy_for(key)
    }
}
