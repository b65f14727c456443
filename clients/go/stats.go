package fusebox

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Stats counts what a client's guards did since it was made.
type Stats struct {
	Granted      uint64 // calls run under a ticket (including probes)
	Probes       uint64 // of which half-open probes
	Blocked      uint64 // BlockedError answers from the server
	BlockedLocal uint64 // BlockedError answers from the local cache
	Refused      uint64 // RefusedError answers
	Denied       uint64 // DeniedError answers
	Unavailable  uint64 // Acquires that failed because fusebox was down or slow
	FailedOpen   uint64 // of which the call ran without a ticket
	FailedClosed uint64 // of which the call was not run (UnavailableError)
	Renewals     uint64 // leases renewed
	RenewErrors  uint64 // renewals that failed
	Completed    uint64 // outcomes fusebox accepted
	// CompleteFailures counts outcomes not reported: their send failed,
	// fusebox answered them with an error (an unknown or already completed
	// ticket), or the client was closed before they could be sent. Their
	// tickets' leases end on the server.
	CompleteFailures uint64
	// OutcomesDropped counts outcomes dropped because the outcome queue
	// was full (WithOutcomeQueue); their tickets' leases end on the server.
	OutcomesDropped uint64
}

type counters struct {
	granted, probes, blocked, blockedLocal, refused, denied      atomic.Uint64
	unavailable, failedOpen, failedClosed, renewals, renewErrors atomic.Uint64
	completed, completeFailures, outcomesDropped                 atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Granted: c.granted.Load(), Probes: c.probes.Load(), Blocked: c.blocked.Load(),
		BlockedLocal: c.blockedLocal.Load(), Refused: c.refused.Load(), Denied: c.denied.Load(),
		Unavailable: c.unavailable.Load(), FailedOpen: c.failedOpen.Load(),
		FailedClosed: c.failedClosed.Load(), Renewals: c.renewals.Load(),
		RenewErrors: c.renewErrors.Load(), Completed: c.completed.Load(),
		CompleteFailures: c.completeFailures.Load(), OutcomesDropped: c.outcomesDropped.Load(),
	}
}

// logLimiter logs each kind of trouble at most once per interval, saying
// how many were left unlogged since the last line.
type logLimiter struct {
	logger   *slog.Logger
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time
	skipped  map[string]int
}

func newLogLimiter(l *slog.Logger, interval time.Duration) *logLimiter {
	return &logLimiter{logger: l, interval: interval, last: map[string]time.Time{}, skipped: map[string]int{}}
}

func (l *logLimiter) warn(kind string, msg string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if last, ok := l.last[kind]; ok && now.Sub(last) < l.interval {
		l.skipped[kind]++
		l.mu.Unlock()
		return
	}
	skipped := l.skipped[kind]
	l.last[kind] = now
	l.skipped[kind] = 0
	l.mu.Unlock()
	if skipped > 0 {
		args = append(args, "unlogged_since_last", skipped)
	}
	l.logger.Warn(msg, args...)
}
