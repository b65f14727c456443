//! A call's deadline (gRPC's `grpc-timeout`, counted from when the server
//! read the call's headers), carried with the call's task: the gRPC layer
//! sets it around each call ([`within`]), and the places where a request
//! waits before its decision (the store's batches, the engine's door) look
//! at it right before the decision is made. A call whose deadline passed
//! there is not decided: nothing is charged, no ticket is made, and it
//! answers `DEADLINE_EXCEEDED` (contract extension F1 in
//! docs/contract-extensions.md). A task-local and not an argument: the
//! deadline belongs to the call, not to what it asks, and every path a
//! call takes to the store runs on the call's task.

use std::future::Future;
use std::time::Instant;

use super::EngineError;

tokio::task_local! {
    static DEADLINE: Instant;
}

/// Runs `call` with `deadline` as its deadline (none: no deadline).
pub async fn within<F: Future>(deadline: Option<Instant>, call: F) -> F::Output {
    match deadline {
        Some(deadline) => DEADLINE.scope(deadline, call).await,
        None => call.await,
    }
}

/// The deadline of the call running on this task, if it has one.
pub fn current() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// `DEADLINE_EXCEEDED` when the call on this task is past its deadline.
pub fn check() -> Result<(), EngineError> {
    match current() {
        Some(deadline) => check_at(deadline, Instant::now()),
        None => Ok(()),
    }
}

/// `DEADLINE_EXCEEDED` when `deadline` is past at `now`.
pub fn check_at(deadline: Instant, now: Instant) -> Result<(), EngineError> {
    if now < deadline {
        return Ok(());
    }
    Err(EngineError::DeadlineExceeded {
        late_ms: now.duration_since(deadline).as_millis() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_call_past_its_deadline_is_refused_and_one_without_is_not() {
        assert!(check().is_ok(), "no deadline: never refused");
        let passed = Instant::now() - Duration::from_millis(5);
        let refused = within(Some(passed), async { check() }).await;
        assert!(
            matches!(refused, Err(EngineError::DeadlineExceeded { late_ms }) if late_ms >= 5),
            "{refused:?}"
        );
        let later = Instant::now() + Duration::from_secs(60);
        assert!(within(Some(later), async { check() }).await.is_ok());
        assert_eq!(within(Some(later), async { current() }).await, Some(later));
    }
}
