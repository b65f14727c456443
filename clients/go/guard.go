package fusebox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

// Outcome is how a guarded call went, as reported to fusebox.
type Outcome int

const (
	// Success: the dependency worked.
	Success Outcome = Outcome(pb.Outcome_OUTCOME_SUCCESS)
	// Failure: the dependency failed; counts toward tripping the breaker.
	Failure Outcome = Outcome(pb.Outcome_OUTCOME_FAILURE)
	// Ignored: says nothing about the dependency (a cancellation).
	Ignored Outcome = Outcome(pb.Outcome_OUTCOME_IGNORED)
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Failure:
		return "failure"
	case Ignored:
		return "ignored"
	}
	return "unspecified"
}

// Classifier maps the error a guarded call returned (never nil) to the
// outcome reported for it.
type Classifier func(err error) Outcome

// DefaultClassifier counts every error as a Failure except cancellations
// (context.Canceled, or a gRPC status with code Canceled), which are
// Ignored. A deadline that passed counts: a slow dependency is failing.
func DefaultClassifier(err error) Outcome {
	if errors.Is(err, context.Canceled) {
		return Ignored
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.Canceled {
		return Ignored
	}
	return Failure
}

// UnavailablePolicy says what a guard does when fusebox cannot be asked in
// time.
type UnavailablePolicy int

const (
	// FailOpen runs the call without a ticket (the default).
	FailOpen UnavailablePolicy = iota
	// FailClosed returns an *UnavailableError without running the call.
	FailClosed
)

type guardConfig struct {
	permits     *uint32
	maxWait     time.Duration
	lease       time.Duration
	classifier  Classifier
	deadline    time.Duration
	unavailable UnavailablePolicy
	renew       bool
	cost        CostFunc
	caller      string
	attempt     *uint32
}

func defaultGuardConfig() guardConfig {
	return guardConfig{classifier: DefaultClassifier, deadline: DefaultDeadline, renew: true}
}

// GuardOption configures one Guard (or, with WithGuardDefaults, every one).
type GuardOption func(*guardConfig)

// Permits asks for n permits (default 1). Zero is a status check: the call
// runs when a permit is free, without a ticket and without reporting.
func Permits(n uint32) GuardOption { return func(g *guardConfig) { g.permits = &n } }

// MaxWait lets the request wait in the key's queue up to d for permits.
// The Acquire's deadline is then the guard's deadline plus d.
func MaxWait(d time.Duration) GuardOption { return func(g *guardConfig) { g.maxWait = d } }

// Lease asks for a ticket lease of d (default: the policy's).
func Lease(d time.Duration) GuardOption { return func(g *guardConfig) { g.lease = d } }

// WithClassifier replaces DefaultClassifier for this guard.
func WithClassifier(c Classifier) GuardOption { return func(g *guardConfig) { g.classifier = c } }

// Deadline bounds each call to fusebox itself (default DefaultDeadline).
func Deadline(d time.Duration) GuardOption { return func(g *guardConfig) { g.deadline = d } }

// OnUnavailable sets what happens when fusebox cannot be asked in time
// (default FailOpen).
func OnUnavailable(p UnavailablePolicy) GuardOption {
	return func(g *guardConfig) { g.unavailable = p }
}

// CostFunc tells, once a guarded call has returned with err (nil on
// success), how many permits it really used: ok false reports no cost, and
// the ticket's permits stand. It reads the call's result where the call
// left it (a variable its closure set).
type CostFunc func(err error) (cost uint32, ok bool)

// WithCost reports the permits the call really used with its outcome
// (CompleteRequest.cost, rule U1): a call that asked with an estimate
// (Permits) settles the truth afterwards, up or down, on a token-bucket or
// window limiter; other limiter kinds ignore it. A cost of 0 returns the
// permits taken. Not asked when the call panicked, nor for a call run
// without a ticket (a status check, or failing open).
func WithCost(f CostFunc) GuardOption { return func(g *guardConfig) { g.cost = f } }

// Caller names who makes this call, sent as the Acquire's caller (rule
// Q1), in place of the client's (WithCaller). A breaker with a quorum
// counts failures by caller. At most 128 bytes of printable UTF-8: fusebox
// refuses another with INVALID_ARGUMENT naming caller (a *RequestError).
// With a token, fusebox takes the token's name instead.
func Caller(name string) GuardOption { return func(g *guardConfig) { g.caller = name } }

// Attempt says which attempt of the caller's own call this is, sent as the
// Acquire's attempt (rule R1): 1 (or leaving it out) for a first attempt,
// 2 and up for a retry, which a retry budget on the key counts. The client
// never runs a guarded call again by itself, so it marks no retry of its
// own: a caller that retries says so here.
func Attempt(n uint32) GuardOption { return func(g *guardConfig) { g.attempt = &n } }

// NoRenew turns off background lease renewal for this guard.
func NoRenew() GuardOption { return func(g *guardConfig) { g.renew = false } }

// Admission tells a guarded call how it was let in; read it with
// AdmissionFrom(ctx).
type Admission struct {
	Key string
	// Ticket is empty when the call runs without one (status check, or
	// fusebox unavailable and failing open).
	Ticket string
	// Probe is true for the single half-open probe.
	Probe bool
	// FailedOpen is true when fusebox could not be asked and the call runs
	// anyway; Err is why.
	FailedOpen bool
	Err        error
	// ShadowDecision is "blocked" or "denied" when the key's policy is a
	// shadow (enforce = false, a dry run) that granted a call it would have
	// blocked or denied; ShadowReason says why. Both are empty otherwise.
	ShadowDecision string
	ShadowReason   Reason
}

type admissionKey struct{}

// AdmissionFrom returns the admission of the guarded call running with ctx.
func AdmissionFrom(ctx context.Context) (Admission, bool) {
	a, ok := ctx.Value(admissionKey{}).(Admission)
	return a, ok
}

// Guard asks fusebox before running call for key, runs it when admitted and
// reports how it went: Success when it returns nil, the classifier's
// outcome for an error (Failure by default), Ignored when ctx is cancelled.
// A panic in call is reported as Failure and goes on. The outcome is
// queued and reported in the background, so Guard returns as soon as call
// does; Flush waits until fusebox has it.
//
// When fusebox answers no, Guard returns a *BlockedError, *RefusedError or
// *DeniedError (all Refusal) without running call. When fusebox is down or
// slow, the call runs without a ticket (FailOpen) or Guard returns an
// *UnavailableError (FailClosed). A request fusebox rejects as invalid or
// unauthorized gives a *RequestError. Otherwise Guard returns call's error
// unchanged.
func (c *Client) Guard(ctx context.Context, key string, call func(ctx context.Context) error, opts ...GuardOption) error {
	cfg := c.defaults
	for _, o := range opts {
		o(&cfg)
	}
	if left := c.cache.blockedFor(key, c.now()); left > 0 {
		c.stats.blockedLocal.Add(1)
		return &BlockedError{Key: key, Reason: "open", RetryAfter: left, Local: true}
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	req := &pb.AcquireRequest{Key: key, Permits: cfg.permits, Caller: cfg.caller, Attempt: cfg.attempt}
	if cfg.maxWait > 0 {
		req.MaxWait = durationpb.New(cfg.maxWait)
	}
	if cfg.lease > 0 {
		req.Lease = durationpb.New(cfg.lease)
	}
	var resp *pb.AcquireResponse
	var err error
	if c.backoff.backingOff(c.now()) {
		err = status.Error(codes.Unavailable, "fusebox was unavailable; backing off before asking again")
	} else {
		actx, cancel := context.WithTimeout(ctx, cfg.deadline+cfg.maxWait)
		resp, err = c.acquire(actx, req)
		cancel()
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil || !isUnavailable(err) {
			c.backoff.answered()
		} else {
			c.backoff.outage(c.now())
		}
	}
	if err != nil {
		if !isUnavailable(err) {
			return &RequestError{Key: key, Err: err}
		}
		c.stats.unavailable.Add(1)
		if cfg.unavailable == FailClosed {
			c.stats.failedClosed.Add(1)
			c.logs.warn("unavailable", "fusebox unavailable; failing closed", "key", key, "err", err)
			return &UnavailableError{Key: key, Err: err}
		}
		c.stats.failedOpen.Add(1)
		c.logs.warn("unavailable", "fusebox unavailable; failing open", "key", key, "err", err)
		adm := Admission{Key: key, FailedOpen: true, Err: err}
		return call(context.WithValue(ctx, admissionKey{}, adm))
	}

	switch resp.GetDecision() {
	case pb.Decision_DECISION_GRANTED, pb.Decision_DECISION_PROBE:
		probe := resp.GetDecision() == pb.Decision_DECISION_PROBE
		c.stats.granted.Add(1)
		if probe {
			c.stats.probes.Add(1)
		}
		c.cache.forget(key)
		adm := Admission{Key: key, Ticket: resp.GetTicket(), Probe: probe}
		if d := resp.GetShadowDecision(); d != pb.Decision_DECISION_UNSPECIFIED {
			adm.ShadowDecision = strings.ToLower(strings.TrimPrefix(d.String(), "DECISION_"))
			adm.ShadowReason = reasonOf(resp.GetShadowReason())
		}
		return c.run(ctx, adm, resp.GetLease().AsDuration(), cfg, call)
	case pb.Decision_DECISION_BLOCKED:
		c.stats.blocked.Add(1)
		retry := resp.GetRetryAfter().AsDuration()
		if resp.GetReason() == pb.Reason_REASON_OPEN && retry > 0 {
			now := c.now()
			c.cache.put(key, now.Add(retry), now)
		}
		return &BlockedError{Key: key, Reason: reasonOf(resp.GetReason()), RetryAfter: retry}
	case pb.Decision_DECISION_REFUSED:
		c.stats.refused.Add(1)
		return &RefusedError{Key: key}
	case pb.Decision_DECISION_DENIED:
		c.stats.denied.Add(1)
		return &DeniedError{Key: key, Reason: reasonOf(resp.GetReason()), RetryAfter: resp.GetRetryAfter().AsDuration()}
	}
	return &RequestError{Key: key, Err: errors.New("unknown decision " + resp.GetDecision().String())}
}

func isUnavailable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.Internal, codes.Unknown, codes.ResourceExhausted:
		return true
	}
	return false
}

// run makes the call under an admission, renews its lease in the
// background, and queues its outcome for the sender (outcomes.go): the
// caller does not wait for fusebox to hear of it.
func (c *Client) run(ctx context.Context, adm Admission, lease time.Duration, cfg guardConfig, call func(context.Context) error) (err error) {
	if adm.Ticket == "" { // a status check: nothing to renew or report
		return call(context.WithValue(ctx, admissionKey{}, adm))
	}
	var renewal *renewal
	if cfg.renew && lease > 0 {
		renewal = c.startRenewal(adm.Ticket, lease, cfg)
	}
	finished := false
	defer func() {
		renewal.stop() // before the outcome is queued
		var outcome Outcome
		switch {
		case !finished: // call panicked
			outcome = Failure
		case err != nil && errors.Is(ctx.Err(), context.Canceled):
			outcome = Ignored // the caller cancelled
		case err == nil:
			outcome = Success
		default:
			outcome = cfg.classifier(err)
		}
		var cost *uint32
		if finished && cfg.cost != nil {
			if n, ok := cfg.cost(err); ok {
				cost = &n
			}
		}
		c.report(adm.Key, adm.Ticket, outcome, cost)
	}()
	err = call(context.WithValue(ctx, admissionKey{}, adm))
	finished = true
	return err
}

// abandoned reports IGNORED for a ticket granted to an Acquire whose caller
// had already given up (its answer came after it was withdrawn): nobody
// runs a call under it, and its permits come back now rather than when its
// lease ends.
func (c *Client) abandoned(key, ticket string) {
	c.report(key, ticket, Ignored, nil)
}

// renewal renews one ticket's lease each time half of it has passed, from
// a timer: no goroutine waits while the call runs, and stopping it never
// waits on the network.
type renewal struct {
	c      *Client
	ticket string
	lease  time.Duration // the lease granted last
	ask    time.Duration // the lease to ask for (0: the policy's)
	within time.Duration // the deadline of one renewal

	mu      sync.Mutex
	stopped bool
	cancel  context.CancelFunc // of the renewal in flight, if any
	timer   *time.Timer
}

func (c *Client) startRenewal(ticket string, lease time.Duration, cfg guardConfig) *renewal {
	r := &renewal{c: c, ticket: ticket, lease: lease, ask: cfg.lease, within: cfg.deadline}
	r.mu.Lock() // the timer's first run waits until r.timer is set
	r.timer = time.AfterFunc(lease/2, r.renew)
	r.mu.Unlock()
	return r
}

// stop ends the renewal: no renewal starts after it, and the one in
// flight, if any, is cancelled and its answer ignored.
func (r *renewal) stop() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.stopped = true
	r.timer.Stop()
	if r.cancel != nil {
		r.cancel()
	}
	r.mu.Unlock()
}

// renew sends one renewal and sets the timer for the next, unless the
// ticket is gone or the renewal was stopped meanwhile.
func (r *renewal) renew() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.within)
	r.cancel = cancel
	r.mu.Unlock()

	req := &pb.RenewRequest{Ticket: r.ticket}
	if r.ask > 0 {
		req.Lease = durationpb.New(r.ask)
	}
	resp, err := r.c.renew(ctx, req)
	cancel()

	r.mu.Lock()
	r.cancel = nil
	if r.stopped { // the call ended: this answer no longer matters
		r.mu.Unlock()
		return
	}
	next := r.lease / 2
	if err != nil {
		r.c.stats.renewErrors.Add(1)
		r.c.logs.warn("renew", "fusebox: could not renew a lease", "err", err)
		next = r.lease / 4 // try again before the lease ends
	} else {
		r.c.stats.renewals.Add(1)
		if l := resp.GetLease().AsDuration(); l > 0 {
			r.lease = l
			next = l / 2
		}
	}
	// NOT_FOUND: completed, expired or stale: nothing left to renew.
	if status.Code(err) != codes.NotFound {
		r.timer.Reset(next)
	}
	hook := renewHook // read before the call can end and a test unset it
	r.mu.Unlock()
	if hook != nil {
		hook(r.ticket, err)
	}
}

// renewHook, when set (by tests), is told of every renewal answered while
// its call still runs.
var renewHook func(ticket string, err error)
