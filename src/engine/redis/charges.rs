//! Charges over several keys, all or nothing, on a shared store: one
//! `FB.CHARGE` over keys of one hash slot (the module quotes every key and
//! charges them all, or none, in one command). The rate-limit service's
//! keys share their domain as hash tag, so one request's keys are on one
//! primary; keys of several slots are refused (CROSSSLOT), never charged
//! in part.

use std::collections::BTreeMap;

use redis::Value;

use std::sync::Arc;

use super::keys::{policy_id, redis_key};
use super::{RedisStore, Sent};
use crate::domain::Quote;
use crate::domain::{Decision, Grant, Policy, Reason, TicketId};
use crate::engine::error::check_key;
use crate::engine::{ChargeItem, ChargeReply, EngineError};

impl RedisStore {
    /// See [`crate::engine::Engine::charge_all`]: the same answer, from
    /// the module's `FB.CHARGE`.
    pub async fn charge_all(&self, items: &[ChargeItem]) -> Result<ChargeReply, EngineError> {
        if self.core.is_shutting_down() {
            return Err(EngineError::ShuttingDown);
        }
        let mut keys: BTreeMap<&str, (u32, Option<&Arc<Policy>>)> = BTreeMap::new();
        for item in items {
            check_key(&item.key)?;
            let entry = keys
                .entry(item.key.as_str())
                .or_insert((0, item.policy.as_ref()));
            entry.0 = entry.0.saturating_add(item.permits);
        }
        let mut sent = Vec::with_capacity(keys.len());
        for (key, (_, policy)) in &keys {
            sent.push(match policy {
                // A request's own policy (a descriptor's limit): sent as
                // its id, or its JSON when the node does not know it.
                Some(policy) => {
                    let json = serde_json::to_string(&policy.spec())
                        .map_err(|e| EngineError::Internal(format!("the policy as JSON: {e}")))?;
                    Arc::new(Sent {
                        by_id: format!("@{}", policy_id(&json)).into(),
                        json: json.into(),
                    })
                }
                None => self.sent_policy(key)?,
            });
            self.remember(key);
            self.bump(key);
        }
        let now = self.now_arg();
        let make = |by_id: bool| {
            let mut cmd = redis::cmd("FB.CHARGE");
            for ((key, (permits, _)), policy) in keys.iter().zip(&sent) {
                cmd.arg(redis_key(key))
                    .arg(if by_id { &*policy.by_id } else { &*policy.json })
                    .arg(*permits);
            }
            cmd.arg(&now);
            cmd
        };
        let value = match self.conn.query_or_unknown_policy(&make(true)).await? {
            Some(value) => value,
            None => self.conn.query(&make(false)).await?,
        };
        let numbers = numbers_of(&value)
            .filter(|n| n.len() == 1 + 4 * keys.len())
            .ok_or_else(|| EngineError::Internal(format!("FB.CHARGE replied {value:?}")))?;
        let charged = numbers[0] == 1;
        // Each key's charge counts as a decision, as embedded.
        let decision = if charged {
            Decision::Granted(Some(Grant {
                ticket: TicketId(0),
                lease_end: 0,
            }))
        } else {
            Decision::Denied {
                reason: Reason::NoPermits,
                retry_after: None,
            }
        };
        for _ in 0..keys.len() {
            self.counted.count(&decision);
        }
        let quotes: BTreeMap<&str, Quote> = keys
            .keys()
            .zip(numbers[1..].chunks(4))
            .map(|(&key, n)| {
                (
                    key,
                    Quote {
                        fits: n[0] == 1,
                        limit: u32::try_from(n[1]).ok(),
                        remaining: u32::try_from(n[2]).unwrap_or(0),
                        reset_in: u64::try_from(n[3]).ok(),
                    },
                )
            })
            .collect();
        Ok(ChargeReply {
            quotes: items.iter().map(|i| quotes[i.key.as_str()]).collect(),
            charged,
            now: self.core.now(),
        })
    }
}

fn numbers_of(value: &Value) -> Option<Vec<i64>> {
    match value {
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}
