//! Changing the rules in force: one rule, the default, every rule at a
//! reload. Each change is kept in the data dir (when there is one) before
//! it is in force, and keys adopt it at their next operation (Y4).

use std::sync::Arc;

use super::embedded::Engine;
use super::error::EngineError;
use super::rules::{drop_rule, put_rule, Rule, Rules};
use super::shards::SHARDS;
use super::storage::PolicyChange;
use crate::domain::Policy;

impl Engine {
    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.core.rules()
    }

    /// Replaces the rules; existing keys adopt their new policy at their
    /// next operation (Y4).
    pub fn set_rules(&self, rules: Rules) {
        let compiled = self.core.replace_rules(rules);
        for shard in 0..SHARDS {
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
