//! State in Redis (`serve --store redis://…` or `redis-cluster://…`): every
//! key's fuse lives in Redis, where the `fusebox-redis` module runs one
//! domain step per `FB.*` command, atomically at the key. The fusebox
//! servers in front of it keep no keyed state, so any number of them serve
//! the same keys: one breaker, and one probe, per key for the whole fleet.
//!
//! What stays in each server: its [`Core`] (the rules, shared through
//! Redis, see [`policies`]; the events its watchers hear, which come from
//! Redis on `fusebox:events`, see `listen`), the callers waiting in a
//! queue (their answers come back on `fusebox:answers`), and its own
//! counters (decisions it answered, its busiest keys).
//!
//! Layout: `keys` (names in Redis: keys, tokens, policy ids), `link`,
//! `batch` and `conn` (the connection: links, batches, errors), `reply`
//! (the module's replies read as the wire's types), `sign` (the fleet's
//! secret), `listen` (the subscription), `fleet` (the shares held
//! fleet-wide, the store's room), `replays` (the last event taken
//! per key, to refuse one published again), [`policies`] (the shared
//! rules, versioned), and this file, the [`RedisStore`] that the server
//! holds as its [`SharedStore`].
//!
//! Time is the primary Redis server's clock (`now_ms` = `*`), except on a
//! `--manual-clock` server, which sends its own clock's time: every server
//! of such a test must be advanced alike.

mod batch;
mod charges;
mod conn;
mod fleet;
mod keys;
mod link;
mod listen;
pub mod policies;
mod replays;
mod reply;
mod sign;

use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::oneshot;

use super::error::{check_key, invalid, zero_lease};
use super::rules::Rules;
use super::shards::Hitters;
use super::store::{Cursor, Figures, Listed, RulesChange, SharedStore, Store};
/// The connection's figures and the channels they count, kept by the store
/// interface (re-exported here, where /metrics finds them).
pub use super::store::{StoreFigures, NOTICE_CHANNELS};
use super::tickets::random_ticket;
use super::{AcquireArgs, AcquireReply, CompleteReply, Core, EngineError, KeyReading, Totals};
use crate::domain::wire::{Answer, Channel, ReplyForm};
use crate::domain::{Decision, Millis, OperatorAction, Outcome, Phase, Policy, TicketId};
use conn::Conn;
pub use conn::{
    read_password, redacted, Named, ProbeReplicas, Secret, StoreTls, StoreUrl, PROBE_WAIT,
};
use keys::hex_id;
pub use keys::{policy_id, redis_key, ticket_and_key, ticket_id, token_with_key, KEY_PREFIX};
use listen::Heard;
use policies::SharedRules;
use reply::{census_of, decision_of, reading_of, Census};
pub use sign::NoticeKey;

/// The state encoding of the module this server is built with: a module
/// that writes an older one does not know what this server sends
/// (`FB.ACQUIRE ... CALLER` since encoding 6, Q1) or does not settle lease
/// ends at one instant in grant order (encoding 8, T2), and is refused at
/// start, naming the node and both encodings.
const MODULE_ENCODING: u64 = 8;

/// The most keys a `--manual-clock` server remembers to settle when its
/// clock moves (tests only; the module's timer settles on Redis's clock).
const KNOWN_KEYS: usize = 100_000;

/// Policies whose id is kept (the rules in force, and the default).
const POLICY_CACHE: usize = 256;

/// How long a census of the primaries serves `/metrics` and the dashboard
/// before it is read again.
const CENSUS_FOR: Duration = Duration::from_secs(1);

/// How often this server's busiest-keys counts are halved.
const BUSIEST_DECAY: Duration = Duration::from_secs(10);

/// A waiting caller's answer, as the module published it.
type Waiter = oneshot::Sender<Answer>;

/// A policy as sent to the module: its JSON, and `@` and its id.
struct Sent {
    json: Arc<str>,
    by_id: Arc<str>,
}

/// This server's counters of what it answered: decisions and reasons by
/// kind, transitions heard, cap refusals.
#[derive(Debug, Default)]
struct Counted {
    decisions: [AtomicU64; 6],
    reasons: [AtomicU64; crate::domain::Reason::COUNT],
    transitions: AtomicU64,
    cap_refusals: [AtomicU64; 3],
}

impl Counted {
    fn count(&self, decision: &Decision) {
        let mut one = Totals::default();
        one.count(decision);
        for (n, add) in self.decisions.iter().zip(one.decisions) {
            if add > 0 {
                n.fetch_add(add, Ordering::Relaxed);
            }
        }
        for (n, add) in self.reasons.iter().zip(one.reasons) {
            if add > 0 {
                n.fetch_add(add, Ordering::Relaxed);
            }
        }
    }
}

/// How a server uses its store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Where it is.
    pub url: StoreUrl,
    /// How many replicas must have a probe before it is handed out.
    pub probe_replicas: ProbeReplicas,
    /// How long a probe waits for them before it is given back.
    pub probe_wait: Duration,
    /// TLS settings, used when `url` says TLS (`rediss://`).
    pub tls: StoreTls,
    /// The Redis ACL user to log in as (else the URL's, else `default`).
    pub user: Option<String>,
    /// Its password (else the URL's, else none).
    pub password: Option<Secret>,
    /// The fleet's secret: what the store publishes is verified with it,
    /// what this server writes is signed with it.
    pub notices: Option<NoticeKey>,
}

impl StoreOptions {
    /// The store at `url`, with the defaults (and the user and password
    /// the URL names).
    pub fn at(url: StoreUrl) -> StoreOptions {
        StoreOptions {
            user: url.user.clone(),
            password: url.password.clone(),
            url,
            probe_replicas: ProbeReplicas::Auto,
            probe_wait: PROBE_WAIT,
            tls: StoreTls::default(),
            notices: None,
        }
    }
}

/// The fusebox state in Redis, as one server sees it.
pub struct RedisStore {
    core: Arc<Core>,
    conn: Conn,
    url: StoreUrl,
    probe_replicas: ProbeReplicas,
    probe_wait: Duration,
    /// The fleet's secret for notices, if it has one.
    notices: Option<NoticeKey>,
    /// The rules, shared through Redis.
    shared_rules: SharedRules,
    /// Callers of this server waiting in a key's queue, by waiter id, with
    /// the Redis key they wait on.
    waiters: DashMap<TicketId, (String, Waiter)>,
    /// Keys this server touched, for a manual clock to settle.
    known: Mutex<BTreeSet<String>>,
    /// Each policy in force (held, so that its pointer stays its own) as
    /// it is sent.
    policies: Mutex<Vec<(Arc<Policy>, Arc<Sent>)>>,
    /// What this server answered.
    counted: Counted,
    /// This server's busiest keys.
    hitters: Mutex<Hitters>,
    hash: std::collections::hash_map::RandomState,
    /// The last census of the primaries, and when it was read.
    census: tokio::sync::Mutex<Option<(Instant, Census)>>,
    advancing: tokio::sync::Mutex<()>,
    /// Its part in the fleet's shares (decisions 148).
    fleet: fleet::Fleet,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .finish()
    }
}

impl RedisStore {
    /// Keeps every key's state in the Redis store at `url` for a server
    /// around `core`: connects, checks the module, subscribes to what it
    /// publishes, and adopts the fleet's policies (or shares `rules`, this
    /// server's, when Redis holds none yet).
    pub async fn connect(
        core: Arc<Core>,
        rules: Rules,
        options: &StoreOptions,
    ) -> Result<Arc<RedisStore>, EngineError> {
        let url = &options.url;
        let figures = Arc::new(StoreFigures::default());
        let reach = conn::Reach::new(
            url,
            &options.tls,
            options.user.clone(),
            options.password.clone(),
        );
        let conn = Conn::connect(reach, figures).await?;
        core.replace_rules(rules);
        core.use_unix_times();
        let shared_rules = SharedRules::new(core.clone(), &conn, options.notices.clone());
        let store = Arc::new(RedisStore {
            core,
            conn,
            url: url.clone(),
            probe_replicas: options.probe_replicas,
            probe_wait: options.probe_wait,
            notices: options.notices.clone(),
            shared_rules,
            waiters: DashMap::new(),
            known: Mutex::new(BTreeSet::new()),
            policies: Mutex::new(Vec::new()),
            counted: Counted::default(),
            hitters: Mutex::new(Hitters::default()),
            hash: std::collections::hash_map::RandomState::new(),
            census: tokio::sync::Mutex::new(None),
            advancing: tokio::sync::Mutex::new(()),
            fleet: fleet::Fleet::new(),
        });
        store.check_module().await?;
        let (ready, subscribed) = oneshot::channel();
        let subscriber = listen::Subscriber {
            conn: store.conn.clone(),
            nodes: store.url.nodes.clone(),
            notices: store.notices.clone(),
            clock: {
                let core = store.core.clone();
                Arc::new(move || time_of(&core))
            },
        };
        let hearer = store.clone();
        tokio::spawn(listen::listen(
            subscriber,
            store.core.stopped(),
            ready,
            move |heard| {
                let store = hearer.clone();
                async move { store.hear(heard).await }
            },
        ));
        if tokio::time::timeout(Duration::from_secs(5), subscribed)
            .await
            .is_err()
        {
            return Err(EngineError::StoreUnavailable(format!(
                "cannot subscribe to the answers and events of {url} within 5 s"
            )));
        }
        store.shared_rules.start().await?;
        Ok(store)
    }

    /// Acts on what the subscription heard: an answer goes to its waiter,
    /// an event to this server's watchers, a policy change is read.
    async fn hear(&self, heard: Heard) {
        match heard {
            Heard::Answer {
                key,
                waiter,
                answer,
            } => self.deliver(&key, waiter, answer),
            Heard::Event(ordered) => {
                let event = ordered.event;
                tracing::info!(key = %event.key, from = %event.from, to = %event.to, at_ms = event.at, "breaker {} -> {}: {}", event.from, event.to, event.cause);
                self.counted.transitions.fetch_add(1, Ordering::Relaxed);
                self.core.publish(|| vec![event]);
            }
            Heard::Policies(named) => self.shared_rules.heard(named).await,
        }
    }

    /// What the store shares with the server around it.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The store's address, as given.
    pub fn url(&self) -> &StoreUrl {
        &self.url
    }

    /// Checks that every primary runs the module of this release (its state
    /// encoding at least [`MODULE_ENCODING`]), and signs its notices
    /// with this server's secret (or that neither signs).
    async fn check_module(&self) -> Result<(), EngineError> {
        let cmd = redis::cmd("FB.VERSION");
        let mine = self.notices.as_ref().map(NoticeKey::fingerprint);
        for node in self.conn.primaries().await? {
            let version = match self.conn.on_node(&node, &cmd).await {
                Ok(version) => version,
                Err(EngineError::Invalid { problem, .. }) => return Err(EngineError::StoreUnavailable(
                    format!("{} (node {node}) answers FB.VERSION with {problem}; load the fusebox module there (redis-server --loadmodule .../libfusebox_redis.so)", self.url),
                )),
                Err(e) => return Err(e),
            };
            let version = reply::module_version(&version).ok();
            let encoding = version.as_ref().map(|v| v.encoding);
            if encoding.is_none_or(|n| n < MODULE_ENCODING) {
                return Err(EngineError::StoreUnavailable(format!(
                    "the fusebox module on {node} is older than this server (it writes state encoding {}, this server needs {MODULE_ENCODING} and the replies that come with it): load this release's libfusebox_redis.so on every node",
                    encoding.map_or_else(|| "unknown".to_owned(), |n| n.to_string())
                )));
            }
            let theirs = version.and_then(|v| v.signing);
            let refuse = |what: String| Err(EngineError::StoreUnavailable(what));
            match (theirs.as_deref(), mine.as_deref()) {
                (None, None) => {}
                (Some(theirs), Some(mine)) if theirs == mine => {}
                (Some(theirs), Some(mine)) => return refuse(format!(
                    "the fusebox module on {node} signs its notices with another secret (fingerprint {theirs}) than --store-secret-file (fingerprint {mine}): give every fusebox server the file the module loads with secret-file"
                )),
                (Some(theirs), None) => return refuse(format!(
                    "the fusebox module on {node} signs its notices (fingerprint {theirs}) but this server has no secret to verify them: pass --store-secret-file with the file the module loads with secret-file"
                )),
                (None, Some(_)) => return refuse(format!(
                    "the fusebox module on {node} does not sign its notices (it was loaded without secret-file) but this server has --store-secret-file: load the module with `--loadmodule libfusebox_redis.so secret-file FILE` (the same file) on every node, or start this server without --store-secret-file"
                )),
            }
        }
        if mine.is_none() {
            tracing::warn!(
                "the store's notices are not signed (no --store-secret-file, and the module has no secret-file): anyone who can reach Redis can forge answers to waiting callers, transitions in watchers' streams and the fleet's policies; give the module and every server the same secret file"
            );
        }
        Ok(())
    }

    /// The time argument: `*` (the primary Redis server's clock), or the
    /// manual clock's time.
    fn now_arg(&self) -> String {
        match self.core.manual() {
            Some(clock) => super::Clock::now(clock.as_ref()).to_string(),
            None => "*".to_owned(),
        }
    }

    /// The policy `key` runs under as it is sent: made once per policy in
    /// force, not once per call.
    fn sent_policy(&self, key: &str) -> Result<Arc<Sent>, EngineError> {
        let policy = self.core.policy_for(key);
        let mut cache = self.policies.lock().expect("policy cache");
        if let Some((_, sent)) = cache.iter().find(|(p, _)| Arc::ptr_eq(p, &policy)) {
            return Ok(sent.clone());
        }
        let json = serde_json::to_string(&policy.spec())
            .map_err(|e| EngineError::Internal(format!("the policy as JSON: {e}")))?;
        let sent = Arc::new(Sent {
            by_id: format!("@{}", policy_id(&json)).into(),
            json: json.into(),
        });
        // Policies of rules no longer in force go when the cache fills.
        if cache.len() >= POLICY_CACHE {
            cache.clear();
        }
        cache.push((policy, sent.clone()));
        Ok(sent)
    }

    /// Runs `make(policy)` with the policy named by its id, and again with
    /// its JSON when the node does not know the id yet (`NOPOLICY`).
    async fn with_policy(
        &self,
        key: &str,
        make: impl Fn(&str) -> redis::Cmd,
    ) -> Result<redis::Value, EngineError> {
        let sent = self.sent_policy(key)?;
        match self
            .conn
            .query_or_unknown_policy(&make(&sent.by_id))
            .await?
        {
            Some(value) => Ok(value),
            None => self.conn.query(&make(&sent.json)).await,
        }
    }

    fn remember(&self, key: &str) {
        if !self.core.has_manual_clock() {
            return;
        }
        let mut known = self.known.lock().expect("known keys");
        if known.len() < KNOWN_KEYS {
            known.insert(key.to_owned());
        }
    }

    fn bump(&self, key: &str) {
        let hash = self.hash.hash_one(key);
        self.hitters.lock().expect("hitters").bump_named(hash, key);
    }

    /// Answers an acquire in Redis, waiting for a queued request's answer
    /// on the answers channel.
    pub async fn acquire(&self, args: AcquireArgs) -> Result<AcquireReply, EngineError> {
        check_key(&args.key)?;
        if args.lease == Some(0) {
            return Err(zero_lease());
        }
        if self.core.is_shutting_down() {
            return Err(EngineError::ShuttingDown);
        }
        let id = random_ticket()?;
        let rk = redis_key(&args.key);
        let now = self.now_arg();
        let hex = hex_id(id);
        let make = |policy: &str| {
            // Sized at once: the arguments are a few dozen bytes past the
            // key and the policy, and a stream builds thousands a second.
            let mut cmd = redis::Cmd::with_capacity(13, rk.len() + policy.len() + 108);
            cmd.arg("FB.ACQUIRE")
                .arg(&rk)
                .arg(&now)
                .arg(&hex)
                .arg(policy)
                .arg("PERMITS")
                .arg(args.permits);
            if let Some(lease) = args.lease {
                cmd.arg("LEASE").arg(lease);
            }
            if args.max_wait > 0 && args.permits > 0 {
                cmd.arg("MAXWAIT").arg(args.max_wait);
            }
            if args.is_retry() {
                cmd.arg("ATTEMPT").arg(args.attempt);
            }
            if !args.caller.is_empty() && args.permits > 0 {
                cmd.arg("CALLER").arg(&args.caller);
            }
            // One string to parse, not an array of seven (decisions 89).
            cmd.arg("REPLY").arg(ReplyForm::Packed.as_str());
            cmd
        };
        let mut waiting = None;
        if args.max_wait > 0 && args.permits > 0 {
            // K3: this server's waiters are capped; keys and tickets are
            // bounded by Redis's memory (decisions item 69).
            let limit = self.core.limits().max_waiters;
            if self.waiters.len() as u64 >= limit {
                self.counted.cap_refusals[2].fetch_add(1, Ordering::Relaxed);
                return Err(EngineError::Exhausted {
                    what: "waiters",
                    cap: "max_waiters",
                    limit,
                });
            }
            // Registered before the request goes: the answer may be
            // published before the reply to this command arrives.
            let (tx, rx) = oneshot::channel();
            self.waiters.insert(id, (rk.clone(), tx));
            waiting = Some(WaitGuard {
                shared: self,
                key: args.key.clone(),
                id,
                answered: false,
                rx: Some(rx),
            });
        }
        if args.permits > 0 {
            self.remember(&args.key);
            self.bump(&args.key);
        }
        // On an error the guard, dropped, withdraws the waiter: the store
        // may have queued it before the reply was lost.
        let value = self.with_policy(&args.key, make).await?;
        let answer = decision_of(&value)?;
        if let Decision::Probe(grant) = answer.decision {
            self.confirm_probe(&rk, grant.ticket).await?;
        }
        let reply = match (answer.decision, waiting) {
            (Decision::Queued, Some(mut guard)) => guard.wait(args.max_wait).await?,
            (_, Some(mut guard)) => {
                guard.answered = true;
                self.waiters.remove(&id);
                answer
            }
            (_, None) => answer,
        };
        if args.permits > 0 {
            self.counted.count(&reply.decision);
        }
        Ok(self.reply_of(&args.key, reply))
    }

    /// Hands out a probe only once the replicas that could take over the
    /// key's slot have it (B2 across a failover: Redis replicates
    /// asynchronously, and a probe a promoted replica never heard of would
    /// let a second one out). A probe they do not confirm within
    /// the probe wait ([`PROBE_WAIT`] by default) is given back (completed as ignored, which frees
    /// the slot) and the caller is told to ask again.
    async fn confirm_probe(&self, rk: &str, ticket: TicketId) -> Result<(), EngineError> {
        let wanted = self.conn.probe_replicas(rk, self.probe_replicas).await?;
        if wanted == 0 {
            return Ok(());
        }
        let confirmed = self.conn.confirm(rk, wanted, self.probe_wait).await;
        if confirmed.as_ref().is_ok_and(|&n| n >= wanted) {
            return Ok(());
        }
        let mut give_back = redis::cmd("FB.COMPLETE");
        give_back
            .arg(rk)
            .arg(self.now_arg())
            .arg(hex_id(ticket))
            .arg("ignored");
        // Past the breaker: a failure of the confirmation link may have
        // opened it a moment ago, and a probe not given back holds its
        // slot until its lease ends.
        if let Err(e) = self.conn.query_past_the_breaker(&give_back).await {
            tracing::warn!(key = rk, "an unconfirmed probe could not be given back: {e}; its slot ends with its probe lease");
        }
        self.conn
            .figures()
            .unconfirmed_probes
            .fetch_add(1, Ordering::Relaxed);
        let heard = match confirmed {
            Ok(n) => format!("{n} did"),
            Err(e) => format!("asking failed: {e}"),
        };
        tracing::warn!(
            key = rk,
            "a probe was not confirmed by {wanted} replica(s) within {:?} ({heard}); given back",
            self.probe_wait
        );
        Err(EngineError::StoreUnavailable(format!(
            "the probe was not confirmed by {wanted} replica(s) of the key's primary within {} ms ({heard}); it was given back, so that a failover cannot let a second probe out: ask again",
            self.probe_wait.as_millis()
        )))
    }

    fn reply_of(&self, key: &str, answer: Answer) -> AcquireReply {
        let grant = answer.decision.grant();
        AcquireReply {
            decision: answer.decision,
            ticket: grant.map(|g| token_with_key(g.ticket, key)),
            lease_left: grant.map(|g| g.lease_end.saturating_sub(answer.now)),
            phase: answer.phase,
        }
    }

    /// Records a ticket's outcome (B3, C5, L4) and the permits the call
    /// really used (U1).
    pub async fn complete(
        &self,
        token: &str,
        outcome: Outcome,
        cost: Option<u32>,
    ) -> Result<CompleteReply, EngineError> {
        let (id, key) = ticket_and_key(token)?;
        let rk = redis_key(&key);
        let mut cmd = redis::Cmd::with_capacity(9, rk.len() + 106);
        cmd.arg("FB.COMPLETE")
            .arg(rk)
            .arg(self.now_arg())
            .arg(hex_id(id))
            .arg(outcome.as_str());
        if let Some(cost) = cost {
            cmd.arg("COST").arg(cost);
        }
        cmd.arg("REPLY").arg(ReplyForm::Packed.as_str());
        let value = self.conn.query(&cmd).await?;
        reply::completed(&value)
    }

    /// Extends a live ticket's lease; returns the time left (L2).
    pub async fn renew(&self, token: &str, lease: Option<Millis>) -> Result<Millis, EngineError> {
        if lease == Some(0) {
            return Err(zero_lease());
        }
        let (id, key) = ticket_and_key(token)?;
        let mut cmd = redis::cmd("FB.RENEW");
        cmd.arg(redis_key(&key)).arg(self.now_arg()).arg(hex_id(id));
        if let Some(lease) = lease {
            cmd.arg("LEASE").arg(lease);
        }
        let value = self.conn.query(&cmd).await?;
        reply::millis(&value, "FB.RENEW")
    }

    /// The time of a read that found nothing: the store's clock, or the
    /// manual one.
    fn read_time(&self) -> Millis {
        time_of(&self.core)
    }

    /// Reads a key (B6); a key never used reads as a fresh one would (K2).
    pub async fn get(&self, key: &str) -> Result<KeyReading, EngineError> {
        self.read(key).await.map(|(reading, _)| reading)
    }

    /// [`RedisStore::get`], and whether Redis holds the key.
    pub async fn read(&self, key: &str) -> Result<(KeyReading, bool), EngineError> {
        check_key(key)?;
        let mut cmd = redis::cmd("FB.GET");
        cmd.arg(redis_key(key)).arg(self.now_arg());
        let value = self.conn.query(&cmd).await?;
        Ok(match reading_of(key, &value)? {
            Some(reading) => (reading, true),
            None => {
                let now = self.read_time();
                let reading = KeyReading {
                    key: key.to_owned(),
                    view: crate::domain::Fuse::new(self.core.policy_for(key), now).view(now),
                    now,
                };
                (reading, false)
            }
        })
    }

    /// Takes an operator's `action` on a key (B5), recording who and why
    /// in the event; the reply waits for a replica to have it (`WAIT`).
    pub async fn operate(
        &self,
        key: &str,
        reason: &str,
        who: &str,
        action: OperatorAction,
    ) -> Result<KeyReading, EngineError> {
        let why = super::embedded::operator_action(key, reason, who, action)?;
        let rk = redis_key(key);
        let now = self.now_arg();
        let make = |policy: &str| {
            let mut cmd = match action {
                OperatorAction::Isolate => redis::cmd("FB.ISOLATE"),
                OperatorAction::Close => redis::cmd("FB.CLOSE"),
            };
            cmd.arg(&rk).arg(&now);
            if action == OperatorAction::Isolate {
                cmd.arg("POLICY").arg(policy);
            }
            cmd.arg("BY")
                .arg(truncate(who, 256))
                .arg("WHY")
                .arg(truncate(why, 256));
            cmd
        };
        self.remember(key);
        let value = self.with_policy(key, make).await?;
        self.conn.wait_for_replica(&rk).await;
        match reading_of(key, &value)? {
            Some(reading) => Ok(reading),
            None => self.get(key).await,
        }
    }

    /// A page of keys from the primaries, one bounded `FB.LIST` step on
    /// each primary the page reaches, in the order of the slots they serve
    /// (A8 with a store: the cost of a page is bounded by its size, not by
    /// the keys in Redis). Each page is in key order; pages follow each
    /// primary's scan order.
    pub async fn list_page(
        &self,
        prefix: &str,
        phases: &[Phase],
        from: &Cursor,
        limit: usize,
    ) -> Result<Listed, EngineError> {
        let primaries = self.conn.primaries().await?;
        let (mut node, mut cursor, mut inside) = match from {
            Cursor::Start => (0, 0, None),
            // The same primary goes on from its cursor; another one (a
            // failover, a restart on a new address) scans from the start,
            // so that a key may repeat but none is skipped.
            Cursor::Scan {
                node,
                at,
                cursor,
                after,
            } => match primaries.get(*node) {
                Some(addr) if address_mark(addr) == *at => (*node, *cursor, after.clone()),
                _ => (*node, 0, None),
            },
            Cursor::After(_) => {
                return Err(invalid(
                    "page_token",
                    "is a token of a server without --store; start the listing again",
                ))
            }
        };
        let pattern = format!("{}*", conn::glob_escape(&format!("{KEY_PREFIX}{prefix}")));
        let phase_names: Vec<&str> = phases.iter().map(|p| p.as_str()).collect();
        let mut readings = Vec::new();
        let now = self.now_arg();
        let mut next = None;
        while node < primaries.len() && readings.len() < limit {
            let mut cmd = redis::cmd("FB.LIST");
            cmd.arg(cursor)
                .arg(&now)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(limit - readings.len());
            if !phase_names.is_empty() {
                cmd.arg("PHASES").arg(phase_names.join(","));
            }
            if let Some(key) = inside.take() {
                cmd.arg("AFTER").arg(format!("{KEY_PREFIX}{key}"));
            }
            let step = self.conn.list_step(&primaries[node], &cmd).await?;
            for (name, view) in step.found {
                let Some(key) = name.strip_prefix(KEY_PREFIX) else {
                    continue;
                };
                if let Some(reading) = reading_of(key, &view)? {
                    readings.push(reading);
                }
            }
            let after = step
                .inside
                .and_then(|name| name.strip_prefix(KEY_PREFIX).map(str::to_owned));
            if step.cursor == 0 && after.is_none() {
                node += 1;
                cursor = 0;
            } else {
                cursor = step.cursor;
                next = Some(Cursor::Scan {
                    node,
                    at: address_mark(&primaries[node]),
                    cursor,
                    after,
                });
                break;
            }
        }
        if next.is_none() && node < primaries.len() {
            next = Some(Cursor::Scan {
                node,
                at: address_mark(&primaries[node]),
                cursor,
                after: None,
            });
        }
        readings.sort_by(|a, b| a.key.cmp(&b.key));
        readings.dedup_by(|a, b| a.key == b.key);
        Ok(Listed { readings, next })
    }

    /// The census of every primary (cached for [`CENSUS_FOR`]).
    async fn census(&self) -> Result<Census, EngineError> {
        let mut cached = self.census.lock().await;
        if let Some((at, census)) = cached.as_ref() {
            if at.elapsed() < CENSUS_FOR {
                return Ok(census.clone());
            }
        }
        let census = self.read_census("", 0).await?;
        *cached = Some((Instant::now(), census.clone()));
        Ok(census)
    }

    async fn read_census(&self, prefix: &str, keys: usize) -> Result<Census, EngineError> {
        let mut sum = Census::default();
        let now = self.now_arg();
        for node in self.conn.primaries().await? {
            let mut cmd = redis::cmd("FB.CENSUS");
            cmd.arg(&now)
                .arg("MATCH")
                .arg(format!("{KEY_PREFIX}{prefix}"))
                .arg("COUNT")
                .arg(keys.max(1));
            let value = self.conn.on_node(&node, &cmd).await?;
            sum.add(census_of(&value, keys > 0)?);
        }
        Ok(sum)
    }

    /// Up to `limit` keys that are not CLOSED and start with `prefix`, in
    /// key order, from every primary's registry (no scan), and whether
    /// more are.
    pub async fn not_closed(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<(Vec<KeyReading>, bool), EngineError> {
        let census = self.read_census(prefix, limit + 1).await?;
        let mut readings = census.not_closed;
        readings.sort_by(|a, b| a.key.cmp(&b.key));
        let more = readings.len() > limit;
        readings.truncate(limit);
        Ok((readings, more))
    }

    /// This server's busiest keys lately, busiest first, read from Redis.
    pub async fn busiest(&self, n: usize) -> Vec<KeyReading> {
        let mut held: Vec<(u32, Arc<str>)> = self
            .hitters
            .lock()
            .expect("hitters")
            .held()
            .map(|(name, c)| (c, name.clone()))
            .collect();
        held.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let mut out = Vec::new();
        for (_, key) in held.into_iter().take(n) {
            if let Ok(reading) = self.get(&key).await {
                out.push(reading);
            }
        }
        out
    }

    /// Until the server stops: halves the busiest-keys counts now and then,
    /// so that busiest means busiest lately, and exchanges the shares'
    /// holdings with the fleet (the module settles keys on Redis's clock,
    /// so nothing else here runs on time).
    pub async fn run_timer(&self) {
        let stopped = self.core.stopped();
        tokio::pin!(stopped);
        let mut every = tokio::time::interval(BUSIEST_DECAY);
        every.tick().await;
        let mut exchange = tokio::time::interval(fleet::EXCHANGE_EVERY);
        exchange.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stopped => return,
                _ = every.tick() => self.hitters.lock().expect("hitters").decay(),
                _ = exchange.tick() => self.fleet.exchange_shares(&self.conn, &self.core).await,
            }
        }
    }

    /// This server's counters, with the fleet's keys, phases, tickets and
    /// waiters from every primary (zeros while Redis cannot be read).
    pub async fn figures(&self) -> Figures {
        let mut totals = Totals::default();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (t, c) in totals.decisions.iter_mut().zip(&self.counted.decisions) {
            *t = load(c);
        }
        for (t, c) in totals.reasons.iter_mut().zip(&self.counted.reasons) {
            *t = load(c);
        }
        for (t, c) in totals
            .cap_refusals
            .iter_mut()
            .zip(&self.counted.cap_refusals)
        {
            *t = load(c);
        }
        totals.transitions = load(&self.counted.transitions);
        match self.census().await {
            Ok(c) => {
                totals.keys = c.keys;
                totals.by_phase = c.by_phase;
                totals.tickets = c.tickets;
                totals.waiters = c.waiters;
            }
            Err(e) => tracing::debug!("the store's census could not be read: {e}"),
        }
        Figures {
            totals,
            forgotten: None,
            fleet_wide: true,
        }
    }

    /// Applies `change` to the rules, puts them in force here, and shares
    /// them through Redis; nothing changes when `change` refuses.
    pub fn change_rules<R>(
        &self,
        change: impl FnOnce(&mut Rules) -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        self.shared_rules.change(change)
    }

    /// Moves the manual clock and settles every key this server touched at
    /// the new time (leases that ended, waits that timed out), so that a
    /// test that moves every server's clock sees what is due happen.
    pub async fn advance_clock(&self, by: Millis) -> Option<Millis> {
        let manual = self.core.manual()?;
        let _one_at_a_time = self.advancing.lock().await;
        let now = manual.advance(by);
        if let Err(e) = self.settle_known(now).await {
            tracing::warn!("the store could not settle what is due at {now} ms: {e}");
        }
        Some(now)
    }

    async fn settle_known(&self, now: Millis) -> Result<(), EngineError> {
        let keys: Vec<String> = self
            .known
            .lock()
            .expect("known keys")
            .iter()
            .cloned()
            .collect();
        for key in keys {
            let mut cmd = redis::cmd("FB.SETTLE");
            cmd.arg(redis_key(&key)).arg(now);
            self.conn.query(&cmd).await?;
        }
        Ok(())
    }

    /// Hands a published answer to this server's waiter, if it has it:
    /// one for another key than the waiter's, or granting a ticket that is
    /// not the waiter's, is dropped (counted, logged) and the waiter goes
    /// on waiting.
    fn deliver(&self, key: &str, waiter: TicketId, answer: Answer) {
        let fits = |(wanted, _): &(String, Waiter)| {
            wanted == key && answer.decision.grant().is_none_or(|g| g.ticket == waiter)
        };
        if let Some((_, (_, tx))) = self.waiters.remove_if(&waiter, |_, w| fits(w)) {
            let _gone = tx.send(answer);
        } else if self.waiters.contains_key(&waiter) {
            self.conn.figures().dropped(
                Some(Channel::Answers),
                "an answer for this server's waiter named another key or ticket",
            );
        }
    }

    /// Stops taking requests; every waiter of this server is answered
    /// UNAVAILABLE.
    pub fn shutdown(&self) {
        self.core.begin_shutdown();
        self.waiters.clear();
    }
}

fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// This server's time as the store's commands take it: the manual clock's,
/// or the wall clock's.
fn time_of(core: &Core) -> Millis {
    match core.manual() {
        Some(clock) => super::Clock::now(clock.as_ref()),
        None => unix_now(),
    }
}

/// The wall clock in unix milliseconds: the time of a key read when Redis
/// holds nothing for it.
fn unix_now() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

/// How long a waiter the store no longer knows waits for the answer that
/// is most likely on its way (the store's settler timed it out, or served
/// it, at the moment this server asked) before it is told its place was
/// lost.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// A caller waiting in a key's queue. Dropped before its answer (the
/// caller went away, P6), it withdraws the waiter in Redis; a ticket the
/// waiter got meanwhile is given back.
struct WaitGuard<'a> {
    shared: &'a RedisStore,
    key: String,
    id: TicketId,
    answered: bool,
    rx: Option<oneshot::Receiver<Answer>>,
}

impl WaitGuard<'_> {
    /// Waits for the answer: published on the answers channel, or, once
    /// `max_wait` has passed on this server's clock, asked for with
    /// `FB.SETTLE … WAITER` (which times the waiter out on the store's
    /// clock, or finds the answer a lost message carried).
    async fn wait(&mut self, max_wait: Millis) -> Result<Answer, EngineError> {
        let mut rx = self.rx.take().expect("waits once");
        let stopping = self.shared.core.stopped();
        tokio::pin!(stopping);
        let manual = self.shared.core.has_manual_clock();
        let mut deadline = tokio::time::Instant::now() + Duration::from_millis(max_wait);
        loop {
            tokio::select! {
                answer = &mut rx => {
                    // A dropped sender: shutting down; the guard withdraws
                    // the waiter as it goes.
                    let answer = answer.map_err(|_| EngineError::ShuttingDown)?;
                    self.answered = true;
                    return Ok(answer);
                }
                () = &mut stopping => {
                    return Err(EngineError::ShuttingDown);
                }
                () = tokio::time::sleep_until(deadline), if !manual => {
                    match self.ask().await? {
                        Some(answer) if answer.decision != Decision::Queued => {
                            self.answered = true;
                            self.shared.waiters.remove(&self.id);
                            return Ok(answer);
                        }
                        // The store's clock is behind this one, or the answer
                        // is on its way: look again shortly.
                        Some(_) => deadline = tokio::time::Instant::now() + Duration::from_millis(5),
                        // Not known any more: the store's settler most
                        // likely timed it out at the same moment, and its
                        // answer is on the channel. Give it a moment.
                        None => {
                            if let Ok(Ok(answer)) = tokio::time::timeout(ANSWER_GRACE, &mut rx).await {
                                self.answered = true;
                                return Ok(answer);
                            }
                            self.answered = true;
                            self.shared.waiters.remove(&self.id);
                            return Err(EngineError::StoreUnavailable(
                                "the store lost this request's place in the queue (a failover?)".to_owned(),
                            ));
                        }
                    }
                }
            }
        }
    }

    async fn ask(&self) -> Result<Option<Answer>, EngineError> {
        let mut cmd = redis::cmd("FB.SETTLE");
        cmd.arg(redis_key(&self.key))
            .arg(self.shared.now_arg())
            .arg("WAITER")
            .arg(hex_id(self.id));
        let value = self.shared.conn.query(&cmd).await?;
        reply::settled_waiter(&value)
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.shared.waiters.remove(&self.id);
        let conn = self.shared.conn.clone();
        let mut cmd = redis::cmd("FB.WITHDRAW");
        cmd.arg(redis_key(&self.key))
            .arg(self.shared.now_arg())
            .arg(hex_id(self.id));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = conn.query(&cmd).await {
                    tracing::warn!("a caller that stopped waiting could not be withdrawn from its queue: {e}; its place (or a ticket it was given) goes when the wait (or lease) ends");
                }
            });
        }
    }
}

/// A short mark of a primary's address, for a listing's cursor (FNV-1a).
fn address_mark(addr: &str) -> u32 {
    addr.bytes().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl From<Arc<RedisStore>> for Store {
    fn from(store: Arc<RedisStore>) -> Store {
        Store::Redis(store)
    }
}

impl SharedStore for RedisStore {
    fn charge_all<'a>(
        &'a self,
        items: &'a [super::ChargeItem],
    ) -> BoxFuture<'a, Result<super::ChargeReply, EngineError>> {
        RedisStore::charge_all(self, items).boxed()
    }

    fn core(&self) -> &Arc<Core> {
        &self.core
    }

    fn acquire(&self, args: AcquireArgs) -> BoxFuture<'_, Result<AcquireReply, EngineError>> {
        RedisStore::acquire(self, args).boxed()
    }

    fn complete<'a>(
        &'a self,
        token: &'a str,
        outcome: Outcome,
        cost: Option<u32>,
    ) -> BoxFuture<'a, Result<CompleteReply, EngineError>> {
        RedisStore::complete(self, token, outcome, cost).boxed()
    }

    fn renew<'a>(
        &'a self,
        token: &'a str,
        lease: Option<Millis>,
    ) -> BoxFuture<'a, Result<Millis, EngineError>> {
        RedisStore::renew(self, token, lease).boxed()
    }

    fn ticket_id(&self, token: &str) -> Option<TicketId> {
        ticket_id(token)
    }

    fn ticket_key(&self, token: &str) -> Result<Arc<str>, EngineError> {
        ticket_and_key(token).map(|(_, key)| Arc::from(key))
    }

    fn read<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(KeyReading, bool), EngineError>> {
        RedisStore::read(self, key).boxed()
    }

    fn operate<'a>(
        &'a self,
        key: &'a str,
        reason: &'a str,
        who: &'a str,
        action: OperatorAction,
    ) -> BoxFuture<'a, Result<KeyReading, EngineError>> {
        RedisStore::operate(self, key, reason, who, action).boxed()
    }

    fn list_page<'a>(
        &'a self,
        prefix: &'a str,
        phases: &'a [Phase],
        from: &'a Cursor,
        limit: usize,
    ) -> BoxFuture<'a, Result<Listed, EngineError>> {
        RedisStore::list_page(self, prefix, phases, from, limit).boxed()
    }

    fn not_closed<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<(Vec<KeyReading>, bool), EngineError>> {
        RedisStore::not_closed(self, prefix, limit).boxed()
    }

    fn busiest(&self, n: usize) -> BoxFuture<'_, Vec<KeyReading>> {
        RedisStore::busiest(self, n).boxed()
    }

    fn figures(&self) -> BoxFuture<'_, Figures> {
        RedisStore::figures(self).boxed()
    }

    fn connection_figures(&self) -> &StoreFigures {
        self.conn.figures()
    }

    fn change_rules(&self, change: RulesChange<'_>) -> Result<(), EngineError> {
        RedisStore::change_rules(self, change)
    }

    fn run_timer(&self) -> BoxFuture<'_, ()> {
        RedisStore::run_timer(self).boxed()
    }

    fn advance_clock(&self, by: Millis) -> BoxFuture<'_, Option<Millis>> {
        RedisStore::advance_clock(self, by).boxed()
    }

    fn shutdown(&self) {
        RedisStore::shutdown(self);
    }
}
