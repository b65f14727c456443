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

use super::super::EngineError;
use super::listen::POLICIES;
use super::RedisStore;
use crate::domain::PolicySpec;
use crate::engine::{Pattern, Rule, Rules};

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
        Ok(redis::Value::BulkString(bytes)) => match content(store, &bytes) {
            None => {}
            Some(json) => match from_json(json) {
                Ok(rules) => {
                    let count = rules.rules.len();
                    if store.policy_writes.adopt(store.core(), json, rules) {
                        tracing::info!(rules = count, "the fleet's policies changed in the store: keys adopt them at their next operation");
                    }
                }
                Err(e) => tracing::error!(
                    "the policies in the store ({POLICIES_KEY}) do not read: {e}; the running ones stay"
                ),
            },
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

/// A change on this server: `change` is applied to the rules in force,
/// which are then put in force here, and written to Redis and the other
/// servers told, through the writer task. Nothing is changed when
/// `change` refuses.
pub fn change<R, E>(
    store: &RedisStore,
    change: impl FnOnce(&mut Rules) -> Result<R, E>,
) -> Result<R, E> {
    // One lock for reading, changing, noting, sending and putting in
    // force, and for reading back (adopt): two changes cannot lose one
    // another, and a read of an earlier write cannot come in between.
    let mut sent = store.policy_writes.sent.lock().expect("policy writes");
    let mut rules = (*store.core().rules()).clone();
    let out = change(&mut rules)?;
    let text = to_json(&rules);
    let json = sealed(store, POLICIES_KEY, &text);
    let changed = sealed(store, POLICIES, "changed");
    if sent.len() == REMEMBERED_WRITES {
        sent.pop_front();
    }
    sent.push_back(Writes::hash(text.as_bytes()));
    let _ = store.policy_writes.writer.send((json, changed));
    store.core().replace_rules(rules);
    Ok(out)
}

/// This server's writes of the shared policies: sent by one task, in the
/// order they were made (two changes in a row reach Redis in that order),
/// and remembered, so that reading back an earlier one of them, already
/// replaced here, does not undo the later (decisions 100).
#[derive(Debug)]
pub struct Writes {
    /// Hashes of the last writes, oldest first.
    sent: std::sync::Mutex<std::collections::VecDeque<u64>>,
    writer: tokio::sync::mpsc::UnboundedSender<(String, String)>,
}

/// Writes remembered.
const REMEMBERED_WRITES: usize = 64;

impl Writes {
    /// The writes of a server on `conn`, and the task that sends them.
    pub(super) fn start(conn: &super::conn::Conn) -> Writes {
        let (writer, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
        let conn = conn.clone();
        tokio::spawn(async move {
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
        Writes {
            sent: std::sync::Mutex::new(std::collections::VecDeque::new()),
            writer,
        }
    }

    fn hash(text: &[u8]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        h.finish()
    }

    /// Puts `rules`, read back from Redis as `json`, in force unless they
    /// are one of this server's writes that a later one replaced, or
    /// what is in force already; true when they were put in force.
    fn adopt(&self, core: &super::super::Core, json: &[u8], rules: Rules) -> bool {
        let h = Writes::hash(json);
        let sent = self.sent.lock().expect("policy writes");
        let superseded = sent.back() != Some(&h) && sent.contains(&h);
        if superseded || *core.rules() == rules {
            return false;
        }
        core.replace_rules(rules);
        true
    }
}
