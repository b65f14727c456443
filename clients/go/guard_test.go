package fusebox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

var errBoom = errors.New("boom")

// newClient makes a client whose calls to fusebox may take 2 s, so that a
// debug server on a busy test machine is not taken for an outage; tests of
// the deadline itself pass their own.
func newClient(t *testing.T, s *server, opts ...Option) *Client {
	t.Helper()
	opts = append([]Option{WithGuardDefaults(Deadline(2 * time.Second))}, opts...)
	c, err := New(s.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ok(context.Context) error   { return nil }
func fail(context.Context) error { return errBoom }

// flush waits until fusebox has the outcomes of the guards that returned.
func flush(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

func TestSuccessAndFailureAreReported(t *testing.T) {
	s := startServer(t)
	s.setPolicy("k", breaker(5, 10*time.Second))
	c := newClient(t, s)
	ctx := context.Background()
	if err := c.Guard(ctx, "k", ok); err != nil {
		t.Fatal(err)
	}
	if err := c.Guard(ctx, "k", fail); err != errBoom {
		t.Fatalf("want the call's own error, got %v", err)
	}
	flush(t, c)
	st := s.key("k").GetStats()
	if st.GetSuccesses() != 1 || st.GetFailures() != 1 {
		t.Fatalf("server saw %v", st)
	}
}

func TestBreakerTripsThenLocalShortCircuitThenProbe(t *testing.T) {
	s := startServer(t)
	s.setPolicy("k", breaker(2, 10*time.Second))
	clk := &testClock{now: time.Unix(0, 0)}
	c := newClient(t, s, WithClock(clk.Now))
	ctx := context.Background()
	c.Guard(ctx, "k", fail)
	c.Guard(ctx, "k", fail)
	flush(t, c) // the next Acquire must find the breaker tripped

	var blocked *BlockedError
	err := c.Guard(ctx, "k", ok)
	if !errors.As(err, &blocked) || blocked.Local || blocked.RetryAfter != 10*time.Second || blocked.Reason != "open" {
		t.Fatalf("want a blocked answer from the server, got %#v", err)
	}
	err = c.Guard(ctx, "k", ok)
	if !errors.As(err, &blocked) || !blocked.Local {
		t.Fatalf("want a local blocked answer, got %#v", err)
	}
	if n := s.key("k").GetStats().GetBlocked(); n != 1 {
		t.Fatalf("server saw %d blocked requests, want 1", n)
	}
	var r Refusal
	if !errors.As(err, &r) {
		t.Fatal("a BlockedError is a Refusal")
	}

	s.advance(10 * time.Second)
	clk.Advance(10 * time.Second)
	probed := false
	err = c.Guard(ctx, "k", func(ctx context.Context) error {
		a, _ := AdmissionFrom(ctx)
		probed = a.Probe
		return nil
	})
	if err != nil || !probed {
		t.Fatalf("want the probe to run, got %v (probe %v)", err, probed)
	}
	flush(t, c)
	if ph := s.key("k").GetPhase().String(); ph != "PHASE_CLOSED" {
		t.Fatalf("after a good probe the breaker is %s", ph)
	}
	if st := c.Stats(); st.BlockedLocal != 1 || st.Blocked != 1 || st.Probes != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRefusedWhenIsolated(t *testing.T) {
	s := startServer(t)
	s.setPolicy("k", breaker(2, time.Second))
	if _, err := s.admin.Isolate(context.Background(), &pb.IsolateRequest{Key: "k", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s)
	ran := false
	err := c.Guard(context.Background(), "k", func(context.Context) error { ran = true; return nil })
	var refused *RefusedError
	if !errors.As(err, &refused) || ran {
		t.Fatalf("want refused without running, got %v (ran %v)", err, ran)
	}
}

func TestDeniedWhenNoPermits(t *testing.T) {
	s := startServer(t)
	s.setPolicy("k", concurrency(1))
	c := newClient(t, s)
	var inner error
	err := c.Guard(context.Background(), "k", func(ctx context.Context) error {
		inner = c.Guard(ctx, "k", ok)
		return nil
	})
	var denied *DeniedError
	if err != nil || !errors.As(inner, &denied) || denied.Reason != "no_permits" {
		t.Fatalf("want denied inside, got %v / %v", err, inner)
	}
}

// A call asks with an estimate of one permit; WithCost reports what its
// result says it used, and fusebox settles the difference (U1).
func TestCostFromTheCallsResultIsSettled(t *testing.T) {
	for _, tr := range []Transport{TransportUnary, TransportStream} {
		t.Run(tr.String(), func(t *testing.T) {
			s := startServer(t)
			s.setPolicy("k", tokenBucket(10))
			c := newClient(t, s, WithTransport(tr))
			ctx := context.Background()
			// search stands for a call whose result tells what it cost.
			search := func(rows uint32, err error) error {
				var got uint32
				return c.Guard(ctx, "k", func(context.Context) error {
					got = rows
					return err
				}, WithCost(func(err error) (uint32, bool) { return got, err == nil }))
			}
			free := func(want uint32) {
				t.Helper()
				flush(t, c)
				if st := s.key("k"); st.GetFree() != want || st.GetLiveTickets() != 0 {
					t.Fatalf("free %d, live tickets %d; want %d free, none live", st.GetFree(), st.GetLiveTickets(), want)
				}
			}
			if err := search(5, nil); err != nil {
				t.Fatal(err)
			}
			free(5) // 1 taken at Acquire, 4 more at Complete
			if err := search(0, nil); err != nil {
				t.Fatal(err)
			}
			free(5) // the permit taken came back
			if err := search(7, errBoom); err != errBoom {
				t.Fatalf("want the call's own error, got %v", err)
			}
			free(4) // no cost reported (ok false): the ticket's one permit stands
			st := s.key("k").GetStats()
			if st.GetSuccesses() != 2 || st.GetFailures() != 1 {
				t.Fatalf("server saw %v", st)
			}
		})
	}
}

func TestCancelledCallIsIgnored(t *testing.T) {
	s := startServer(t)
	s.setPolicy("k", breaker(1, time.Second))
	c := newClient(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	err := c.Guard(ctx, "k", func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	flush(t, c)
	st := s.key("k")
	if st.GetStats().GetIgnored() != 1 || st.GetPhase().String() != "PHASE_CLOSED" {
		t.Fatalf("server saw %v", st)
	}
}

func TestClassifierIsReplaceable(t *testing.T) {
	s := startServer(t)
	s.setPolicy("k", breaker(1, time.Second))
	c := newClient(t, s)
	err := c.Guard(context.Background(), "k", fail, WithClassifier(func(error) Outcome { return Ignored }))
	if err != errBoom {
		t.Fatal(err)
	}
	flush(t, c)
	if st := s.key("k"); st.GetStats().GetIgnored() != 1 || st.GetPhase().String() != "PHASE_CLOSED" {
		t.Fatalf("server saw %v", st)
	}
}

func TestPanicIsAFailure(t *testing.T) {
	s := startServer(t)
	s.setPolicy("k", breaker(5, time.Second))
	c := newClient(t, s)
	func() {
		defer func() { recover() }()
		c.Guard(context.Background(), "k", func(context.Context) error { panic("x") })
	}()
	flush(t, c)
	if n := s.key("k").GetStats().GetFailures(); n != 1 {
		t.Fatalf("failures %d", n)
	}
}

func TestLeaseIsRenewedInTheBackground(t *testing.T) {
	s := startServer(t)
	s.setPolicy("k", breaker(5, time.Second))
	c := newClient(t, s)
	renewed := make(chan error, 16)
	renewHook = func(_ string, err error) { renewed <- err }
	defer func() { renewHook = nil }()
	err := c.Guard(context.Background(), "k", func(context.Context) error {
		for i := 0; i < 2; i++ {
			if err := <-renewed; err != nil {
				return err
			}
		}
		return nil
	}, Lease(100*time.Millisecond), Deadline(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	flush(t, c)
	if st := c.Stats(); st.Renewals < 2 || st.Completed != 1 {
		t.Fatalf("stats %+v", st)
	}
	if st := s.key("k"); st.GetStats().GetSuccesses() != 1 || st.GetLiveTickets() != 0 {
		t.Fatalf("server saw %v", st)
	}
}

func TestFuseboxDownFailsOpenOrClosed(t *testing.T) {
	s := startServer(t)
	c := newClient(t, s)
	if err := c.Guard(context.Background(), "k", ok); err != nil {
		t.Fatal(err)
	}
	s.stop()
	var adm Admission
	err := c.Guard(context.Background(), "k", func(ctx context.Context) error {
		adm, _ = AdmissionFrom(ctx)
		return nil
	})
	if err != nil || !adm.FailedOpen || adm.Ticket != "" {
		t.Fatalf("want the call run without a ticket, got %v %+v", err, adm)
	}
	ran := false
	err = c.Guard(context.Background(), "k", func(context.Context) error { ran = true; return nil }, OnUnavailable(FailClosed))
	var un *UnavailableError
	if !errors.As(err, &un) || ran {
		t.Fatalf("want unavailable, got %v (ran %v)", err, ran)
	}
	if st := c.Stats(); st.FailedOpen != 1 || st.FailedClosed != 1 || st.Unavailable != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBadKeyIsARequestError(t *testing.T) {
	s := startServer(t)
	c := newClient(t, s)
	err := c.Guard(context.Background(), "", ok)
	var re *RequestError
	if !errors.As(err, &re) {
		t.Fatalf("got %v", err)
	}
}

func TestCacheIsBounded(t *testing.T) {
	c := newOpenCache(2)
	now := time.Unix(0, 0)
	c.put("a", now.Add(time.Second), now)
	c.put("b", now.Add(3*time.Second), now)
	c.put("c", now.Add(2*time.Second), now)
	if c.len() != 2 || c.blockedFor("a", now) != 0 || c.blockedFor("b", now) != 3*time.Second {
		t.Fatalf("cache %v", c.until)
	}
	if c.blockedFor("c", now.Add(2*time.Second)) != 0 || c.len() != 1 {
		t.Fatal("an ended entry is dropped")
	}
}

func TestSharedIsOneClientPerTarget(t *testing.T) {
	s := startServer(t)
	a, err := Shared(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, _ := Shared(s.addr, WithToken("ignored"))
	if a != b || a.Conn() != b.Conn() {
		t.Fatal("Shared made a second client")
	}
}

// countingAcquires counts the Acquire calls the client makes in n.
func countingAcquires(n *atomic.Int32) Option {
	return WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Acquire") {
			n.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
}

func TestOutageBacksOffBeforeAskingAgain(t *testing.T) {
	s := startServer(t)
	var acquires atomic.Int32
	c := newClient(t, s, countingAcquires(&acquires))
	if err := c.Guard(context.Background(), "k", ok); err != nil {
		t.Fatal(err)
	}
	s.stop()
	for range 3 {
		var adm Admission
		err := c.Guard(context.Background(), "k", func(ctx context.Context) error {
			adm, _ = AdmissionFrom(ctx)
			return nil
		})
		if err != nil || !adm.FailedOpen {
			t.Fatalf("want the call run without a ticket, got %v %+v", err, adm)
		}
	}
	if n := acquires.Load(); n != 2 {
		t.Fatalf("fusebox was asked %d times, want 2 (the later guards back off)", n)
	}
	if st := c.Stats(); st.Unavailable != 3 || st.FailedOpen != 3 {
		t.Fatalf("stats %+v", st)
	}
	c.backoff.mu.Lock()
	next := c.backoff.next
	c.backoff.mu.Unlock()
	if next != 2*initialBackoff {
		t.Fatalf("one outage doubled the backoff to %v", next)
	}
}

// The backoff reads the injected clock: however long the test really
// takes, guards back off until that clock passes the window, then ask.
func TestOutageBackoffFollowsTheInjectedClock(t *testing.T) {
	s := startServer(t)
	var acquires atomic.Int32
	var elapsed atomic.Int64
	start := time.Unix(1_000_000, 0)
	clock := func() time.Time { return start.Add(time.Duration(elapsed.Load())) }
	c := newClient(t, s, countingAcquires(&acquires), WithClock(clock))
	if err := c.Guard(context.Background(), "k", ok); err != nil {
		t.Fatal(err)
	}
	s.stop()
	for range 3 {
		if err := c.Guard(context.Background(), "k", ok); err != nil {
			t.Fatal(err)
		}
	}
	if n := acquires.Load(); n != 2 {
		t.Fatalf("fusebox was asked %d times, want 2 (backing off on the injected clock)", n)
	}
	elapsed.Add(int64(initialBackoff - time.Millisecond))
	if err := c.Guard(context.Background(), "k", ok); err != nil {
		t.Fatal(err)
	}
	if n := acquires.Load(); n != 2 {
		t.Fatalf("asked %d times 1 ms before the window ends, want 2", n)
	}
	elapsed.Add(int64(time.Millisecond))
	if err := c.Guard(context.Background(), "k", ok); err != nil {
		t.Fatal(err)
	}
	if n := acquires.Load(); n != 3 {
		t.Fatalf("asked %d times once the window ended, want 3", n)
	}
}

func TestOutageBackoffDoublesOncePerWindow(t *testing.T) {
	var b outageBackoff
	now := time.Unix(0, 0)
	b.outage(now)
	b.outage(now.Add(time.Millisecond)) // same window: no step
	if b.until != now.Add(initialBackoff) || b.next != 2*initialBackoff {
		t.Fatalf("%+v", b.until)
	}
	for range 10 {
		now = b.until
		b.outage(now)
	}
	if b.next != maxBackoff || b.until != now.Add(maxBackoff) {
		t.Fatalf("backoff %v until %v", b.next, b.until.Sub(now))
	}
	if !b.backingOff(now) {
		t.Fatal("want backing off")
	}
	b.answered()
	if b.backingOff(now) || b.next != initialBackoff {
		t.Fatal("an answer resets the backoff")
	}
}
