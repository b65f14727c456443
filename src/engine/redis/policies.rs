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
//! <JSON>`), and so is what it publishes (`<MAC> changed <version>`); a
//! server reads only content it can verify, and acts only on messages it
//! can verify.
//!
//! A signature says who wrote the rules, not when: an old signed copy set
//! back at the key would roll the fleet back. So the rules carry a
//! version, signed with them, one more than the highest the writing server
//! has seen; a server keeps the highest it has seen (learnt from Redis at
//! start), and refuses rules of a lower version (counted in
//! [`StoreFigures::policies_rolled_back`], logged once per version, the
//! running rules stay), and a change message that names one (counted as a
//! replay, and the key is not read). Rolling back on purpose is a change
//! like any other: the old rules, set again, are written as a new version.
//!
//! [`StoreFigures::policies_rolled_back`]: super::super::store::StoreFigures::policies_rolled_back

use std::sync::atomic::Ordering;
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
    /// The rules' version: one more than the highest their writer had
    /// seen. Absent (0) in rules written by a server older than this one.
    #[serde(default)]
    version: u64,
    rules: Vec<SharedRule>,
    default: PolicySpec,
}

#[derive(Debug, Serialize, Deserialize)]
struct SharedRule {
    #[serde(rename = "match")]
    pattern: String,
    policy: PolicySpec,
}

/// The rules as JSON, at `version`.
pub fn to_json(rules: &Rules, version: u64) -> String {
    let shared = RulesJson {
        version,
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

/// Rules from their JSON, every policy validated, and their version.
pub fn from_json(text: &[u8]) -> Result<(Rules, u64), String> {
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
    let rules = Rules {
        rules,
        default: shared.default.validate().map_err(|e| e.to_string())?,
    };
    Ok((rules, shared.version))
}

/// What a server knows of the versions of the shared rules.
#[derive(Debug, Default)]
struct Versions {
    /// The highest version this server has seen: read, or written.
    highest: u64,
    /// This server's last writes, oldest first: a change message of an
    /// earlier one of them, heard after a later one was made, is no
    /// replay (decisions 100).
    sent: std::collections::VecDeque<u64>,
    /// Writes made here and not yet in Redis: until they are, Redis may
    /// hold an older version without anyone having set it back.
    writing: usize,
    /// The last version whose refusal was logged.
    refused: Option<u64>,
}

impl Versions {
    /// True when the key may hold rules older than the highest seen for a
    /// reason of this server's own: one of its writes is on its way. (Once
    /// they are all in Redis, an older version there was set back, even
    /// one this server wrote itself.)
    fn writing(&self) -> bool {
        self.writing > 0
    }
}

/// The rules as this server shares them through Redis: what it writes,
/// in order, and what it reads back.
pub struct SharedRules {
    core: Arc<Core>,
    conn: Conn,
    /// The fleet's secret, if it has one.
    notices: Option<NoticeKey>,
    /// The versions seen and written.
    versions: Arc<std::sync::Mutex<Versions>>,
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
        let versions = Arc::new(std::sync::Mutex::new(Versions::default()));
        let written_to = versions.clone();
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
                let mut versions = written_to.lock().expect("policy versions");
                versions.writing = versions.writing.saturating_sub(1);
            }
        });
        SharedRules {
            core,
            conn: conn.clone(),
            notices,
            versions,
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
                .arg(self.sealed(POLICIES_KEY, &to_json(&self.core.rules(), 1)))
                .arg("NX");
            self.conn.query(&set).await?;
            tracing::info!("the store held no policies: this server's config is now the fleet's");
            // Another server may have written first (NX): read what won.
        }
        self.load().await;
        Ok(())
    }

    /// A change message was heard naming `version` (or none, from an older
    /// server, or after a subscription was lost): reads the shared rules
    /// again, unless the version named is older than the highest seen.
    pub async fn heard(&self, version: Option<u64>) {
        if let Some(version) = version {
            let versions = self.versions.lock().expect("policy versions");
            if version < versions.highest {
                let highest = versions.highest;
                let own = versions.sent.contains(&version);
                drop(versions);
                if !own {
                    self.conn.figures().replayed(
                        Some(Channel::Policies),
                        &format!("a policy change naming version {version}, older than version {highest} in force here; the store was not read"),
                    );
                }
                return;
            }
        }
        self.load().await;
    }

    /// Reads the shared rules and puts them in force (logged when they
    /// fail to read, or are older than the highest version seen: the
    /// running rules stay).
    pub async fn load(&self) {
        let mut get = redis::cmd("GET");
        get.arg(POLICIES_KEY);
        match self.conn.query(&get).await {
            Ok(redis::Value::BulkString(bytes)) => match self.content(&bytes) {
                None => {}
                Some(json) => match from_json(json) {
                    Ok((rules, version)) => {
                        let count = rules.rules.len();
                        if self.adopt(version, rules) {
                            tracing::info!(rules = count, version, "the fleet's policies changed in the store: keys adopt them at their next operation");
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
        let mut versions = self.versions.lock().expect("policy versions");
        let mut rules = (*self.core.rules()).clone();
        let out = change(&mut rules)?;
        let version = versions.highest + 1;
        let text = to_json(&rules, version);
        let json = self.sealed(POLICIES_KEY, &text);
        let changed = self.sealed(Channel::Policies.as_str(), &format!("changed {version}"));
        if versions.sent.len() == REMEMBERED_WRITES {
            versions.sent.pop_front();
        }
        versions.sent.push_back(version);
        versions.highest = version;
        versions.writing += 1;
        let _ = self.writer.send((json, changed));
        self.core.replace_rules(rules);
        Ok(out)
    }

    /// Puts `rules`, read back from Redis at `version`, in force unless
    /// that version is older than the highest seen (an earlier write of
    /// this server's, replaced here, or rules set back: refused), or they
    /// are what is in force already; true when they were put in force.
    fn adopt(&self, version: u64, rules: Rules) -> bool {
        let mut versions = self.versions.lock().expect("policy versions");
        if version < versions.highest {
            if versions.writing() {
                return false;
            }
            self.conn
                .figures()
                .policies_rolled_back
                .fetch_add(1, Ordering::Relaxed);
            if versions.refused != Some(version) {
                versions.refused = Some(version);
                tracing::error!(
                    version,
                    in_force = versions.highest,
                    "the fleet's policies in the store ({POLICIES_KEY}) are version {version}, older than version {} in force on this server: an old copy was set back (a restore, or someone replaying it); this server keeps its policies. To roll back on purpose, set the old policies with SetPolicy, DeletePolicy or a config reload: they are written as a new version, which every server takes",
                    versions.highest
                );
            }
            return false;
        }
        versions.highest = version;
        if *self.core.rules() == rules {
            return false;
        }
        self.core.replace_rules(rules);
        true
    }
}

/// Writes remembered.
const REMEMBERED_WRITES: usize = 64;
