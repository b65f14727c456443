//! Budgets of keys per descriptor node of Envoy's rate-limit service
//! (RL20): a limited node that takes any value makes one key per value,
//! and its budget keeps it from taking the room of the credential's other
//! nodes. Each node counts, per credential, the keys it charged lately,
//! each until the time it would no longer hold its room: embedded, until
//! the key is back at rest (a key at rest is forgotten when room is
//! needed); with a store, until the credential's key share lets it go
//! (decisions 104). The server keeps its own budgets, as it keeps shares.

use std::collections::HashMap;
use std::sync::Arc;

use dashmap::DashMap;

use crate::domain::Millis;

/// How often, at most, a full node looks for keys to let go.
const LOOK_EVERY: Millis = 1_000;

/// One node's keys for one credential: each with the time it is let go,
/// and when they were last looked over.
#[derive(Debug, Default)]
struct NodeKeys {
    keys: HashMap<Arc<str>, Millis>,
    looked: Option<Millis>,
}

/// A key charged through a node that takes any value, as its budget
/// sees it.
#[derive(Clone, Copy, Debug)]
pub struct NodeUse<'a> {
    /// The node ([`crate::rls::Budget::node`]).
    pub node: &'a str,
    /// The key.
    pub key: &'a str,
    /// The node's `max_keys`, when set.
    pub max_keys: Option<u64>,
    /// The part of the key share it may count without `max_keys`.
    pub part: f64,
    /// How long after a charge the key is back at rest, at most.
    pub rests_within: Millis,
}

/// Every node's keys, by node and credential (`""` without one).
#[derive(Debug, Default)]
pub struct Budgets {
    by_node: DashMap<Arc<str>, HashMap<Arc<str>, NodeKeys>>,
}

impl Budgets {
    /// Counts `key` as one of `node`'s keys for `tenant` until `until`
    /// (a later use moves it later). A key it does not count yet is
    /// refused (false) when the node counts `limit` keys; a full node
    /// first lets go of the keys whose time passed, looking at most once
    /// a second.
    pub fn use_key(
        &self,
        node: &str,
        tenant: &str,
        key: &str,
        now: Millis,
        until: Millis,
        limit: u64,
    ) -> bool {
        let mut tenants = match self.by_node.get_mut(node) {
            Some(tenants) => tenants,
            None => self.by_node.entry(Arc::from(node)).or_default(),
        };
        let keys = match tenants.get_mut(tenant) {
            Some(keys) => keys,
            None => tenants.entry(Arc::from(tenant)).or_default(),
        };
        if let Some(end) = keys.keys.get_mut(key) {
            *end = (*end).max(until);
            return true;
        }
        let full = |keys: &NodeKeys| keys.keys.len() as u64 >= limit;
        if full(keys)
            && keys
                .looked
                .is_none_or(|t| now >= t.saturating_add(LOOK_EVERY))
        {
            keys.keys.retain(|_, end| *end > now);
            keys.looked = Some(now);
        }
        if full(keys) {
            return false;
        }
        keys.keys.insert(Arc::from(key), until);
        true
    }

    /// The keys `node` counts for `tenant`.
    pub fn held(&self, node: &str, tenant: &str) -> usize {
        self.by_node
            .get(node)
            .and_then(|t| t.get(tenant).map(|k| k.keys.len()))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_node_takes_a_new_key_only_once_one_is_let_go() {
        let budgets = Budgets::default();
        assert!(budgets.use_key("n", "a", "k1", 0, 100, 2));
        assert!(budgets.use_key("n", "a", "k2", 10, 5_000, 2));
        // Keys it counts are always taken; another credential has its own.
        assert!(budgets.use_key("n", "a", "k1", 20, 120, 2));
        assert!(budgets.use_key("n", "b", "k3", 20, 120, 2));
        assert!(!budgets.use_key("n", "a", "k3", 30, 130, 2));
        // k1's time passed, but a full node looks at most once a second.
        assert!(!budgets.use_key("n", "a", "k3", 200, 300, 2));
        assert!(budgets.use_key("n", "a", "k3", 1_030, 1_100, 2));
        assert_eq!(budgets.held("n", "a"), 2);
        assert!(!budgets.use_key("n", "a", "k4", 1_040, 1_100, 2));
        assert_eq!(budgets.held("other", "a"), 0);
    }
}
