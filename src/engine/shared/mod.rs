//! State in Redis (`serve --store redis://…` or `redis-cluster://…`): every
//! key's fuse lives in Redis, where the `fusebox-redis` module runs one
//! domain step per `FB.*` command, atomically at the key. The fusebox
//! servers in front of it keep no keyed state, so any number of them serve
//! the same keys: one breaker, and one probe, per key for the whole fleet.
//!
//! What stays in each server: the rules (shared through Redis, see
//! [`policies`]), the callers waiting in a queue (their answers come back
//! on the `fusebox:answers` channel, see [`listen`]), and the watchers
//! (phase changes come back on `fusebox:events`).
//!
//! Time is the primary Redis server's clock (`now_ms` = `*`), except on a
//! `--manual-clock` server, which sends its own clock's time: every server
//! of such a test must be advanced alike.

mod conn;
pub mod listen;
pub mod policies;
mod reply;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::oneshot;

use super::error::{check_key, invalid, zero_lease};
use super::tickets::random_ticket;
use super::{AcquireArgs, AcquireReply, CompleteReply, Engine, EngineError, KeyReading, Page};
use crate::domain::{Decision, Millis, Outcome, Phase, Policy, TicketId};
use conn::Conn;
pub use conn::{StoreFigures, StoreUrl};
pub use listen::{ANSWERS, EVENTS, POLICIES};
use reply::{decision_of, reading_of, Answer};

/// The prefix of every key's Redis key: `fusebox:k:<key>`.
pub const KEY_PREFIX: &str = "fusebox:k:";

/// The most keys a `--manual-clock` server remembers to settle when its
/// clock moves (tests only; the module's timer settles on Redis's clock).
const KNOWN_KEYS: usize = 100_000;

/// Policies whose JSON is kept (the rules in force, and the default).
const POLICY_CACHE: usize = 256;

/// A waiting caller's answer, as the module published it.
type Waiter = oneshot::Sender<Answer>;

/// The fusebox state in Redis, as one server sees it.
pub struct Shared {
    conn: Conn,
    url: StoreUrl,
    /// Callers of this server waiting in a key's queue, by waiter id.
    waiters: DashMap<TicketId, Waiter>,
    /// Keys this server touched, for a manual clock to settle.
    known: Mutex<BTreeSet<String>>,
    /// The manual clock of a `--manual-clock` server, whose time is sent
    /// instead of the store's.
    manual: Option<Arc<dyn super::Clock>>,
    /// Each policy in force (held, so that its pointer stays its own) with
    /// its JSON.
    policies: Mutex<Vec<(Arc<Policy>, Arc<str>)>>,
    /// Figures for /metrics.
    pub figures: Arc<StoreFigures>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("url", &self.url).finish()
    }
}

/// The id the module knows a policy's JSON by: the first 16 bytes of its
/// SHA-256, in hex (a command names a known policy as `@` and the id).
pub fn policy_id(json: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(json.as_bytes())[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The Redis key of a fusebox key.
pub fn redis_key(key: &str) -> String {
    format!("{KEY_PREFIX}{key}")
}

/// A ticket's token with its key in it, so that `Complete` and `Renew`
/// find the key (and its hash slot) from the ticket alone: the id's 32 hex
/// digits, a dot, and the key's bytes in hex.
pub fn token_with_key(id: TicketId, key: &str) -> String {
    let mut token = format!("{:032x}.", id.0);
    for b in key.bytes() {
        token.push_str(&format!("{b:02x}"));
    }
    token
}

/// The id and key a token names; a token of another shape is not found
/// (L4), an empty one is malformed.
pub fn ticket_and_key(token: &str) -> Result<(TicketId, String), EngineError> {
    if token.is_empty() {
        return Err(invalid(
            "ticket",
            "is required: pass the ticket that Acquire returned",
        ));
    }
    let (id, key) = token.split_once('.').ok_or(EngineError::TicketNotFound)?;
    let lower_hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if id.len() != 32 || !lower_hex(id) || key.len() % 2 != 0 || !lower_hex(key) {
        return Err(EngineError::TicketNotFound);
    }
    let id = u128::from_str_radix(id, 16).map_err(|_| EngineError::TicketNotFound)?;
    let bytes: Vec<u8> = (0..key.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&key[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| EngineError::TicketNotFound)?;
    let key = String::from_utf8(bytes).map_err(|_| EngineError::TicketNotFound)?;
    check_key(&key).map_err(|_| EngineError::TicketNotFound)?;
    Ok((TicketId(id), key))
}

impl Shared {
    /// Connects to the store at `url` and checks that the module is loaded.
    pub async fn connect(
        url: &StoreUrl,
        manual: Option<Arc<dyn super::Clock>>,
    ) -> Result<Shared, EngineError> {
        let figures = Arc::new(StoreFigures::default());
        let conn = Conn::connect(url, figures.clone()).await?;
        let shared = Shared {
            conn,
            url: url.clone(),
            waiters: DashMap::new(),
            known: Mutex::new(BTreeSet::new()),
            policies: Mutex::new(Vec::new()),
            manual,
            figures,
        };
        shared.check_module().await?;
        Ok(shared)
    }

    /// The store's address, as given.
    pub fn url(&self) -> &StoreUrl {
        &self.url
    }

    async fn check_module(&self) -> Result<(), EngineError> {
        let cmd = redis::cmd("FB.VERSION");
        match self.conn.query_any(&cmd).await {
            Ok(_) => Ok(()),
            Err(EngineError::Invalid { problem, .. }) => Err(EngineError::StoreUnavailable(
                format!("{} answers FB.VERSION with {problem}; load the fusebox module there (redis-server --loadmodule .../libfusebox_redis.so)", self.url),
            )),
            Err(e) => Err(e),
        }
    }

    /// The time argument: `*` (the primary Redis server's clock), or the
    /// manual clock's time.
    fn now_arg(&self) -> String {
        match &self.manual {
            Some(clock) => clock.now().to_string(),
            None => "*".to_owned(),
        }
    }

    /// The JSON of the policy `key` runs under, sent with every acquire:
    /// made once per policy in force, not once per call.
    fn policy_json(&self, engine: &Engine, key: &str) -> Result<Arc<str>, EngineError> {
        let policy = engine.policy_for(key);
        let mut cache = self.policies.lock().expect("policy cache");
        if let Some((_, json)) = cache.iter().find(|(p, _)| Arc::ptr_eq(p, &policy)) {
            return Ok(json.clone());
        }
        let json: Arc<str> = serde_json::to_string(&policy.spec())
            .map_err(|e| EngineError::Internal(format!("the policy as JSON: {e}")))?
            .into();
        // Policies of rules no longer in force go when the cache fills.
        if cache.len() >= POLICY_CACHE {
            cache.clear();
        }
        cache.push((policy, json.clone()));
        Ok(json)
    }

    fn remember(&self, key: &str) {
        if self.manual.is_none() {
            return;
        }
        let mut known = self.known.lock().expect("known keys");
        if known.len() < KNOWN_KEYS {
            known.insert(key.to_owned());
        }
    }

    /// Answers an acquire in Redis, waiting for a queued request's answer
    /// on the answers channel.
    pub async fn acquire(
        &self,
        engine: &Engine,
        args: AcquireArgs,
    ) -> Result<AcquireReply, EngineError> {
        let id = random_ticket()?;
        let policy = self.policy_json(engine, &args.key)?;
        let rk = redis_key(&args.key);
        let mut cmd = redis::cmd("FB.ACQUIRE");
        cmd.arg(&rk)
            .arg(self.now_arg())
            .arg(format!("{:032x}", id.0))
            .arg(&*policy)
            .arg("PERMITS")
            .arg(args.permits);
        if let Some(lease) = args.lease {
            cmd.arg("LEASE").arg(lease);
        }
        let mut waiting = None;
        if args.max_wait > 0 && args.permits > 0 {
            // K3: this server's waiters are capped; keys and tickets are
            // bounded by Redis's memory (decisions item 69).
            let limit = engine.limits().max_waiters;
            if self.waiters.len() as u64 >= limit {
                return Err(EngineError::Exhausted {
                    what: "waiters",
                    cap: "max_waiters",
                    limit,
                });
            }
            cmd.arg("MAXWAIT").arg(args.max_wait);
            // Registered before the request goes: the answer may be
            // published before the reply to this command arrives.
            let (tx, rx) = oneshot::channel();
            self.waiters.insert(id, tx);
            waiting = Some(WaitGuard {
                shared: self,
                key: args.key.clone(),
                id,
                answered: false,
                rx: Some(rx),
            });
        }
        self.remember(&args.key);
        // On an error the guard, dropped, withdraws the waiter: the store
        // may have queued it before the reply was lost.
        let value = self.conn.query(&cmd).await?;
        let answer = decision_of(&value)?;
        let reply = match (answer.decision, waiting) {
            (Decision::Queued, Some(mut guard)) => guard.wait(engine, args.max_wait).await?,
            (_, Some(mut guard)) => {
                guard.answered = true;
                self.waiters.remove(&id);
                answer
            }
            (_, None) => answer,
        };
        Ok(self.reply_of(&args.key, reply))
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

    /// Records a ticket's outcome (B3, C5, L4).
    pub async fn complete(
        &self,
        token: &str,
        outcome: Outcome,
    ) -> Result<CompleteReply, EngineError> {
        let (id, key) = ticket_and_key(token)?;
        let mut cmd = redis::cmd("FB.COMPLETE");
        cmd.arg(redis_key(&key))
            .arg(self.now_arg())
            .arg(format!("{:032x}", id.0))
            .arg(outcome.as_str());
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
        cmd.arg(redis_key(&key))
            .arg(self.now_arg())
            .arg(format!("{:032x}", id.0));
        if let Some(lease) = lease {
            cmd.arg("LEASE").arg(lease);
        }
        let value = self.conn.query(&cmd).await?;
        reply::millis(&value, "FB.RENEW")
    }

    /// Reads a key (B6); a key never used reads as a fresh one would (K2).
    pub async fn get(&self, engine: &Engine, key: &str) -> Result<KeyReading, EngineError> {
        check_key(key)?;
        let mut cmd = redis::cmd("FB.GET");
        cmd.arg(redis_key(key)).arg(self.now_arg());
        let value = self.conn.query(&cmd).await?;
        match reading_of(key, &value)? {
            Some(reading) => Ok(reading),
            None => {
                let now = match &self.manual {
                    Some(clock) => clock.now(),
                    None => unix_now(),
                };
                Ok(KeyReading {
                    key: key.to_owned(),
                    view: crate::domain::Fuse::new(engine.policy_for(key), now).view(now),
                    now,
                })
            }
        }
    }

    /// Isolates (`isolate`) or closes a key (B5), recording who and why in
    /// the event; the reply waits for a replica to have it (`WAIT`).
    pub async fn manual(
        &self,
        engine: &Engine,
        key: &str,
        reason: &str,
        who: &str,
        isolate: bool,
    ) -> Result<KeyReading, EngineError> {
        let why = super::operator_action(key, reason, who, isolate)?;
        let rk = redis_key(key);
        let mut cmd = redis::cmd(if isolate { "FB.ISOLATE" } else { "FB.CLOSE" });
        cmd.arg(&rk).arg(self.now_arg());
        if isolate {
            cmd.arg("POLICY").arg(&*self.policy_json(engine, key)?);
        }
        cmd.arg("BY")
            .arg(truncate(who, 256))
            .arg("WHY")
            .arg(truncate(why, 256));
        self.remember(key);
        let value = self.conn.query(&cmd).await?;
        self.conn.wait_for_replica(&rk).await;
        match reading_of(key, &value)? {
            Some(reading) => Ok(reading),
            None => self.get(engine, key).await,
        }
    }

    /// A page of keys in key order, from every primary: a walk of the
    /// whole keyspace (`FB.LIST`, which reads each key where it lies), so
    /// a listing's cost grows with the keys in Redis.
    pub async fn list_page(
        &self,
        prefix: &str,
        phases: &[Phase],
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, EngineError> {
        let found = self
            .conn
            .list(&format!("{KEY_PREFIX}{prefix}"), &self.now_arg())
            .await?;
        let mut readings = Vec::new();
        for (name, view) in found {
            let Some(key) = name.strip_prefix(KEY_PREFIX) else {
                continue;
            };
            if !key.starts_with(prefix) || after.is_some_and(|a| key <= a) {
                continue;
            }
            if let Some(reading) = reading_of(key, &view)? {
                if phases.is_empty() || phases.contains(&reading.view.phase) {
                    readings.push(reading);
                }
            }
        }
        readings.sort_by(|a, b| a.key.cmp(&b.key));
        readings.dedup_by(|a, b| a.key == b.key);
        let more = readings.len() > limit;
        let visited = readings.len();
        readings.truncate(limit);
        Ok(Page {
            readings,
            more,
            visited,
        })
    }

    /// Settles every key this server touched at the manual clock's `now`
    /// (leases that ended, waits that timed out), so that a test that
    /// moves every server's clock sees what is due happen.
    pub async fn settle_known(&self, now: Millis) -> Result<(), EngineError> {
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

    /// Hands a published answer to this server's waiter, if it has it.
    pub(crate) fn deliver(&self, waiter: TicketId, answer: Answer) {
        if let Some((_, tx)) = self.waiters.remove(&waiter) {
            let _gone = tx.send(answer);
        }
    }

    /// Answers every waiter of this server UNAVAILABLE (shutting down).
    pub fn drop_waiters(&self) {
        self.waiters.clear();
    }
}

impl Engine {
    /// Keeps every key's state in the Redis store at `url` from now on:
    /// connects, checks the module, subscribes to what it publishes, and
    /// adopts the fleet's policies (or shares this server's). Call it once,
    /// before serving.
    pub async fn use_store(self: &Arc<Self>, url: &StoreUrl) -> Result<(), EngineError> {
        let manual = self.manual.clone().map(|m| m as Arc<dyn super::Clock>);
        let shared = Shared::connect(url, manual).await?;
        if self.shared.set(Arc::new(shared)).is_err() {
            return Err(EngineError::Internal("the store is set once".to_owned()));
        }
        let (ready, subscribed) = oneshot::channel();
        tokio::spawn(listen::listen(self.clone(), ready));
        if tokio::time::timeout(Duration::from_secs(5), subscribed)
            .await
            .is_err()
        {
            return Err(EngineError::StoreUnavailable(format!(
                "cannot subscribe to the answers and events of {url} within 5 s"
            )));
        }
        policies::start(self).await
    }

    /// The Redis store, when state is kept there.
    pub fn shared(&self) -> Option<&Arc<Shared>> {
        self.shared.get()
    }

    /// Sends a phase change another server (or the store's timer) made to
    /// this server's watchers.
    pub(crate) fn publish_shared(&self, event: super::Event) {
        self.publisher.send_batch(|| vec![event]);
    }

    /// [`Engine::complete`], or the store's.
    pub async fn complete_async(
        &self,
        token: &str,
        outcome: Outcome,
    ) -> Result<CompleteReply, EngineError> {
        match self.shared.get() {
            Some(shared) => shared.complete(token, outcome).await,
            None => self.complete(token, outcome),
        }
    }

    /// [`Engine::renew`], or the store's.
    pub async fn renew_async(
        &self,
        token: &str,
        lease: Option<Millis>,
    ) -> Result<Millis, EngineError> {
        match self.shared.get() {
            Some(shared) => shared.renew(token, lease).await,
            None => self.renew(token, lease),
        }
    }

    /// [`Engine::get`], or the store's.
    pub async fn get_async(&self, key: &str) -> Result<KeyReading, EngineError> {
        match self.shared.get() {
            Some(shared) => shared.get(self, key).await,
            None => self.get(key),
        }
    }

    /// [`Engine::isolate`], or the store's.
    pub async fn isolate_async(
        &self,
        key: &str,
        reason: &str,
        who: &str,
    ) -> Result<KeyReading, EngineError> {
        match self.shared.get() {
            Some(shared) => shared.manual(self, key, reason, who, true).await,
            None => self.isolate(key, reason, who),
        }
    }

    /// [`Engine::close`], or the store's.
    pub async fn close_async(
        &self,
        key: &str,
        reason: &str,
        who: &str,
    ) -> Result<KeyReading, EngineError> {
        match self.shared.get() {
            Some(shared) => shared.manual(self, key, reason, who, false).await,
            None => self.close(key, reason, who),
        }
    }

    /// [`Engine::list_page`], or the store's.
    pub async fn list_page_async(
        &self,
        prefix: &str,
        phases: &[Phase],
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, EngineError> {
        match self.shared.get() {
            Some(shared) => shared.list_page(prefix, phases, after, limit).await,
            None => Ok(self.list_page(prefix, phases, after, limit)),
        }
    }
}

fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The wall clock in unix milliseconds: the time of a key read when Redis
/// holds nothing for it.
fn unix_now() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

/// A caller waiting in a key's queue. Dropped before its answer (the
/// caller went away, P6), it withdraws the waiter in Redis; a ticket the
/// waiter got meanwhile is given back.
struct WaitGuard<'a> {
    shared: &'a Shared,
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
    async fn wait(&mut self, engine: &Engine, max_wait: Millis) -> Result<Answer, EngineError> {
        let mut rx = self.rx.take().expect("waits once");
        let stopping = engine.stopped();
        tokio::pin!(stopping);
        let manual = self.shared.manual.is_some();
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
                        None => {
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
            .arg(format!("{:032x}", self.id.0));
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
            .arg(format!("{:032x}", self.id.0));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = conn.query(&cmd).await {
                    tracing::warn!("a caller that stopped waiting could not be withdrawn from its queue: {e}; its place (or a ticket it was given) goes when the wait (or lease) ends");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_carries_its_key() {
        let id = TicketId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        for key in ["payments", "a.b/c:{d}", "ключ", "k"] {
            let token = token_with_key(id, key);
            assert_eq!(ticket_and_key(&token).unwrap(), (id, key.to_owned()));
        }
        for bad in [
            "x",
            "0123.6b",
            "0123456789abcdef0011223344556677.6",
            "0123456789abcdef0011223344556677.ZZ",
            "0123456789ABCDEF0011223344556677.6b",
            "0123456789abcdef0011223344556677.",
            "0123456789abcdef0011223344556677.ff",
        ] {
            assert_eq!(
                ticket_and_key(bad),
                Err(EngineError::TicketNotFound),
                "{bad}"
            );
        }
        assert!(matches!(
            ticket_and_key(""),
            Err(EngineError::Invalid { .. })
        ));
    }
}
