//! How the timer thread is woken before its deadline.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Wakes the timer thread early: a new, earlier deadline, or shutdown.
#[derive(Debug, Default)]
pub(super) struct TimerSignal {
    woken: Mutex<bool>,
    bell: Condvar,
}

impl TimerSignal {
    pub(super) fn wake(&self) {
        *self.woken.lock().expect("timer lock") = true;
        self.bell.notify_one();
    }

    /// Sleeps until `at` (forever when `None`) or until woken.
    pub(super) fn sleep_until(&self, at: Option<Instant>) {
        let mut woken = self.woken.lock().expect("timer lock");
        while !*woken {
            match at {
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    woken = self.bell.wait_timeout(woken, left).expect("timer lock").0;
                }
                None => woken = self.bell.wait(woken).expect("timer lock"),
            }
        }
        *woken = false;
    }
}
