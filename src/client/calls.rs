//! The commands that make one call to a server and print its answer:
//! `acquire`, `complete`, `get`, `isolate`, `close` and `advance`.

use fusebox_proto::v1 as pb;
use fusebox_proto::wire::{duration_of, millis_of};

use crate::connect::{admin, call_error, connect, operator, ClientOptions};
use crate::print::{phase_name, print_acquire, print_key};

/// `fusebox acquire`: asks for `permits` on `key`, waiting at most `wait`
/// ms server-side, for a ticket leased for `lease` ms (the policy's when
/// none), as `caller` (Q1; the server's choice when none) on `attempt`
/// (R1; a first attempt when none); prints the decision and the ticket.
pub async fn acquire(
    client: &ClientOptions,
    key: String,
    permits: u32,
    wait: Option<u64>,
    lease: Option<u64>,
    caller: Option<String>,
    attempt: Option<u32>,
) -> anyhow::Result<()> {
    let mut c = pb::fusebox_client::FuseboxClient::new(connect(client).await?);
    let r = c
        .acquire(pb::AcquireRequest {
            key,
            permits: Some(permits),
            max_wait: wait.map(duration_of),
            lease: lease.map(duration_of),
            attempt,
            caller: caller.unwrap_or_default(),
        })
        .await
        .map_err(call_error)?
        .into_inner();
    print_acquire(&r, client.json)
}

/// `fusebox complete`: reports how the call a ticket covered went and,
/// with `cost`, the permits it really used (U1).
pub async fn complete(
    client: &ClientOptions,
    ticket: String,
    outcome: pb::Outcome,
    cost: Option<u32>,
) -> anyhow::Result<()> {
    let mut c = pb::fusebox_client::FuseboxClient::new(connect(client).await?);
    let r = c
        .complete(pb::CompleteRequest {
            ticket,
            outcome: outcome as i32,
            cost,
        })
        .await
        .map_err(call_error)?
        .into_inner();
    if client.json {
        println!(
            "{}",
            serde_json::json!({"stale": r.stale, "phase": phase_name(r.phase)})
        );
    } else if r.stale {
        println!("stale: the outcome was not counted (the breaker moved on since the ticket was issued); phase {}", phase_name(r.phase));
    } else {
        println!("recorded; phase {}", phase_name(r.phase));
    }
    Ok(())
}

/// `fusebox get`: prints a key's breaker and permits.
pub async fn get(client: &ClientOptions, key: String) -> anyhow::Result<()> {
    let s = admin(client)
        .await?
        .get_key(pb::GetKeyRequest { key })
        .await
        .map_err(call_error)?
        .into_inner();
    print_key(&s, client.json)
}

/// What `isolate` and `close` do to a key (B5), each one Admin call
/// recorded with the operator's name and the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `Admin.Isolate`: refuse every request on the key until it is closed.
    Isolate,
    /// `Admin.Close`: close the key's breaker, clearing its counts.
    Close,
}

/// `fusebox isolate` and `fusebox close`: does `action` to `key` for
/// `reason`, then prints the key as the server answered it.
pub async fn act(
    client: &ClientOptions,
    action: Action,
    key: String,
    reason: String,
) -> anyhow::Result<()> {
    let mut admin = admin(client).await?;
    let answer = match action {
        Action::Isolate => {
            admin
                .isolate(operator(pb::IsolateRequest { key, reason }))
                .await
        }
        Action::Close => {
            admin
                .close(operator(pb::CloseRequest { key, reason }))
                .await
        }
    };
    print_key(&answer.map_err(call_error)?.into_inner(), client.json)
}

/// `fusebox advance`: moves a `--manual-clock` server's clock forward by
/// `by` ms.
pub async fn advance(client: &ClientOptions, by: u64) -> anyhow::Result<()> {
    let mut c = pb::clock_client::ClockClient::new(connect(client).await?);
    let r = c
        .advance(pb::AdvanceRequest {
            by: Some(duration_of(by)),
        })
        .await
        .map_err(|status| match status.code() {
            // A server without --manual-clock does not serve the
            // Clock service at all (X1), so the answer has no message.
            tonic::Code::Unimplemented => anyhow::anyhow!(
                "UNIMPLEMENTED: the clock of the server at {} is not manual; \
                 start it with `fusebox serve --manual-clock` to move time by hand",
                client.server
            ),
            _ => call_error(status),
        })?
        .into_inner();
    let now = millis_of("now", r.now).ok().flatten().unwrap_or(0);
    if client.json {
        println!("{}", serde_json::json!({ "now_ms": now }));
    } else {
        println!("clock now {now}ms");
    }
    Ok(())
}
