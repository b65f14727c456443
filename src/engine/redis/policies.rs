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

use super::super::{Core, EngineError};
use super::conn::Conn;
use super::sign::NoticeKey;
use crate::domain::wire::Channel;
use crate::domain::PolicySpec;
use crate::engine::{Pattern, Rule, Rules};

/// The Redis key of the shared rules.
pub const POLICIES_KEY: &str = "fusebox:policies";

#[derive(Debug, Serialize, Deserialize)]
struct RulesJson {
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
    let shared = RulesJson {
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
    let shared: RulesJson = serde_json::from_slice(text).map_err(|e| e.to_string())?;
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

/// The rules as this server shares them through Redis: what it writes,
/// in order, and what it reads back.
pub struct SharedRules {
    core: Arc<Core>,
    conn: Conn,
    /// The fleet's secret, if it has one.
    notices: Option<NoticeKey>,
    /// Hashes of this server's last writes, oldest first: reading back an
    /// earlier one of them, already replaced here, does not undo the later
    /// (decisions 100).
    sent: std::sync::Mutex<std::collections::VecDeque<u64>>,
    /// The writes, sent by one task in the order they were made (two
    /// changes in a row reach Redis in that order).
    writer: tokio::sync::mpsc::UnboundedSender<(String, String)>,
}

impl SharedRules {
    /// The shared rules of a server around `core` on `conn`, and the task
    /// that writes them.
    pub(super) fn new(core: Arc<Core>, conn: &Conn, notices: Option<NoticeKey>) -> SharedRules {
        let (writer, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
        let link = conn.clone();
        tokio::spawn(async move {
            while let Some((json, changed)) = rx.recv().await {
                let mut set = redis::cmd("SET");
                set.arg(POLICIES_KEY).arg(&json);
                let mut publish = redis::cmd("PUBLISH");
                publish.arg(Channel::Policies.as_str()).arg(&changed);
                let written = match link.query(&set).await {
                    Ok(_) => link.query(&publish).await.map(drop),
                    Err(e) => Err(e),
                };
                if let Err(e) = written {
                    tracing::error!("a policy change is in force on this server but could not be shared through the store: {e}; other servers keep the old policies until the next change");
                }
            }
        });
        SharedRules {
            core,
            conn: conn.clone(),
            notices,
            sent: std::sync::Mutex::new(std::collections::VecDeque::new()),
            writer,
        }
    }

    /// `text` as it is written to the key or published: signed when the
    /// store has a secret.
    fn sealed(&self, name: &str, text: &str) -> String {
        match &self.notices {
            Some(key) => key.seal(name, text),
            None => text.to_owned(),
        }
    }

    /// At start-up: adopts the rules Redis holds, or writes this server's.
    pub async fn start(&self) -> Result<(), EngineError> {
        let mut get = redis::cmd("GET");
        get.arg(POLICIES_KEY);
        if let redis::Value::Nil = self.conn.query(&get).await? {
            let mut set = redis::cmd("SET");
            set.arg(POLICIES_KEY)
                .arg(self.sealed(POLICIES_KEY, &to_json(&self.core.rules())))
                .arg("NX");
            self.conn.query(&set).await?;
            tracing::info!("the store held no policies: this server's config is now the fleet's");
            // Another server may have written first (NX): read what won.
        }
        self.load().await;
        Ok(())
    }

    /// Reads the shared rules and puts them in force (logged when they
    /// fail to read: the running rules stay).
    pub async fn load(&self) {
        let mut get = redis::cmd("GET");
        get.arg(POLICIES_KEY);
        match self.conn.query(&get).await {
            Ok(redis::Value::BulkString(bytes)) => match self.content(&bytes) {
                None => {}
                Some(json) => match from_json(json) {
                    Ok(rules) => {
                        let count = rules.rules.len();
                        if self.adopt(json, rules) {
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

    /// The JSON in the key's content, verified when the store has a
    /// secret; `None` (counted and logged) when it does not verify.
    fn content<'a>(&self, bytes: &'a [u8]) -> Option<&'a [u8]> {
        let Some(key) = &self.notices else {
            return Some(bytes);
        };
        match key.open(POLICIES_KEY, bytes) {
            Ok(json) => Some(json),
            Err(why) => {
                self.conn.figures().dropped(
                    None,
                    &format!("{why}; the running policies stay, and the next SetPolicy, DeletePolicy or config reload writes signed ones"),
                );
                None
            }
        }
    }

    /// A change on this server: `change` is applied to the rules in force,
    /// which are then put in force here, and written to Redis and the
    /// other servers told, through the writer task. Nothing is changed
    /// when `change` refuses.
    pub fn change<R, E>(&self, change: impl FnOnce(&mut Rules) -> Result<R, E>) -> Result<R, E> {
        // One lock for reading, changing, noting, sending and putting in
        // force, and for reading back (adopt): two changes cannot lose one
        // another, and a read of an earlier write cannot come in between.
        let mut sent = self.sent.lock().expect("policy writes");
        let mut rules = (*self.core.rules()).clone();
        let out = change(&mut rules)?;
        let text = to_json(&rules);
        let json = self.sealed(POLICIES_KEY, &text);
        let changed = self.sealed(Channel::Policies.as_str(), "changed");
        if sent.len() == REMEMBERED_WRITES {
            sent.pop_front();
        }
        sent.push_back(hash(text.as_bytes()));
        let _ = self.writer.send((json, changed));
        self.core.replace_rules(rules);
        Ok(out)
    }

    /// Puts `rules`, read back from Redis as `json`, in force unless they
    /// are one of this server's writes that a later one replaced, or
    /// what is in force already; true when they were put in force.
    fn adopt(&self, json: &[u8], rules: Rules) -> bool {
        let h = hash(json);
        let sent = self.sent.lock().expect("policy writes");
        let superseded = sent.back() != Some(&h) && sent.contains(&h);
        if superseded || *self.core.rules() == rules {
            return false;
        }
        self.core.replace_rules(rules);
        true
    }
}

/// Writes remembered.
const REMEMBERED_WRITES: usize = 64;

fn hash(text: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}
