//! An exhaustive check of the consecutive breaker (SPEC B1, B3) against an
//! independent reference written another way.
//!
//! The reference keeps no phase: it keeps the history of what happened (the
//! outcomes the breaker accepted, the probes it admitted and the break
//! intervals `[start, end)`) and derives every answer from that history.
//! It shares no code with fusebox; the phase it derives is a string, only
//! for comparison with what the core shows.
//!
//! Every trace: consecutive mode with `failures` in {1, 2, 3} and `break` in
//! {2, 5} ms, no limiter, default lease (30 s) and `probe_lease` (= `break`);
//! at each of the times 0, 1, 3, 5, 8, 13 one acquire and, when it gave a
//! ticket, a complete of that ticket at the same instant with the trace's
//! outcome for that time (success or failure): 3 * 2 * 2^6 = 384 traces,
//! compared step by step.

use fusebox::domain::policy::BreakerSpec;
use fusebox::domain::{Ask, DurationSpec, Fuse, Outcome, PolicySpec, TicketId};

use crate::vectors::{answer_of, Answer};

const THRESHOLDS: [u32; 3] = [1, 2, 3];
const BREAKS: [u64; 2] = [2, 5];
const TIMES: [u64; 6] = [0, 1, 3, 5, 8, 13];
/// The default lease (Y3): far longer than any trace, so no lease ends.
const LEASE: u64 = 30_000;

/// An admitted answer (`GRANTED` or `PROBE`), as the vectors write it;
/// the core's decisions are written alike by [`answer_of`], to compare.
fn admitted(decision: &str) -> Answer {
    Answer {
        decision: decision.to_owned(),
        reason: None,
        retry_after: None,
        ticket: true,
        shadow_decision: None,
        shadow_reason: None,
    }
}

/// A `BLOCKED` answer, as the vectors write it.
fn blocked(reason: &str, retry_after: u64) -> Answer {
    Answer {
        decision: "BLOCKED".to_owned(),
        reason: Some(reason.to_owned()),
        retry_after: Some(retry_after),
        ticket: false,
        shadow_decision: None,
        shadow_reason: None,
    }
}

/// What a read shows: phase, run length and deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reading {
    phase: &'static str,
    run: u32,
    deadline: Option<u64>,
}

/// An outcome the breaker accepted (it was not stale), in history order.
struct Accepted {
    /// When in the history it was recorded.
    seq: u64,
    /// The ticket it was for (the ticket's issue number).
    ticket: u64,
    probe: bool,
    success: bool,
}

/// A break: requests are kept out of `[start, end)`.
struct Interval {
    /// When in the history it began.
    seq: u64,
    start: u64,
    end: u64,
}

/// A probe admitted at `at`; `seq` is also its ticket.
struct Probe {
    seq: u64,
    at: u64,
}

/// A ticket handed out by the reference.
#[derive(Clone, Copy)]
struct RefTicket {
    seq: u64,
    probe: bool,
}

/// The breaker, as a history.
struct Reference {
    threshold: u32,
    break_ms: u64,
    probe_lease: u64,
    seq: u64,
    accepted: Vec<Accepted>,
    breaks: Vec<Interval>,
    probes: Vec<Probe>,
}

impl Reference {
    fn new(threshold: u32, break_ms: u64) -> Self {
        Reference {
            threshold,
            break_ms,
            probe_lease: break_ms,
            seq: 0,
            accepted: Vec::new(),
            breaks: Vec::new(),
            probes: Vec::new(),
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The break in force: the last interval, unless a successful probe
    /// came after it began.
    fn broken(&self) -> Option<&Interval> {
        let last = self.breaks.last()?;
        let recovered = self
            .accepted
            .iter()
            .any(|a| a.probe && a.success && a.seq > last.seq);
        (!recovered).then_some(last)
    }

    /// Failures in a row: accepted failures since the last accepted success
    /// (a closed-period success or a recovery).
    fn run(&self) -> u32 {
        let n = self
            .accepted
            .iter()
            .rev()
            .take_while(|a| !a.success)
            .count();
        u32::try_from(n).expect("a short history")
    }

    /// The last probe admitted during the break `brk`.
    fn probe_during(&self, brk: &Interval) -> Option<&Probe> {
        self.probes.iter().rev().find(|p| p.seq > brk.seq)
    }

    /// When the probe `p` stops holding the slot, if it still holds it at
    /// `now`: until its outcome, `probe_lease` or its ticket's lease.
    fn slot_held(&self, p: &Probe, now: u64) -> Option<u64> {
        let answered = self.accepted.iter().any(|a| a.ticket == p.seq);
        let until = p.at + self.probe_lease.min(LEASE);
        (!answered && now < until).then_some(until)
    }

    fn reading(&self) -> Reading {
        let run = self.run();
        match self.broken() {
            None => Reading {
                phase: "CLOSED",
                run,
                deadline: None,
            },
            Some(brk) if self.probe_during(brk).is_some() => Reading {
                phase: "HALF_OPEN",
                run,
                deadline: None,
            },
            Some(brk) => Reading {
                phase: "OPEN",
                run,
                deadline: Some(brk.end),
            },
        }
    }

    fn acquire(&mut self, now: u64) -> (Answer, Option<RefTicket>) {
        let seq = self.next_seq();
        let probe = match self.broken() {
            None => false,
            Some(brk) => match self.probe_during(brk) {
                Some(p) => match self.slot_held(p, now) {
                    Some(until) => return (blocked("probe_in_flight", until - now), None),
                    None => true,
                },
                None if (brk.start..brk.end).contains(&now) => {
                    return (blocked("open", brk.end - now), None)
                }
                None => true,
            },
        };
        if probe {
            self.probes.push(Probe { seq, at: now });
            (admitted("PROBE"), Some(RefTicket { seq, probe }))
        } else {
            (admitted("GRANTED"), Some(RefTicket { seq, probe }))
        }
    }

    /// Records `ticket`'s outcome at `now`; answers whether it was stale.
    fn complete(&mut self, ticket: RefTicket, success: bool, now: u64) -> bool {
        let seq = self.next_seq();
        let current = if ticket.probe {
            // The latest probe of the break still in force, not yet answered.
            self.broken()
                .and_then(|brk| self.probe_during(brk))
                .is_some_and(|p| p.seq == ticket.seq)
                && !self.accepted.iter().any(|a| a.ticket == ticket.seq)
        } else {
            // Issued while closed, and no break began since.
            !self.breaks.iter().any(|b| b.seq > ticket.seq)
        };
        if !current {
            return true;
        }
        self.accepted.push(Accepted {
            seq,
            ticket: ticket.seq,
            probe: ticket.probe,
            success,
        });
        if !success && (ticket.probe || self.run() >= self.threshold) {
            self.breaks.push(Interval {
                seq,
                start: now,
                end: now + self.break_ms,
            });
        }
        false
    }
}

fn reading_of(fuse: &Fuse, now: u64) -> Reading {
    let v = fuse.view(now);
    Reading {
        phase: v.phase.as_str(),
        run: v.consecutive_failures,
        deadline: v.open_until,
    }
}

fn policy(threshold: u32, break_ms: u64) -> fusebox::domain::Policy {
    PolicySpec {
        breaker: Some(BreakerSpec {
            mode: "consecutive".into(),
            failures: Some(threshold),
            break_: Some(DurationSpec(break_ms)),
            ..BreakerSpec::default()
        }),
        ..PolicySpec::default()
    }
    .validate()
    .expect("a valid policy")
}

/// Decisions seen, by kind: GRANTED, PROBE, BLOCKED.
#[derive(Default)]
struct Seen {
    granted: usize,
    probe: usize,
    blocked: usize,
}

/// Runs one trace; the first disagreement, described, if any.
fn run_trace(
    threshold: u32,
    break_ms: u64,
    outcomes: &[bool; 6],
    seen: &mut Seen,
) -> Result<(), String> {
    let mut fuse = Fuse::new(policy(threshold, break_ms), 0);
    let mut reference = Reference::new(threshold, break_ms);
    for (i, (&now, &success)) in TIMES.iter().zip(outcomes).enumerate() {
        let id = TicketId(i as u128 + 1);
        let decision = fuse
            .acquire(&Ask::default(), id, now)
            .map_err(|e| format!("step {i} (t={now}) acquire: error {e}"))?;
        let got = answer_of(&decision);
        let (want, ticket) = reference.acquire(now);
        match want.decision.as_str() {
            "GRANTED" => seen.granted += 1,
            "PROBE" => seen.probe += 1,
            _ => seen.blocked += 1,
        }
        if got != want {
            return Err(format!(
                "step {i} (t={now}) acquire: decision: reference {want:?}, core {got:?}"
            ));
        }
        let (got, want) = (reading_of(&fuse, now), reference.reading());
        if got != want {
            return Err(format!(
                "step {i} (t={now}) after acquire: reference {want:?}, core {got:?}"
            ));
        }
        let Some(ticket) = ticket else { continue };
        let outcome = if success {
            Outcome::Success
        } else {
            Outcome::Failure
        };
        let done = fuse.complete(id, outcome, now).map_err(|e| {
            format!(
                "step {i} (t={now}) complete {}: error {e}",
                outcome.as_str()
            )
        })?;
        let stale = reference.complete(ticket, success, now);
        let want = reference.reading();
        if done.stale != stale || done.phase.as_str() != want.phase {
            return Err(format!(
                "step {i} (t={now}) complete {}: reply: reference stale {stale} phase {}, \
                 core stale {} phase {}",
                outcome.as_str(),
                want.phase,
                done.stale,
                done.phase
            ));
        }
        let got = reading_of(&fuse, now);
        if got != want {
            return Err(format!(
                "step {i} (t={now}) after complete {}: reference {want:?}, core {got:?}",
                outcome.as_str()
            ));
        }
    }
    Ok(())
}

#[test]
fn every_short_consecutive_trace_agrees_with_a_history_reference() {
    let mut traces = 0;
    let mut seen = Seen::default();
    let mut report = Vec::new();
    for threshold in THRESHOLDS {
        for break_ms in BREAKS {
            for mask in 0u32..64 {
                let outcomes: [bool; 6] = std::array::from_fn(|i| mask & (1 << i) != 0);
                traces += 1;
                if let Err(step) = run_trace(threshold, break_ms, &outcomes, &mut seen) {
                    let named: Vec<&str> = outcomes
                        .iter()
                        .map(|&s| if s { "SUCCESS" } else { "FAILURE" })
                        .collect();
                    report.push(format!(
                        "failures={threshold} break={break_ms}ms outcomes at {TIMES:?} = \
                         {named:?}: {step}"
                    ));
                }
            }
        }
    }
    println!(
        "{traces} traces: {} granted, {} probes, {} blocked",
        seen.granted, seen.probe, seen.blocked
    );
    assert_eq!(traces, 384, "the generator makes every trace once");
    assert!(
        report.is_empty(),
        "{} of {traces} traces disagree with the reference; first ones:\n{}",
        report.len(),
        report
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        seen.granted > 0 && seen.probe > 0 && seen.blocked > 0,
        "every decision kind is reached (granted {}, probe {}, blocked {})",
        seen.granted,
        seen.probe,
        seen.blocked
    );
}
