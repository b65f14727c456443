//! The wait queue over the wire (P3–P6): waiters on separate connections are
//! served in order, oldest or newest first, and a waiter whose client goes
//! away or whose RPC deadline passes frees its room at once.
//!
//! Every server runs on the manual clock, so no `max_wait` ever ends: a
//! waiter leaves the queue only because it is served or its RPC ends. Nothing
//! sleeps to synchronise; conditions are polled through `GetKey` with a
//! deadline.

use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::harness::{eventually, ms, Server};
use crate::process::get_key;

const KEY: &str = "queue/db";
const WAITERS: usize = 20;
/// Long enough never to end: the clock is manual and never advanced.
const MAX_WAIT_MS: u64 = 3_600_000;
/// Safety net for conditions reached asynchronously.
const LIMIT: Duration = Duration::from_secs(20);

type Client = pb::fusebox_client::FuseboxClient<Channel>;

fn config(queue_limit: u32, order: &str) -> String {
    format!(
        r#"
[default]
limiter = {{ kind = "concurrency", permits = 1, queue_limit = {queue_limit}, order = "{order}" }}
"#
    )
}

fn request(max_wait: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: KEY.into(),
        permits: None,
        max_wait: (max_wait > 0).then(|| ms(max_wait)),
        lease: None,
        ..Default::default()
    }
}

async fn acquire_now(client: &mut Client) -> pb::AcquireResponse {
    client
        .acquire(request(0))
        .await
        .expect("Acquire answers")
        .into_inner()
}

async fn complete(client: &mut Client, ticket: String) {
    let done = crate::admin::complete(client, &ticket, pb::Outcome::Success).await;
    assert!(!done.stale);
}

/// A waiting Acquire on its own connection, in its own task.
async fn wait_in_line(server: &Server) -> JoinHandle<Result<pb::AcquireResponse, tonic::Status>> {
    let mut client = server.fusebox().await;
    tokio::spawn(async move {
        client
            .acquire(request(MAX_WAIT_MS))
            .await
            .map(|r| r.into_inner())
    })
}

fn is_granted(a: &pb::AcquireResponse) -> bool {
    a.decision == pb::Decision::Granted as i32 && !a.ticket.is_empty()
}

/// Holds the only permit, queues `WAITERS` waiters one at a time (each seen
/// in the queue before the next is sent, so the arrival order is known),
/// then returns tickets one by one and records which waiter each return
/// served. Returns the waiters' indices in the order they were served.
async fn serving_order(order: &str) -> Vec<usize> {
    let server = Server::manual(Some(&config(WAITERS as u32, order))).await;
    let mut control = server.fusebox().await;
    let holder = acquire_now(&mut control).await;
    assert!(is_granted(&holder), "{holder:?}");

    let mut tasks = Vec::with_capacity(WAITERS);
    for i in 0..WAITERS {
        tasks.push(Some(wait_in_line(&server).await));
        let n = i as u32 + 1;
        let s = server
            .until(&format!("waiter {i} to be queued"), KEY, |s| s.waiters >= n)
            .await;
        assert_eq!(
            (s.waiters, s.queued, s.free),
            (n, n, 0),
            "after waiter {i}: {s:?}"
        );
        assert!(
            tasks.iter().flatten().all(|t| !t.is_finished()),
            "nobody is answered while the permit is held"
        );
    }

    let mut served = Vec::with_capacity(WAITERS);
    let mut ticket = holder.ticket;
    for round in 0..WAITERS {
        complete(&mut control, ticket).await;
        // One waiter is served: it leaves the queue and its task finishes.
        // Wait until every task still running is a waiter the server counts.
        let left = (WAITERS - round - 1) as u32;
        let admin = server.admin().await;
        let state = eventually(
            &format!("return {round} to serve one waiter"),
            LIMIT,
            || {
                let running = tasks.iter().flatten().filter(|t| !t.is_finished()).count();
                let mut admin = admin.clone();
                async move {
                    let s = get_key(&mut admin, KEY).await;
                    (s.waiters as usize == running && s.waiters <= left).then_some(s)
                }
            },
        )
        .await;
        assert_eq!(
            (state.waiters, state.queued),
            (left, left),
            "after return {round}: {state:?}"
        );
        let finished: Vec<usize> = (0..WAITERS)
            .filter(|&i| tasks[i].as_ref().is_some_and(|t| t.is_finished()))
            .collect();
        assert_eq!(
            finished.len(),
            1,
            "return {round} serves exactly one waiter, not {finished:?}"
        );
        let i = finished[0];
        let answer = tasks[i]
            .take()
            .expect("a task")
            .await
            .expect("the waiter's task")
            .unwrap_or_else(|s| panic!("waiter {i} got an error: {s:?}"));
        assert!(is_granted(&answer), "waiter {i} is granted: {answer:?}");
        assert_eq!(
            state.live_tickets, 1,
            "only the served waiter holds a ticket: {state:?}"
        );
        served.push(i);
        ticket = answer.ticket;
    }
    complete(&mut control, ticket).await;
    let s = server.get(KEY).await;
    assert_eq!(
        (s.free, s.queued, s.waiters, s.live_tickets),
        (1, 0, 0, 0),
        "every permit is back: {s:?}"
    );
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_waiters_are_served_oldest_first() {
    let served = serving_order("oldest_first").await;
    assert_eq!(served, (0..WAITERS).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_waiters_are_served_newest_first() {
    let served = serving_order("newest_first").await;
    assert_eq!(served, (0..WAITERS).rev().collect::<Vec<_>>());
}

/// A server whose one permit is held, with a queue of one; returns the
/// holder's client and ticket.
async fn full_permit() -> (Server, Client, String) {
    let server = Server::manual(Some(&config(1, "oldest_first"))).await;
    let mut control = server.fusebox().await;
    let holder = acquire_now(&mut control).await;
    assert!(is_granted(&holder), "{holder:?}");
    (server, control, holder.ticket)
}

/// The queue's one room is taken: a request that may wait is refused.
async fn assert_queue_full(control: &mut Client) {
    let a = control
        .acquire(request(MAX_WAIT_MS))
        .await
        .expect("Acquire answers")
        .into_inner();
    crate::admin::assert_denied(&a, pb::Reason::QueueFull);
}

/// After a waiter left: its room is free again (a new waiter fits), and the
/// holder's return serves the new waiter, not the one that left.
async fn assert_room_freed(server: &Server, control: &mut Client, holder: String) {
    let s = server
        .until("the waiter's room to be freed", KEY, |s| {
            s.waiters == 0 && s.queued == 0
        })
        .await;
    assert_eq!(
        (s.free, s.live_tickets),
        (0, 1),
        "the holder still holds its permit: {s:?}"
    );
    let next = wait_in_line(server).await;
    server
        .until("the next waiter to be queued", KEY, |s| s.waiters == 1)
        .await;
    complete(control, holder).await;
    let answer = tokio::time::timeout(LIMIT, next)
        .await
        .expect("the next waiter is served")
        .expect("the waiter's task")
        .expect("Acquire answers");
    assert!(is_granted(&answer), "{answer:?}");
    let s = server.get(KEY).await;
    assert_eq!(
        (s.free, s.queued, s.waiters, s.live_tickets),
        (0, 0, 0, 1),
        "only the new waiter holds the permit: {s:?}"
    );
    complete(control, answer.ticket).await;
    let s = server.get(KEY).await;
    assert_eq!((s.free, s.live_tickets), (1, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_cancels_frees_its_room_at_once() {
    let (server, mut control, holder) = full_permit().await;
    let waiter = wait_in_line(&server).await;
    let s = server
        .until("the waiter to be queued", KEY, |s| s.waiters == 1)
        .await;
    assert_eq!((s.queued, s.free), (1, 0), "{s:?}");
    assert_queue_full(&mut control).await;
    // Dropping the call resets its HTTP/2 stream: the server withdraws it.
    waiter.abort();
    assert!(waiter
        .await
        .expect_err("the task was aborted")
        .is_cancelled());
    assert_room_freed(&server, &mut control, holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_rpc_deadline_passes_is_withdrawn() {
    let (server, mut control, holder) = full_permit().await;
    let mut client = server.fusebox().await;
    let mut call = tonic::Request::new(request(MAX_WAIT_MS));
    call.set_timeout(Duration::from_millis(500));
    // The manual clock never moves, so `max_wait` cannot end: only the RPC
    // deadline can end this wait. An immediate answer would be `Ok`.
    let status = client
        .acquire(call)
        .await
        .expect_err("the wait ends with the RPC deadline");
    assert!(
        matches!(
            status.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{status:?}"
    );
    assert_room_freed(&server, &mut control, holder).await;
}
