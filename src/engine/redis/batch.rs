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

use std::future::Future;
use std::time::{Duration, Instant};

use redis::{Cmd, RedisError, Value};

use super::link::Link;
use tokio::sync::{mpsc, oneshot};

/// The most commands in one pipeline.
const MAX_BATCH: usize = 512;

/// With a cluster, the longest the next batch waits for the one out.
const CLUSTER_HOLD: Duration = Duration::from_millis(1);

/// A command and where its answer goes.
type Queued = (Cmd, oneshot::Sender<Result<Value, RedisError>>);

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
    pub(super) async fn query(&self, cmd: Cmd) -> Result<Value, RedisError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send((cmd, tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

fn gone() -> RedisError {
    RedisError::from((
        redis::ErrorKind::Io,
        "the server is shutting down its link to the store",
    ))
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
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        match &conn {
            Link::Single(c) => pipeline(&mut c.clone(), &mut batch).await,
            Link::Cluster(c) => {
                let mut all = Box::pin(futures_util::future::join_all(batch.drain(..).map(
                    |(cmd, tx)| {
                        let mut c = c.clone();
                        async move {
                            let _ = tx.send(cmd.query_async(&mut c).await);
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
        let (cmd, tx) = batch.pop().expect("one command");
        let _ = tx.send(cmd.query_async(conn).await);
        return;
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut answers = Vec::with_capacity(batch.len());
    for (cmd, tx) in batch.drain(..) {
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
                let _ = tx.send(Err(e.clone()));
            }
        }
        Err(e) => {
            for tx in answers {
                let _ = tx.send(Err(e.clone()));
            }
        }
    }
}
