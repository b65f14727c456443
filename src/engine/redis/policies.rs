//! The rules, shared through Redis: every server serves the same policies.
//! They are kept as JSON at the Redis key `fusebox:policies`; a server that
//! changes them (SetPolicy, DeletePolicy, a config reload) writes the key
//! and publishes on the `fusebox:policies` channel, and every server reads
//! the key again when it hears that (and when it subscribes again after a
//! lost connection). At start-up a server adopts the rules Redis holds, or
//! writes its own when there are none yet.
//!
//! With a secret (`--store-secret-file`), what a server writes to the key
//! is signed as the module signs its messages, for the key's name (`<MAC>
//! <JSON>`), and so is what it publishes (`<MAC> changed`); a server reads
//! only content it can verify, and acts only on messages it can verify.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::super::config::{Pattern, Rule, Rules};
use super::super::EngineError;
use super::listen::POLICIES;
use super::RedisStore;
use crate::domain::PolicySpec;

/// The Redis key of the shared rules.
pub const POLICIES_KEY: &str = "fusebox:policies";

#[derive(Debug, Serialize, Deserialize)]
struct Shared {
    rules: Vec<SharedRule>,
    default: PolicySpec,
}

#[derive(Debug, Serialize, Deserialize)]
struct SharedRule {
    #[serde(rename = "match")]
    pattern: String,
    policy: PolicySpec,
}

/// The rules as JSON.
pub fn to_json(rules: &Rules) -> String {
    let shared = Shared {
        rules: rules
            .rules
            .iter()
            .map(|r| SharedRule {
                pattern: r.pattern.text(),
                policy: r.policy.spec(),
            })
            .collect(),
        default: rules.default.spec(),
    };
    serde_json::to_string(&shared).expect("rules serialize")
}

/// Rules from their JSON, every policy validated.
pub fn from_json(text: &[u8]) -> Result<Rules, String> {
    let shared: Shared = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let rules = shared
        .rules
        .into_iter()
        .map(|r| {
            Ok(Rule {
                pattern: Pattern::parse(&r.pattern)?,
                policy: r.policy.validate().map_err(|e| e.to_string())?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Rules {
        rules,
        default: shared.default.validate().map_err(|e| e.to_string())?,
    })
}

/// `text` as it is written to the key or published: signed when the store
/// has a secret.
fn sealed(store: &RedisStore, name: &str, text: &str) -> String {
    match &store.notices {
        Some(key) => key.seal(name, text),
        None => text.to_owned(),
    }
}

/// At start-up: adopts the rules Redis holds, or writes this server's.
pub async fn start(store: &Arc<RedisStore>) -> Result<(), EngineError> {
    let mut get = redis::cmd("GET");
    get.arg(POLICIES_KEY);
    match store.conn.query(&get).await? {
        redis::Value::Nil => {
            let mut set = redis::cmd("SET");
            set.arg(POLICIES_KEY)
                .arg(sealed(store, POLICIES_KEY, &to_json(&store.core().rules())))
                .arg("NX");
            store.conn.query(&set).await?;
            tracing::info!("the store held no policies: this server's config is now the fleet's");
            // Another server may have written first (NX): read what won.
            load(store).await;
        }
        _ => load(store).await,
    }
    Ok(())
}

/// Reads the shared rules and puts them in force (logged when they fail
/// to read: the running rules stay).
pub async fn load(store: &Arc<RedisStore>) {
    let mut get = redis::cmd("GET");
    get.arg(POLICIES_KEY);
    match store.conn.query(&get).await {
        Ok(redis::Value::BulkString(bytes)) => match content(store, &bytes)
            .filter(|json| !store.policy_writes.superseded(json))
            .map(from_json)
        {
            None => {}
            Some(Ok(rules)) if *store.core().rules() != rules => {
                let count = rules.rules.len();
                store.core().replace_rules(rules);
                tracing::info!(rules = count, "the fleet's policies changed in the store: keys adopt them at their next operation");
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => tracing::error!(
                "the policies in the store ({POLICIES_KEY}) do not read: {e}; the running ones stay"
            ),
        },
        Ok(redis::Value::Nil) => {}
        Ok(other) => {
            tracing::error!("{POLICIES_KEY} holds {other:?}, not policies; the running ones stay")
        }
        Err(e) => tracing::warn!(
            "cannot read the fleet's policies from the store: {e}; the running ones stay"
        ),
    }
}

/// The JSON in the key's content, verified when the store has a secret;
/// `None` (counted and logged) when it does not verify.
fn content<'a>(store: &RedisStore, bytes: &'a [u8]) -> Option<&'a [u8]> {
    let Some(key) = &store.notices else {
        return Some(bytes);
    };
    match key.open(POLICIES_KEY, bytes) {
        Ok(json) => Some(json),
        Err(why) => {
            store.conn.figures().dropped(
                None,
                &format!("{why}; the running policies stay, and the next SetPolicy, DeletePolicy or config reload writes signed ones"),
            );
            None
        }
    }
}

/// After a change on this server: writes the rules to Redis and tells the
/// other servers. Spawned: the change is in force here already.
pub fn publish(store: &RedisStore) {
    let text = to_json(&store.core().rules());
    store.policy_writes.note(&text);
    let json = sealed(store, POLICIES_KEY, &text);
    let changed = sealed(store, POLICIES, "changed");
    let Some(writer) = store.policy_writes.writer(&store.conn) else {
        return;
    };
    let _ = writer.send((json, changed));
}

/// This server's writes of the shared policies: sent by one task, in the
/// order they were made (two changes in a row reach Redis in that order),
/// and remembered, so that reading back an earlier one of them, already
/// replaced here, does not undo the later (decisions 100).
#[derive(Debug, Default)]
pub struct Writes {
    /// Hashes of the last writes, oldest first.
    sent: std::sync::Mutex<std::collections::VecDeque<u64>>,
    writer: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<(String, String)>>,
}

/// Writes remembered.
const REMEMBERED_WRITES: usize = 64;

impl Writes {
    fn hash(text: &[u8]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        h.finish()
    }

    fn note(&self, text: &str) {
        let mut sent = self.sent.lock().expect("policy writes");
        if sent.len() == REMEMBERED_WRITES {
            sent.pop_front();
        }
        sent.push_back(Writes::hash(text.as_bytes()));
    }

    /// True when `text` is one of this server's writes that a later one replaced.
    fn superseded(&self, text: &[u8]) -> bool {
        let h = Writes::hash(text);
        let sent = self.sent.lock().expect("policy writes");
        sent.back() != Some(&h) && sent.contains(&h)
    }

    /// The task that writes, started at the first write.
    fn writer(
        &self,
        conn: &super::conn::Conn,
    ) -> Option<&tokio::sync::mpsc::UnboundedSender<(String, String)>> {
        if let Some(writer) = self.writer.get() {
            return Some(writer);
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
        let conn = conn.clone();
        let mut started = false;
        let writer = self.writer.get_or_init(|| {
            started = true;
            tx
        });
        if started {
            handle.spawn(async move {
                while let Some((json, changed)) = rx.recv().await {
                    let mut set = redis::cmd("SET");
                    set.arg(POLICIES_KEY).arg(&json);
                    let mut publish = redis::cmd("PUBLISH");
                    publish.arg(POLICIES).arg(&changed);
                    let written = match conn.query(&set).await {
                        Ok(_) => conn.query(&publish).await.map(drop),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = written {
                        tracing::error!("a policy change is in force on this server but could not be shared through the store: {e}; other servers keep the old policies until the next change");
                    }
                }
            });
        }
        Some(writer)
    }
}
