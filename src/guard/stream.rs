//! The guard's calls multiplexed over one `Decide` stream per guard
//! ([`Transport::Stream`](super::Transport)): each call is a frame with an
//! id of its own, the frames ready together go out in one message, and each
//! answer is handed to its caller by id. The stream is opened on the first
//! call and again after it ends (the calls in flight on it fail
//! `UNAVAILABLE`, as a broken unary call would).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::Status;

use fusebox_proto::v1 as pb;

/// Groups of frames queued for the stream at most (a caller past it
/// waits). A group is one call's frame, or one send of outcomes.
const QUEUE: usize = 10_000;

/// Frames sent in one message at most (the server's limit).
const FRAMES_PER_MESSAGE: usize = 1_000;

type Answer = pb::decide_result::Result;
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>;
/// Frames that go out in one message: one call's, or one send of outcomes.
type Group = Vec<pb::DecideFrame>;

/// One guard's `Decide` stream, opened on demand.
pub(super) struct Mux {
    client: pb::fusebox_client::FuseboxClient<Channel>,
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// The open stream's queue of frame groups and the callers waiting for
    /// its answers; `None` until opened.
    open: tokio::sync::Mutex<Option<(mpsc::Sender<Group>, Pending)>>,
    next_id: AtomicU64,
}

impl Mux {
    pub(super) fn new(
        client: pb::fusebox_client::FuseboxClient<Channel>,
        authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    ) -> Mux {
        Mux {
            client,
            authorization,
            open: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
        }
    }

    /// The open stream's frame queue and pending answers, opening the
    /// stream if need be.
    async fn stream(&self, deadline: Duration) -> Result<(mpsc::Sender<Group>, Pending), Status> {
        let mut open = self.open.lock().await;
        if let Some((tx, pending)) = open.as_ref().filter(|(tx, _)| !tx.is_closed()) {
            return Ok((tx.clone(), pending.clone()));
        }
        let (tx, rx) = mpsc::channel::<Group>(QUEUE);
        let (messages_tx, messages_rx) = mpsc::channel::<pb::DecideRequest>(16);
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(messages_rx));
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        let mut client = self.client.clone();
        let answers = tokio::time::timeout(deadline, client.decide(request))
            .await
            .map_err(|_| {
                Status::deadline_exceeded("fusebox did not open the Decide stream in time")
            })??
            .into_inner();
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        tokio::spawn(batch(rx, messages_tx));
        tokio::spawn(deliver(answers, pending.clone()));
        *open = Some((tx.clone(), pending.clone()));
        Ok((tx, pending))
    }

    /// Sends `request` as a frame and waits for its answer, at most
    /// `deadline`; a waiting Acquire whose deadline passes is cancelled.
    pub(super) async fn call(
        &self,
        request: pb::decide_frame::Request,
        deadline: Duration,
    ) -> Result<Answer, Status> {
        let cancellable = matches!(request, pb::decide_frame::Request::Acquire(_));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let sent = async {
            let (frames, pending) = self.stream(deadline).await?;
            pending.lock().expect("pending lock").insert(id, tx);
            let frame = pb::DecideFrame {
                id,
                request: Some(request),
            };
            if frames.send(vec![frame]).await.is_err() {
                pending.lock().expect("pending lock").remove(&id);
                return Err(Status::unavailable("the Decide stream ended"));
            }
            Ok::<_, Status>((frames, pending))
        };
        let (frames, pending) = match tokio::time::timeout(deadline, sent).await {
            Ok(sent) => sent?,
            Err(_) => return Err(Status::deadline_exceeded("fusebox did not answer in time")),
        };
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(Status::unavailable(
                "the Decide stream ended before fusebox answered",
            )),
            Err(_) => {
                pending.lock().expect("pending lock").remove(&id);
                if cancellable {
                    let _ = frames.try_send(vec![pb::DecideFrame {
                        id,
                        request: Some(pb::decide_frame::Request::Cancel(pb::CancelRequest {})),
                    }]);
                }
                Err(Status::deadline_exceeded("fusebox did not answer in time"))
            }
        }
    }

    /// Sends `requests` (at most [`FRAMES_PER_MESSAGE`], none a waiting
    /// Acquire) as frames of one message and waits, at most `deadline` in
    /// all, for their answers: one per request, in order, an answer or the
    /// status of the frame that got none.
    pub(super) async fn call_group(
        &self,
        requests: Vec<pb::decide_frame::Request>,
        deadline: Duration,
    ) -> Vec<Result<Answer, Status>> {
        let count = requests.len();
        let first = self.next_id.fetch_add(count as u64, Ordering::Relaxed);
        let mut answers = Vec::with_capacity(count);
        let mut waiting: Option<Pending> = None;
        let sent = async {
            let (frames, pending) = self.stream(deadline).await?;
            waiting = Some(pending.clone());
            let mut receivers = Vec::with_capacity(count);
            let mut group = Vec::with_capacity(count);
            {
                let mut pending = pending.lock().expect("pending lock");
                for (id, request) in (first..).zip(requests) {
                    let (tx, rx) = oneshot::channel();
                    pending.insert(id, tx);
                    receivers.push(rx);
                    group.push(pb::DecideFrame {
                        id,
                        request: Some(request),
                    });
                }
            }
            if frames.send(group).await.is_err() {
                return Err(Status::unavailable("the Decide stream ended"));
            }
            for rx in receivers {
                answers.push(rx.await.map_err(|_| {
                    Status::unavailable("the Decide stream ended before fusebox answered")
                }));
            }
            Ok(())
        };
        let trouble = match tokio::time::timeout(deadline, sent).await {
            Ok(Ok(())) => return answers,
            Ok(Err(status)) => status,
            Err(_) => Status::deadline_exceeded("fusebox did not answer in time"),
        };
        // The frames still unanswered: nobody waits for them any more.
        if let Some(pending) = waiting {
            let mut pending = pending.lock().expect("pending lock");
            for id in first + answers.len() as u64..first + count as u64 {
                pending.remove(&id);
            }
        }
        answers.resize_with(count, || Err(trouble.clone()));
        answers
    }
}

/// Puts the groups of frames ready together into one message, up to the
/// server's limit of frames per message; a group is never split.
async fn batch(mut groups: mpsc::Receiver<Group>, messages: mpsc::Sender<pb::DecideRequest>) {
    let mut carried: Option<Group> = None;
    loop {
        let mut frames = match carried.take() {
            Some(group) => group,
            None => match groups.recv().await {
                Some(group) => group,
                None => return,
            },
        };
        while frames.len() < FRAMES_PER_MESSAGE {
            match groups.try_recv() {
                Ok(group) if frames.len() + group.len() <= FRAMES_PER_MESSAGE => {
                    frames.extend(group)
                }
                Ok(group) => {
                    carried = Some(group);
                    break;
                }
                Err(_) => break,
            }
        }
        if messages.send(pb::DecideRequest { frames }).await.is_err() {
            return;
        }
    }
}

/// Hands each answer to its caller; when the stream ends, the callers
/// still waiting get `UNAVAILABLE` (their senders are dropped).
async fn deliver(mut answers: tonic::Streaming<pb::DecideResponse>, pending: Pending) {
    while let Some(Ok(message)) = answers.next().await {
        let mut pending = pending.lock().expect("pending lock");
        for result in message.results {
            if let (Some(tx), Some(answer)) = (pending.remove(&result.id), result.result) {
                let _ = tx.send(answer);
            }
        }
    }
    pending.lock().expect("pending lock").clear();
}

/// A stream answer of the wrong kind for its frame.
pub(super) fn unexpected(answer: pb::decide_result::Result) -> tonic::Status {
    tonic::Status::internal(format!(
        "fusebox answered a frame with {answer:?}, not the answer of its kind"
    ))
}

/// An error answer as the status the unary call would have failed with.
pub(super) fn status_of(error: pb::ItemError) -> Status {
    Status::new(tonic::Code::from(error.code), error.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(first: u64, count: u64) -> Group {
        (first..first + count)
            .map(|id| pb::DecideFrame { id, request: None })
            .collect()
    }

    /// Groups ready together share a message up to the server's limit; a
    /// group is never split, and the frames keep their order.
    #[tokio::test]
    async fn groups_share_messages_up_to_the_limit_and_are_never_split() {
        let sizes = [1, 999, 1, 1000, 500, 600, 3];
        let (tx, rx) = mpsc::channel::<Group>(QUEUE);
        let mut first = 0;
        for size in sizes {
            tx.send(group(first, size)).await.expect("queued");
            first += size;
        }
        drop(tx);
        let (messages_tx, mut messages) = mpsc::channel(16);
        batch(rx, messages_tx).await;
        let mut lengths = Vec::new();
        let mut ids = Vec::new();
        while let Ok(message) = messages.try_recv() {
            lengths.push(message.frames.len());
            ids.extend(message.frames.iter().map(|f| f.id));
        }
        assert_eq!(lengths, [1000, 1, 1000, 500, 603]);
        assert_eq!(ids, (0..first).collect::<Vec<_>>());
    }
}
