//! The circuit breaker of SPEC section 1: four phases, two trip modes,
//! backoff, the probe slots and epochs, with the bounded half-open of
//! section 10 (H1-H4).
//!
//! A half-open period follows one of two rules, fixed when it begins (H3,
//! H4). With one probe slot (`half_open.probes = 1`, the default) it is
//! section 1's: one deadline is the slot, and every admission starts an
//! epoch, so a probe whose slot lapsed stays current until the next probe
//! is admitted. With more slots, the probes of the period share its epoch,
//! each holds a slot of its own ([`Probing::slots`]), and a probe is current
//! only while it holds its slot. Either way, `half_open.successes` current
//! probe successes close the breaker.
//!
//! The breaker knows nothing of permits or tickets' identities: the combined
//! decision ([`Fuse`](crate::Fuse)) asks [`Breaker::admission`] first, which
//! changes nothing, and only commits a probe with [`Breaker::begin_probe`]
//! once the limiter has granted it (C2).

use crate::decision::Decision;
use crate::health::HealthWindow;
use crate::policy::{millionths, BreakerPolicy, Trip};
use crate::quorum::{CallerId, Callers};
use crate::ticket::TicketId;
use crate::{Millis, Outcome, Phase, Reason};

/// What the breaker would do with a request at `now`; computing it changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Closed: admitted as an ordinary request.
    Normal,
    /// Open past its deadline, or half-open with a free slot: admitted as the probe.
    Probe,
    /// Not now: open before its deadline, or the probe slot is held.
    Blocked {
        /// `Open` or `ProbeInFlight`.
        reason: Reason,
        /// Time until the deadline or the slot's end, in ms.
        retry_after: Millis,
    },
    /// Isolated by an operator.
    Refused,
}

impl Admission {
    /// The breaker's own answer when it does not admit (blocked or
    /// refused); `None` when it admits.
    pub fn refusal(self) -> Option<Decision> {
        match self {
            Admission::Blocked {
                reason,
                retry_after,
            } => Some(Decision::Blocked {
                reason,
                retry_after,
            }),
            Admission::Refused => Some(Decision::Refused),
            Admission::Normal | Admission::Probe => None,
        }
    }
}

/// What recording an outcome did (SPEC B3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The ticket was not of the current epoch: nothing moved.
    pub stale: bool,
    /// The phase change the outcome caused, if any: `(from, to)`.
    pub change: Option<(Phase, Phase)>,
    /// The outcome was a current probe's (its phase change, if any, is the
    /// probe's success or failure, not a trip).
    pub probe: bool,
    /// The outcome was recorded as slow (S1): a current closed-period
    /// ticket's or a current probe's, at least `slow.duration` old.
    pub slow: bool,
    /// The trip came from slow calls alone (S3 (b) without (a)).
    pub slow_trip: bool,
}

/// A ticket's outcome, as the breaker records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report<'a> {
    /// The ticket.
    pub ticket: TicketId,
    /// The epoch it was issued in.
    pub epoch: u64,
    /// It is the probe of a single-slot period (a probe of a period of
    /// several is known by its slot).
    pub probe: bool,
    /// How the call went.
    pub outcome: Outcome,
    /// The outcome is the settlement of its lease end (L3), which comes
    /// before a slot ending at the same instant (H3).
    pub at_lease_end: bool,
    /// Who acquired the ticket (Q1).
    pub caller: CallerId,
    /// The ticket's age is at least the policy's `slow.duration` (S1).
    pub slow: bool,
    /// Live slow tickets besides this one (S2), for S3's condition (b).
    pub live_slow: u32,
    /// Under a quorum, the callers of those live slow tickets, each with
    /// how many it holds (Q2 for S3 (b)).
    pub live_callers: &'a [(CallerId, u32)],
}

#[cfg(test)]
impl Report<'static> {
    /// A completion of an ordinary ticket or a single-slot probe.
    pub fn of(epoch: u64, probe: bool, outcome: Outcome) -> Report<'static> {
        Report {
            ticket: TicketId(0),
            epoch,
            probe,
            outcome,
            at_lease_end: false,
            caller: CallerId::default(),
            slow: false,
            live_slow: 0,
            live_callers: &[],
        }
    }
}

/// What a half-open period keeps beyond section 1's single slot: made
/// only when the policy asks for more than one probe slot or more than one
/// success, and dropped when the period ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probing {
    /// Current probe successes counted in this period (H2).
    pub successes: u32,
    /// The period follows the rule of several slots (H3): its probes share
    /// its epoch and each is current only while it holds its slot.
    pub shared: bool,
    /// Under that rule, the slots: each probe's ticket and the end of its
    /// slot, in admission order. A slot past its end is held no more; it
    /// is dropped at the next admission or outcome.
    pub slots: Vec<(TicketId, Millis)>,
}

impl Probing {
    /// The ends of the slots still held at `now`.
    fn held(&self, now: Millis) -> impl Iterator<Item = Millis> + '_ {
        self.slots.iter().map(|s| s.1).filter(move |&end| end > now)
    }
}

/// One key's breaker.
#[derive(Clone, Debug, PartialEq)]
pub struct Breaker {
    pub(crate) epoch: u64,
    /// One deadline serves both timed phases: when open, the end of the
    /// break; when half-open, the end of the probe slot, 0 when the slot is
    /// free (a slot that ended and a free one admit alike). 0 otherwise.
    pub(crate) deadline: Millis,
    pub(crate) changed_at: Millis,
    /// Failures in a row, in every trip mode.
    pub(crate) run: u32,
    /// Probes admitted since the breaker last closed.
    pub(crate) attempts: u32,
    /// Openings since the last recovery: the k of the backoff rule.
    pub(crate) openings: u32,
    pub(crate) phase: Phase,
    pub(crate) window: HealthWindow,
    /// What the breaker keeps only while it needs it; one word inline for
    /// the many keys that need none of it.
    pub(crate) extra: Option<Box<Extra>>,
}

/// A breaker's rarer parts, boxed together.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Extra {
    /// The half-open period's successes and slots, when it needs them.
    probing: Option<Probing>,
    /// Under a quorum (Q2), the callers of the run's and the window's
    /// failures; made at the first failure recorded under a quorum.
    callers: Option<Callers>,
}

impl Breaker {
    /// A closed breaker, made at `now`.
    pub fn new(now: Millis) -> Self {
        Breaker {
            phase: Phase::Closed,
            epoch: 0,
            run: 0,
            attempts: 0,
            openings: 0,
            deadline: 0,
            window: HealthWindow::default(),
            changed_at: now,
            extra: None,
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The current epoch: it changes at every phase change and probe admission.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Failures in a row.
    pub fn consecutive_failures(&self) -> u32 {
        self.run
    }

    /// Probes admitted since the breaker last closed.
    pub fn half_open_attempts(&self) -> u32 {
        self.attempts
    }

    /// Current probe successes counted in this half-open period (H2).
    pub fn half_open_successes(&self) -> u32 {
        self.probing().map_or(0, |p| p.successes)
    }

    /// Probe slots held at `now` (H1).
    pub fn probes_held(&self, now: Millis) -> u32 {
        if self.phase != Phase::HalfOpen {
            return 0;
        }
        match self.probing() {
            Some(p) if p.shared => p.held(now).count() as u32,
            _ => u32::from(self.deadline > now),
        }
    }

    /// True while the half-open period follows the rule of several slots.
    pub fn shares_probe_epoch(&self) -> bool {
        self.phase == Phase::HalfOpen && self.probing().is_some_and(|p| p.shared)
    }

    /// What the half-open period keeps beyond the single slot, if anything.
    pub fn probing(&self) -> Option<&Probing> {
        self.extra.as_ref()?.probing.as_ref()
    }

    fn probing_mut(&mut self) -> Option<&mut Probing> {
        self.extra.as_mut()?.probing.as_mut()
    }

    fn probing_or_default(&mut self) -> &mut Probing {
        self.extra
            .get_or_insert_with(Box::default)
            .probing
            .get_or_insert_with(Probing::default)
    }

    /// Sets the half-open period's probing part; the box goes with its
    /// last part.
    pub(crate) fn set_probing(&mut self, probing: Option<Probing>) {
        if probing.is_some() || self.extra.is_some() {
            self.extra.get_or_insert_with(Box::default).probing = probing;
            self.drop_empty_extra();
        }
    }

    fn callers_mut(&mut self) -> Option<&mut Callers> {
        self.extra.as_mut()?.callers.as_mut()
    }

    fn callers_or_default(&mut self) -> &mut Callers {
        self.extra
            .get_or_insert_with(Box::default)
            .callers
            .get_or_insert_with(Callers::default)
    }

    /// Sets the callers recorded under a quorum; the box goes with its
    /// last part.
    pub(crate) fn set_callers(&mut self, callers: Option<Callers>) {
        if callers.is_some() || self.extra.is_some() {
            self.extra.get_or_insert_with(Box::default).callers = callers;
            self.drop_empty_extra();
        }
    }

    fn drop_empty_extra(&mut self) {
        if self
            .extra
            .as_ref()
            .is_some_and(|e| e.probing.is_none() && e.callers.is_none())
        {
            self.extra = None;
        }
    }

    /// The end of the break, when open.
    pub fn open_until(&self) -> Option<Millis> {
        (self.phase == Phase::Open).then_some(self.deadline)
    }

    /// True when the sampling window holds an allocation (ratio mode, with
    /// outcomes recorded).
    pub fn window_allocated(&self) -> bool {
        self.window.is_allocated()
    }

    /// When the phase last changed.
    pub fn changed_at(&self) -> Millis {
        self.changed_at
    }

    /// The share of failures in the sampling window at `now` (ratio mode), or
    /// `None` when the policy has no ratio or the window is empty.
    pub fn failure_ratio(&self, policy: Option<&BreakerPolicy>, now: Millis) -> Option<f64> {
        match policy?.trip {
            Trip::Ratio {
                sampling_window, ..
            } => {
                let (n, f) = self.window.totals(now, sampling_window);
                (n > 0).then(|| f as f64 / n as f64)
            }
            Trip::Consecutive { .. } => None,
        }
    }

    /// True when nothing is recorded that a fresh breaker would not have (K2).
    pub fn is_at_rest(&self, policy: Option<&BreakerPolicy>, now: Millis) -> bool {
        let window_empty = match policy.map(|p| p.trip) {
            Some(Trip::Ratio {
                sampling_window, ..
            }) => self.window.is_empty_at(now, sampling_window),
            _ => true,
        };
        self.phase == Phase::Closed && self.run == 0 && self.attempts == 0 && window_empty
    }

    /// What the breaker would do with a request at `now` (B1, H1), under
    /// `policy` (its `half_open.probes` bounds the slots of a period that
    /// follows the rule of several). Changes nothing.
    pub fn admission(&self, policy: Option<&BreakerPolicy>, now: Millis) -> Admission {
        let limit = policy.map_or(1, |b| b.half_open.probes.get());
        if let Some(p) = self.probing().filter(|p| p.shared) {
            if self.phase == Phase::HalfOpen {
                return match p.held(now).min() {
                    Some(first) if p.held(now).count() as u64 >= u64::from(limit) => {
                        Admission::Blocked {
                            reason: Reason::ProbeInFlight,
                            retry_after: first - now,
                        }
                    }
                    _ => Admission::Probe,
                };
            }
        }
        match self.phase {
            Phase::Closed => Admission::Normal,
            Phase::Isolated => Admission::Refused,
            Phase::Open if now >= self.deadline => Admission::Probe,
            Phase::Open => Admission::Blocked {
                reason: Reason::Open,
                retry_after: self.deadline - now,
            },
            // A single-slot period whose policy now allows more slots
            // admits: each admission starts an epoch (H3, H4).
            Phase::HalfOpen if now < self.deadline && limit <= 1 => Admission::Blocked {
                reason: Reason::ProbeInFlight,
                retry_after: self.deadline - now,
            },
            Phase::HalfOpen => Admission::Probe,
        }
    }

    /// Commits the probe `ticket` admitted at `now`, whose slot is held
    /// until `slot_until` at the latest. Returns the phase change when the
    /// breaker moves from `OPEN` to `HALF_OPEN`; the period that begins
    /// follows the rule of several slots when `policy` asks for more than
    /// one (H3).
    pub fn begin_probe(
        &mut self,
        policy: Option<&BreakerPolicy>,
        ticket: TicketId,
        now: Millis,
        slot_until: Millis,
    ) -> Option<(Phase, Phase)> {
        debug_assert_eq!(self.admission(policy, now), Admission::Probe);
        let change = (self.phase != Phase::HalfOpen).then(|| {
            let change = self.enter(Phase::HalfOpen, now);
            if policy.is_some_and(|b| b.half_open.probes.get() > 1) {
                self.set_probing(Some(Probing {
                    shared: true,
                    ..Probing::default()
                }));
            }
            change
        });
        self.attempts = self.attempts.saturating_add(1);
        match self.probing_mut().filter(|p| p.shared) {
            Some(p) => {
                p.slots.retain(|s| s.1 > now);
                p.slots.push((ticket, slot_until));
            }
            None => {
                self.epoch += 1;
                self.deadline = slot_until;
            }
        }
        change
    }

    /// `ticket`'s lease was moved to end at `lease_end` (Renew): a probe
    /// holds its slot no longer than its ticket's own lease (B1, H1), so
    /// its slot ends then if that is earlier. `current_probe`: under a
    /// single slot, the ticket is the current probe. A later lease end
    /// does not lengthen the slot ("Renew extends the ticket, not the
    /// slot").
    pub fn lease_moved(&mut self, ticket: TicketId, current_probe: bool, lease_end: Millis) {
        if self.phase != Phase::HalfOpen {
            return;
        }
        if let Some(p) = self.probing_mut().filter(|p| p.shared) {
            if let Some(slot) = p.slots.iter_mut().find(|s| s.0 == ticket) {
                slot.1 = slot.1.min(lease_end);
            }
        } else if current_probe && self.deadline > lease_end {
            self.deadline = lease_end;
        }
    }

    /// Takes `ticket`'s slot out of a period of several slots; `Some(held)`
    /// when it had one, `held` telling whether it still held it at `now`. A
    /// lease end (`at_lease_end`) is settled before a slot ending at the
    /// same instant counts as ended (H3).
    fn take_slot(&mut self, ticket: TicketId, now: Millis, at_lease_end: bool) -> Option<bool> {
        if self.phase != Phase::HalfOpen {
            return None;
        }
        let p = self.probing_mut().filter(|p| p.shared)?;
        let i = p.slots.iter().position(|s| s.0 == ticket)?;
        let (_, end) = p.slots.remove(i);
        Some(end > now || (at_lease_end && end == now))
    }

    /// Records a ticket's outcome at `now` (B3, B4, H2).
    pub fn record(
        &mut self,
        policy: Option<&BreakerPolicy>,
        r: Report<'_>,
        now: Millis,
    ) -> Recorded {
        let Report {
            ticket,
            epoch: ticket_epoch,
            probe,
            outcome,
            at_lease_end,
            caller,
            slow,
            live_slow,
            live_callers,
        } = r;
        let current = ticket_epoch == self.epoch;
        let stale = Recorded {
            stale: true,
            change: None,
            probe: false,
            slow: false,
            slow_trip: false,
        };
        // Only a policy with slow calls marks anything slow (S1).
        let slow = slow && policy.is_some_and(|b| b.slow.is_some());
        if let Some(held) = self.take_slot(ticket, now, at_lease_end) {
            return if held && current {
                self.probe_outcome(policy, outcome, slow, now)
            } else {
                stale
            };
        }
        match (self.phase, probe) {
            (Phase::Closed, false) if current => {
                let Some(policy) = policy else {
                    return Recorded {
                        stale: false,
                        change: None,
                        probe: false,
                        slow: false,
                        slow_trip: false,
                    };
                };
                let slow = slow && outcome != Outcome::Ignored;
                let (change, slow_trip) = self.record_closed(
                    policy,
                    outcome,
                    caller,
                    (slow, live_slow, live_callers),
                    now,
                );
                Recorded {
                    stale: false,
                    change,
                    probe: false,
                    slow,
                    slow_trip,
                }
            }
            (Phase::HalfOpen, true) if current => self.probe_outcome(policy, outcome, slow, now),
            _ => stale,
        }
    }

    /// S3 at an instant when tickets became live slow: `live_slow` is the
    /// count of live slow tickets now. Trips as at an outcome, from `now`;
    /// returns the change and whether it came from slow calls alone.
    pub fn evaluate_slow(
        &mut self,
        policy: Option<&BreakerPolicy>,
        live_slow: u32,
        live_callers: &[(CallerId, u32)],
        now: Millis,
    ) -> Option<((Phase, Phase), bool)> {
        let policy = policy?;
        if self.phase != Phase::Closed {
            return None;
        }
        let (failures, slow) = self.trip_condition(policy, live_slow, live_callers, now);
        self.drop_empty_callers();
        (failures || slow).then(|| (self.open(policy, now), !failures))
    }

    /// S3: `((a), (b))` at `now`, with `live_slow` live slow tickets.
    fn trip_condition(
        &mut self,
        policy: &BreakerPolicy,
        live_slow: u32,
        live_callers: &[(CallerId, u32)],
        now: Millis,
    ) -> (bool, bool) {
        let Trip::Ratio {
            failure_ratio,
            minimum_throughput,
            sampling_window,
        } = policy.trip
        else {
            return (false, false);
        };
        self.window.prune(now, sampling_window);
        if let Some(c) = self.callers_mut() {
            c.prune(now, sampling_window);
        }
        let (n, f) = self.window.totals(now, sampling_window);
        let min = u64::from(minimum_throughput.get());
        // Section 10, "Ratios": f / n >= r in integers, r to 6 decimals.
        let failures = n >= min
            && u128::from(f) * 1_000_000 >= u128::from(millionths(failure_ratio)) * u128::from(n)
            && self.quorum_met(policy, now);
        let slow = policy.slow.is_some_and(|s| {
            let live = u64::from(live_slow);
            let all = n + live;
            all >= min && s.reached(self.window.slow_total(now, sampling_window) + live, all)
        }) && self.slow_quorum_met(policy, live_callers, now);
        (failures, slow)
    }

    /// Live slow calls and slow outcomes in the window at `now`, and the
    /// share they make of `n` (S3 (b)), when the policy has slow calls.
    pub fn slow_ratio(
        &self,
        policy: Option<&BreakerPolicy>,
        live_slow: u32,
        now: Millis,
    ) -> Option<f64> {
        let policy = policy?;
        policy.slow?;
        let Trip::Ratio {
            sampling_window, ..
        } = policy.trip
        else {
            return None;
        };
        let (n, _) = self.window.totals(now, sampling_window);
        let live = u64::from(live_slow);
        let slow = self.window.slow_total(now, sampling_window) + live;
        (n + live > 0).then(|| slow as f64 / (n + live) as f64)
    }

    /// A current probe's outcome (B3, H2): a success counts toward
    /// `half_open.successes` and closes the breaker at the last one, else
    /// frees its slot; a failure opens the breaker again; `IGNORED` frees
    /// the slot. (A probe of a period of several slots gave its slot up
    /// already.)
    fn probe_outcome(
        &mut self,
        policy: Option<&BreakerPolicy>,
        outcome: Outcome,
        slow: bool,
        now: Millis,
    ) -> Recorded {
        // A slow probe success is that probe's failure (S1).
        let outcome = match outcome {
            Outcome::Success if slow => Outcome::Failure,
            other => other,
        };
        let slow = slow && outcome != Outcome::Ignored;
        let change = match outcome {
            Outcome::Success => {
                let needed = policy.map_or(1, |b| b.half_open.successes.get());
                let successes = self.half_open_successes().saturating_add(1);
                if successes >= needed {
                    Some(self.close(now))
                } else {
                    self.probing_or_default().successes = successes;
                    self.deadline = 0;
                    None
                }
            }
            Outcome::Failure => {
                self.run = self.run.saturating_add(1);
                Some(match policy {
                    Some(policy) => self.open(policy, now),
                    None => self.close(now),
                })
            }
            Outcome::Ignored => {
                self.deadline = 0;
                None
            }
        };
        Recorded {
            stale: false,
            change,
            probe: true,
            slow,
            slow_trip: false,
        }
    }

    /// A current closed-period outcome (section 1, S1, S3): returns the
    /// trip, if any, and whether it came from slow calls alone.
    fn record_closed(
        &mut self,
        policy: &BreakerPolicy,
        outcome: Outcome,
        caller: CallerId,
        (slow, live_slow, live_callers): (bool, u32, &[(CallerId, u32)]),
        now: Millis,
    ) -> (Option<(Phase, Phase)>, bool) {
        let failed = match outcome {
            Outcome::Ignored => return (None, false),
            Outcome::Failure => true,
            Outcome::Success => false,
        };
        self.run = if failed {
            self.run.saturating_add(1)
        } else {
            0
        };
        let (failures, slow_calls) = match policy.trip {
            Trip::Consecutive { failures } => {
                if policy.quorum.is_some() {
                    self.note_run(failed, caller);
                }
                (
                    self.run >= failures.get() && self.quorum_met(policy, now),
                    false,
                )
            }
            Trip::Ratio {
                sampling_window, ..
            } => {
                self.window.record(now, sampling_window, failed, slow);
                if policy.quorum.is_some() {
                    let callers = self.callers_or_default();
                    callers.prune(now, sampling_window);
                    let bucket = HealthWindow::bucket_of(now, sampling_window);
                    if failed {
                        callers.fail_in_window(caller, bucket);
                    }
                    if slow {
                        callers.slow_in_window(caller, bucket);
                    }
                }
                self.trip_condition(policy, live_slow, live_callers, now)
            }
        };
        self.drop_empty_callers();
        if failures || slow_calls {
            (Some(self.open(policy, now)), !failures)
        } else {
            (None, false)
        }
    }

    /// Keeps the run's callers in step with the run (Q2): a failure adds
    /// its caller, a success clears them with the run.
    fn note_run(&mut self, failed: bool, caller: CallerId) {
        if failed {
            self.callers_or_default().fail_in_run(caller);
        } else if let Some(c) = self.callers_mut() {
            c.run.clear();
        }
    }

    fn drop_empty_callers(&mut self) {
        if self.callers().is_some_and(|c| c.is_empty()) {
            self.set_callers(None);
        }
    }

    /// True when the failures that would trip the breaker come from at
    /// least the policy's quorum of distinct callers (Q2), or the policy
    /// has none.
    fn quorum_met(&self, policy: &BreakerPolicy, now: Millis) -> bool {
        let Some(k) = policy.quorum else {
            return true;
        };
        u64::from(self.distinct_callers(Some(policy), now)) >= u64::from(k.get())
    }

    /// True when the slow outcomes in the window and the live slow tickets
    /// come from at least the policy's quorum of distinct callers (Q2 for
    /// S3 (b)), or the policy has none.
    fn slow_quorum_met(
        &self,
        policy: &BreakerPolicy,
        live_callers: &[(CallerId, u32)],
        now: Millis,
    ) -> bool {
        let (
            Some(k),
            Trip::Ratio {
                sampling_window, ..
            },
        ) = (policy.quorum, policy.trip)
        else {
            return true;
        };
        let recorded = self.callers().map_or(&[][..], |c| &c.slow[..]);
        let mut callers: Vec<CallerId> = recorded
            .iter()
            .filter(|&&(_, start)| start + sampling_window > now)
            .map(|&(c, _)| c)
            .chain(live_callers.iter().filter(|l| l.1 > 0).map(|&(c, _)| c))
            .collect();
        callers.sort_unstable();
        callers.dedup();
        callers.len() as u64 >= u64::from(k.get())
    }

    /// Distinct callers of the failures that count toward a trip at `now`
    /// (Q2): the run's in consecutive mode, the window's in ratio mode.
    pub fn distinct_callers(&self, policy: Option<&BreakerPolicy>, now: Millis) -> u32 {
        let Some(c) = self.callers() else {
            return 0;
        };
        match policy.map(|p| p.trip) {
            Some(Trip::Ratio {
                sampling_window, ..
            }) => c.in_window(now, sampling_window),
            _ => c.run.len() as u32,
        }
    }

    /// The callers recorded under a quorum, if any.
    pub fn callers(&self) -> Option<&Callers> {
        self.extra.as_ref()?.callers.as_ref()
    }

    /// Opens the breaker at `now` for the next break of the backoff rule.
    fn open(&mut self, policy: &BreakerPolicy, now: Millis) -> (Phase, Phase) {
        self.openings = self.openings.saturating_add(1);
        self.window.clear();
        if let Some(c) = self.callers_mut() {
            c.window.clear();
            c.slow.clear();
        }
        self.drop_empty_callers();
        let change = self.enter(Phase::Open, now);
        self.deadline = now.saturating_add(policy.break_length(self.openings));
        change
    }

    /// Closes the breaker, clearing counts, attempts, deadline and backoff.
    fn close(&mut self, now: Millis) -> (Phase, Phase) {
        self.run = 0;
        self.attempts = 0;
        self.openings = 0;
        self.window.clear();
        self.set_callers(None);
        self.enter(Phase::Closed, now)
    }

    fn enter(&mut self, phase: Phase, now: Millis) -> (Phase, Phase) {
        let from = self.phase;
        self.phase = phase;
        self.epoch += 1;
        self.deadline = 0;
        self.set_probing(None);
        if from != phase {
            self.changed_at = now;
        }
        (from, phase)
    }

    /// Puts the breaker in `ISOLATED` (B5); always starts a new epoch.
    pub fn isolate(&mut self, now: Millis) -> (Phase, Phase) {
        self.enter(Phase::Isolated, now)
    }

    /// Puts the breaker in `CLOSED` with everything cleared (B5); always
    /// starts a new epoch, so `Close` on a closed key is a reset.
    pub fn reset(&mut self, now: Millis) -> (Phase, Phase) {
        self.close(now)
    }

    /// Applies a changed policy (Y4): phase, deadline, run, epoch and the
    /// sampling window stay (old outcomes age by their own time); a key whose
    /// policy lost its breaker while open or half-open is closed, since
    /// nothing could end the break. A half-open period keeps its slots, its
    /// successes and its rule (H4): the new `half_open.probes` bounds
    /// admissions from now on, the new `successes` is compared at the next
    /// current probe success.
    pub fn adopt(&mut self, policy: Option<&BreakerPolicy>, now: Millis) -> Option<(Phase, Phase)> {
        // Callers are recorded under a quorum only; a changed quorum counts
        // those already recorded (section 10, "Policy changes").
        if policy.is_none_or(|p| p.quorum.is_none()) {
            self.set_callers(None);
        }
        match (policy, self.phase) {
            (None, Phase::Open | Phase::HalfOpen) => Some(self.close(now)),
            _ => None,
        }
    }
}

/// What of a breaker outlives a restart (see [`Breaker::durable`]): its
/// phase with the end of the break, the failure run, probe attempts,
/// the backoff step and the epoch. Times are on the engine's clock; the
/// engine turns them into wall-clock time to store them. The ratio mode's
/// sampling window is not kept: it ages out within one window anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Durable {
    /// The phase.
    pub phase: Phase,
    /// The epoch.
    pub epoch: u64,
    /// Failures in a row.
    pub run: u32,
    /// Probes admitted since the breaker last closed.
    pub attempts: u32,
    /// Openings since the last recovery (the backoff step).
    pub openings: u32,
    /// The end of the break, when open (0 otherwise).
    pub open_until: Millis,
    /// When the phase last changed.
    pub changed_at: Millis,
}

impl Durable {
    /// True when a fresh breaker would be the same: closed, no failure run,
    /// no probe attempt. Such a breaker need not be stored.
    pub fn is_at_rest(&self) -> bool {
        self.phase == Phase::Closed && self.run == 0 && self.attempts == 0 && self.openings == 0
    }
}

impl Breaker {
    /// What of this breaker is to be kept across a restart.
    pub fn durable(&self) -> Durable {
        Durable {
            phase: self.phase,
            epoch: self.epoch,
            run: self.run,
            attempts: self.attempts,
            openings: self.openings,
            open_until: self.open_until().unwrap_or(0),
            changed_at: self.changed_at,
        }
    }

    /// A breaker brought back from what [`Breaker::durable`] kept. A
    /// half-open breaker comes back with its probe slot free: the probe's
    /// ticket did not survive, so the next request becomes the one probe
    /// (B1). The epoch moves on by one, so it never repeats an epoch a
    /// ticket was issued in before the restart (B3).
    pub fn restore(kept: &Durable) -> Breaker {
        Breaker {
            phase: kept.phase,
            epoch: kept.epoch.wrapping_add(1),
            deadline: match kept.phase {
                Phase::Open => kept.open_until,
                _ => 0,
            },
            changed_at: kept.changed_at,
            run: kept.run,
            attempts: kept.attempts,
            openings: kept.openings,
            window: HealthWindow::default(),
            extra: None,
        }
    }

    /// After [`Breaker::restore`] under `policy`: a half-open period comes
    /// back with every slot free and no success counted (the probes'
    /// tickets did not survive), under the rule `policy` gives a new period.
    pub fn restart_probing(&mut self, policy: Option<&BreakerPolicy>) {
        if self.phase == Phase::HalfOpen && policy.is_some_and(|b| b.half_open.probes.get() > 1) {
            self.set_probing(Some(Probing {
                shared: true,
                ..Probing::default()
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::BreakerSpec;
    use crate::DurationSpec;

    fn consecutive(failures: u32, break_ms: u64) -> BreakerPolicy {
        BreakerSpec {
            mode: "consecutive".into(),
            failures: Some(failures),
            break_: Some(DurationSpec(break_ms)),
            ..Default::default()
        }
        .validate()
        .unwrap()
    }

    /// A new breaker after one failure at `at`.
    fn failed_at(p: &BreakerPolicy, at: Millis) -> Breaker {
        let mut b = Breaker::new(0);
        b.record(Some(p), Report::of(0, false, Outcome::Failure), at);
        b
    }

    #[test]
    fn a_blocked_request_changes_nothing() {
        let p = consecutive(1, 1000);
        let mut b = Breaker::new(0);
        let e = b.epoch();
        b.record(Some(&p), Report::of(e, false, Outcome::Failure), 10);
        let before = b.clone();
        assert_eq!(
            b.admission(None, 500),
            Admission::Blocked {
                reason: Reason::Open,
                retry_after: 510
            }
        );
        assert_eq!(b, before);
    }

    #[test]
    fn the_deadline_admits_at_equality() {
        let p = consecutive(1, 1000);
        let b = failed_at(&p, 10);
        assert!(matches!(
            b.admission(None, 1009),
            Admission::Blocked { retry_after: 1, .. }
        ));
        assert_eq!(b.admission(None, 1010), Admission::Probe);
    }

    #[test]
    fn a_probe_admission_starts_a_new_epoch_so_the_old_probe_is_stale() {
        let p = consecutive(1, 1000);
        let mut b = failed_at(&p, 0);
        b.begin_probe(None, TicketId(1000), 1000, 2000);
        let first = b.epoch();
        assert_eq!(b.admission(None, 2000), Admission::Probe);
        b.begin_probe(None, TicketId(2000), 2000, 3000);
        let r = b.record(Some(&p), Report::of(first, true, Outcome::Success), 2001);
        assert!(r.stale);
        assert_eq!(b.phase(), Phase::HalfOpen);
        assert_eq!(b.half_open_attempts(), 2);
    }

    #[test]
    fn ignored_frees_the_slot_and_counts_nothing() {
        let p = consecutive(2, 1000);
        let mut b = Breaker::new(0);
        let r = b.record(Some(&p), Report::of(0, false, Outcome::Ignored), 0);
        assert_eq!(
            r,
            Recorded {
                stale: false,
                change: None,
                probe: false,
                slow: false,
                slow_trip: false,
            }
        );
        assert_eq!(b.consecutive_failures(), 0);
        b.record(Some(&p), Report::of(0, false, Outcome::Failure), 0);
        b.record(Some(&p), Report::of(0, false, Outcome::Failure), 0);
        b.begin_probe(None, TicketId(1000), 1000, 2000);
        let e = b.epoch();
        b.record(Some(&p), Report::of(e, true, Outcome::Ignored), 1001);
        assert_eq!(b.phase(), Phase::HalfOpen);
        assert_eq!(b.admission(None, 1001), Admission::Probe);
        assert_eq!(b.consecutive_failures(), 2);
    }

    #[test]
    fn isolate_and_close_always_start_a_new_epoch() {
        let mut b = Breaker::new(0);
        let e0 = b.epoch();
        b.reset(1);
        assert_ne!(b.epoch(), e0);
        b.isolate(2);
        let e1 = b.epoch();
        b.isolate(3);
        assert_ne!(b.epoch(), e1);
        assert_eq!(b.phase(), Phase::Isolated);
        assert_eq!(b.admission(None, 4), Admission::Refused);
    }

    #[test]
    fn backoff_grows_and_is_capped_and_a_recovery_resets_it() {
        let p = BreakerSpec {
            mode: "consecutive".into(),
            failures: Some(1),
            break_: Some(DurationSpec(1000)),
            multiplier: Some(2.0),
            max_break: Some(DurationSpec(3000)),
            ..Default::default()
        }
        .validate()
        .unwrap();
        assert_eq!(
            (1..=4).map(|k| p.break_length(k)).collect::<Vec<_>>(),
            vec![1000, 2000, 3000, 3000]
        );
        let odd = BreakerSpec {
            multiplier: Some(1.5),
            max_break: None,
            ..BreakerSpec {
                mode: "consecutive".into(),
                failures: Some(1),
                break_: Some(DurationSpec(3)),
                ..Default::default()
            }
        }
        .validate()
        .unwrap();
        // 3, 4.5 -> 4, 6.75 -> 6: computed lengths are rounded down (T1).
        assert_eq!(odd.break_length(2), 4);
        assert_eq!(odd.break_length(3), 6);
        assert_eq!(odd.break_length(10_000), crate::policy::MAX_DURATION);
    }

    #[test]
    fn losing_the_breaker_in_a_policy_change_closes_an_open_key() {
        let p = consecutive(1, 1000);
        let mut b = failed_at(&p, 0);
        assert_eq!(b.adopt(None, 5), Some((Phase::Open, Phase::Closed)));
        assert_eq!(b.admission(None, 5), Admission::Normal);
    }
    #[test]
    fn a_restored_breaker_keeps_its_phase_break_run_and_backoff() {
        let p = consecutive(2, 1000);
        let mut b = failed_at(&p, 5);
        let closed = b.durable();
        assert!(!closed.is_at_rest());
        let r = Breaker::restore(&closed);
        assert_eq!(r.consecutive_failures(), 1);
        assert!(r.epoch() > b.epoch());
        b.record(Some(&p), Report::of(b.epoch(), false, Outcome::Failure), 10);
        let open = b.durable();
        assert_eq!(open.open_until, 1010);
        let r = Breaker::restore(&open);
        assert_eq!(r.phase(), Phase::Open);
        assert_eq!(r.open_until(), Some(1010));
        assert_eq!(
            r.admission(None, 500),
            Admission::Blocked {
                reason: Reason::Open,
                retry_after: 510
            }
        );
    }

    #[test]
    fn a_restored_half_open_breaker_has_its_probe_slot_free() {
        let p = consecutive(1, 1000);
        let mut b = failed_at(&p, 0);
        b.begin_probe(None, TicketId(1000), 1000, 2000);
        assert!(matches!(b.admission(None, 1500), Admission::Blocked { .. }));
        let r = Breaker::restore(&b.durable());
        assert_eq!(r.phase(), Phase::HalfOpen);
        assert_eq!(r.half_open_attempts(), 1);
        assert_eq!(r.admission(None, 1500), Admission::Probe);
    }

    #[test]
    fn a_fresh_or_reset_breaker_is_at_rest() {
        let mut b = Breaker::new(0);
        assert!(b.durable().is_at_rest());
        b.isolate(1);
        assert!(!b.durable().is_at_rest());
        b.reset(2);
        assert!(b.durable().is_at_rest());
    }
}
