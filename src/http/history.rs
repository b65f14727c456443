//! The transitions remembered for the dashboard's timeline.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast::error::RecvError;

use super::json::TransitionJson;
use crate::engine::Core;

/// Transitions remembered for the timeline.
pub const HISTORY: usize = 200;

/// The last [`HISTORY`] transitions, kept by a task that watches the engine.
#[derive(Debug, Default)]
pub struct History {
    recent: Mutex<VecDeque<TransitionJson>>,
}

impl History {
    /// Remembers transitions from now until the engine stops.
    pub fn record(core: Arc<Core>) -> Arc<History> {
        let history = Arc::new(History::default());
        let mut events = core.subscribe();
        let stopped = core.stopped();
        let keep = history.clone();
        tokio::spawn(async move {
            let record = async {
                loop {
                    match events.recv().await {
                        Ok(e) => keep.push(TransitionJson::of(&core, &e)),
                        // Missed ones stay missing: the timeline is a view,
                        // not a record (the log is the record).
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => return,
                    }
                }
            };
            tokio::select! {
                () = record => {}
                () = stopped => {}
            }
        });
        history
    }

    fn push(&self, t: TransitionJson) {
        let mut recent = self.recent.lock().expect("history lock");
        if recent.len() == HISTORY {
            recent.pop_front();
        }
        recent.push_back(t);
    }

    /// The remembered transitions of keys that start with `prefix`, oldest first.
    pub fn matching(&self, prefix: &str) -> Vec<TransitionJson> {
        let recent = self.recent.lock().expect("history lock");
        recent
            .iter()
            .filter(|t| t.key.starts_with(prefix))
            .cloned()
            .collect()
    }
}
