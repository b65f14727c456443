//! Server-side waiting (P4–P6): a queued acquire waits for its answer, and
//! is withdrawn at once if its caller goes away first.

use tokio::sync::oneshot;

use super::{token_of, Engine, EngineError, WaiterAnswer};
use crate::domain::{Outcome, TicketId};

/// Withdraws its waiter if the acquire is dropped before the answer comes
/// (the client went away or its deadline passed, P6).
pub(super) struct WaiterGuard<'a> {
    engine: &'a Engine,
    key: &'a str,
    id: TicketId,
    rx: Option<oneshot::Receiver<WaiterAnswer>>,
}

impl<'a> WaiterGuard<'a> {
    pub(super) fn new(
        engine: &'a Engine,
        key: &'a str,
        id: TicketId,
        rx: oneshot::Receiver<WaiterAnswer>,
    ) -> Self {
        WaiterGuard {
            engine,
            key,
            id,
            rx: Some(rx),
        }
    }

    /// Waits for the answer.
    pub(super) async fn wait(&mut self) -> WaiterAnswer {
        let rx = self.rx.as_mut().expect("waits once");
        let answer = rx
            .await
            .unwrap_or_else(|_| Err(EngineError::Internal("waiter dropped".into())));
        self.rx = None;
        answer
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        self.engine.withdraw(self.key, self.id);
        if let Ok(Ok((decision, _, _))) = rx.try_recv() {
            if let Some(grant) = decision.grant() {
                let _ = self
                    .engine
                    .complete(&token_of(grant.ticket), Outcome::Ignored);
            }
        }
    }
}
