//! The shared link's commands, sent in batches: while a batch is out, the
//! commands that arrive wait, and go together when it is answered. A lone
//! command goes at once; under load the batches grow by themselves, so
//! that a server writes (and Redis reads) one pipeline where it would
//! write many commands, at the cost of at most one round trip of waiting.
//! With one Redis server a batch is one pipeline; with a cluster its
//! commands are all handed to the cluster client at once, which writes
//! each node's together and follows redirects per command. Commands keep
//! their order: one batch is out at a time, and within it they are handed
//! on in the order they came.
//!
//! A command that charges (`FB.ACQUIRE`, `FB.CHARGE`) is looked at once
//! more as its batch is made: one whose caller went away (the call was
//! cancelled) or whose call's deadline passed while it waited is not sent
//! (F1, F2): nothing is charged for a call nobody waits for. Every other
//! command goes regardless: a Complete gives permits back even when its
//! caller stopped waiting for the answer.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::{Cmd, RedisError, Value};

use super::super::deadline;
use super::link::Link;
use tokio::sync::{mpsc, oneshot};

/// The most commands in one pipeline.
const MAX_BATCH: usize = 512;

/// With a cluster, the longest the next batch waits for the one out.
const CLUSTER_HOLD: Duration = Duration::from_millis(1);

/// Why a command got no answer from the store.
pub(super) enum Unsent {
    /// The store failed it, or could not be reached.
    Failed(RedisError),
    /// Its call's deadline passed while it waited for its batch: it was
    /// not sent.
    Expired(super::super::EngineError),
}

/// A command; when it charges, its call's deadline (if it has one); and
/// where its answer goes.
type Queued = (
    Cmd,
    Option<Option<Instant>>,
    oneshot::Sender<Result<Value, Unsent>>,
);

/// The sending side of a connection's batches.
#[derive(Clone)]
pub(super) struct Batcher {
    tx: mpsc::UnboundedSender<Queued>,
}

impl Batcher {
    /// Batches for `conn`, sent by a task of their own (which ends when
    /// the last `Batcher` is dropped).
    pub(super) fn new(conn: Link) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(drive(conn, rx));
        Batcher { tx }
    }

    /// Sends `cmd` with the next batch and waits for its answer; a server
    /// error is the answer's `Value::ServerError`, as on the connection.
    /// A command of a call past its deadline when its batch is made is
    /// not sent: [`Unsent::Expired`].
    pub(super) async fn query(&self, cmd: Cmd) -> Result<Value, Unsent> {
        let (tx, rx) = oneshot::channel();
        let by = charges(&cmd).then(deadline::current);
        self.tx.send((cmd, by, tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

fn gone() -> Unsent {
    Unsent::Failed(RedisError::from((
        redis::ErrorKind::Io,
        "the server is shutting down its link to the store",
    )))
}

/// True for a command that charges: one the module decides on.
fn charges(cmd: &Cmd) -> bool {
    matches!(
        cmd.args_iter().next(),
        Some(redis::Arg::Simple(name))
            if name.eq_ignore_ascii_case(b"FB.ACQUIRE") || name.eq_ignore_ascii_case(b"FB.CHARGE")
    )
}

/// Adds `queued` to `batch`, unless it charges and nobody waits for its
/// answer any more or its call's deadline passed (then it is answered so,
/// and not sent).
fn take(batch: &mut Vec<Queued>, queued: Queued) {
    let (_, by, tx) = &queued;
    let Some(by) = by else {
        batch.push(queued);
        return;
    };
    if tx.is_closed() {
        return;
    }
    if let Some(Err(e)) = by.map(|by| deadline::check_at(by, Instant::now())) {
        let _ = queued.2.send(Err(Unsent::Expired(e)));
        return;
    }
    batch.push(queued);
}

async fn drive(conn: Link, mut rx: mpsc::UnboundedReceiver<Queued>) {
    let mut batch: Vec<Queued> = Vec::new();
    // With a cluster: the batch that is out, and when it went.
    let mut out: Option<(tokio::task::JoinHandle<Vec<()>>, Instant)> = None;
    while let Some(first) = rx.recv().await {
        if let Some((handle, sent)) = out.as_mut() {
            // A node that does not answer must not hold up the others:
            // the next batch goes when this one is answered or after
            // CLUSTER_HOLD, whichever comes first.
            let _ = tokio::time::timeout_at((*sent + CLUSTER_HOLD).into(), handle).await;
            out = None;
        }
        take(&mut batch, first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => take(&mut batch, next),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        match &conn {
            Link::Single(c) => pipeline(&mut c.clone(), &mut batch).await,
            Link::Cluster(c) => {
                let mut all = Box::pin(futures_util::future::join_all(batch.drain(..).map(
                    |(cmd, _, tx)| {
                        let mut c = c.clone();
                        async move {
                            let _ = tx.send(cmd.query_async(&mut c).await.map_err(Unsent::Failed));
                        }
                    },
                )));
                // Polled once here, so that each command is queued with the
                // cluster client before the next (join_all polls them in
                // order), then answered on a task of its own.
                let started = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(all.as_mut().poll(cx).is_ready())
                })
                .await;
                if !started {
                    out = Some((tokio::spawn(all), Instant::now()));
                }
            }
        }
    }
}

/// Sends `batch` (emptied) to one Redis server as one pipeline.
async fn pipeline(conn: &mut redis::aio::ConnectionManager, batch: &mut Vec<Queued>) {
    if batch.len() == 1 {
        let (cmd, _, tx) = batch.pop().expect("one command");
        let _ = tx.send(cmd.query_async(conn).await.map_err(Unsent::Failed));
        return;
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut answers = Vec::with_capacity(batch.len());
    for (cmd, _, tx) in batch.drain(..) {
        pipe.add_command(cmd);
        answers.push(tx);
    }
    match pipe.query_async::<Vec<Value>>(conn).await {
        Ok(values) if values.len() == answers.len() => {
            for (tx, value) in answers.into_iter().zip(values) {
                let _ = tx.send(Ok(value));
            }
        }
        Ok(values) => {
            let e = RedisError::from((
                redis::ErrorKind::Client,
                "a pipeline was answered with another number of replies",
                format!("{} commands, {} replies", answers.len(), values.len()),
            ));
            for tx in answers {
                let _ = tx.send(Err(Unsent::Failed(e.clone())));
            }
        }
        Err(e) => {
            for tx in answers {
                let _ = tx.send(Err(Unsent::Failed(e.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_commands_that_charge_are_withdrawn() {
        assert!(charges(&redis::cmd("FB.ACQUIRE")));
        assert!(charges(&redis::cmd("fb.charge")));
        assert!(!charges(&redis::cmd("FB.COMPLETE")));
        assert!(!charges(&redis::cmd("FB.GET")));
    }
}
