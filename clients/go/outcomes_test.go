package fusebox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

// Longest a test waits for something that should happen at once.
const testWait = 30 * time.Second

var transports = []Transport{TransportUnary, TransportStream}

// withEachTransport runs test once per transport, as a subtest named after
// it, with a server of its own and a client of it on that transport (made
// with opts too).
func withEachTransport(t *testing.T, opts []Option, test func(t *testing.T, s *server, c *Client)) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			s := startServer(t)
			test(t, s, newClient(t, s, append([]Option{WithTransport(tr)}, opts...)...))
		})
	}
}

// within fails the test unless ch yields within testWait.
func within[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testWait):
		t.Fatalf("%s: not within %v", what, testWait)
	}
	var zero T
	return zero
}

// A guard returns its call's result while fusebox, stopped, cannot have
// answered the call's Complete; the outcome reaches fusebox once it goes on.
func TestOutcomeIsReportedOffTheCallersPath(t *testing.T) {
	// A guard that waited for its Complete would wait for this
	// deadline, far past testWait.
	withEachTransport(t, []Option{WithGuardDefaults(Deadline(10 * testWait))}, func(t *testing.T, s *server, c *Client) {
		granted, paused := make(chan struct{}), make(chan struct{})
		returned := make(chan error, 1)
		go func() {
			returned <- c.Guard(context.Background(), "k", func(ctx context.Context) error {
				close(granted)
				<-paused
				return nil
			})
		}()
		within(t, "the call started", granted)
		s.pause()
		close(paused)
		if err := within(t, "the guard returned while fusebox was stopped", returned); err != nil {
			t.Fatal(err)
		}
		// Stopped, fusebox cannot have answered: a flush runs out of time.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := c.Flush(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a flush while fusebox is stopped: %v, want a deadline exceeded (stats %+v)", err, c.Stats())
		}
		s.resume()
		flush(t, c)
		if st := s.key("k"); st.GetStats().GetSuccesses() != 1 || st.GetLiveTickets() != 0 {
			t.Fatalf("server saw %v", st)
		}
		if st := c.Stats(); st.Completed != 1 || st.CompleteFailures != 0 || st.OutcomesDropped != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// With room for one outcome, outcomes that end while fusebox is stopped
// are one send in flight and one queued at most; the rest are dropped,
// counted, and their tickets live on until their leases end.
func TestOutcomeQueueIsBounded(t *testing.T) {
	withEachTransport(t, []Option{WithOutcomeQueue(1), WithGuardDefaults(Deadline(10 * testWait))}, func(t *testing.T, s *server, c *Client) {
		const calls = 4
		running := make(chan struct{}, calls)
		latch := make(chan struct{})
		returned := make(chan error, calls)
		for range calls {
			go func() {
				returned <- c.Guard(context.Background(), "k", func(context.Context) error {
					running <- struct{}{}
					<-latch
					return nil
				})
			}()
		}
		for range calls {
			within(t, "four calls running", running)
		}
		s.pause()
		close(latch)
		for range calls {
			if err := within(t, "the guards returned", returned); err != nil {
				t.Fatal(err)
			}
		}
		s.resume()
		flush(t, c)
		st, key := c.Stats(), s.key("k")
		dropped := st.OutcomesDropped
		if key.GetStats().GetSuccesses()+dropped != calls || dropped < calls-2 || uint64(key.GetLiveTickets()) != dropped {
			t.Fatalf("%d dropped, server saw %v", dropped, key)
		}
		if st.CompleteFailures != 0 || st.Completed != calls-dropped {
			t.Fatalf("stats %+v", st)
		}
	})
}

// Flush returns once fusebox has the outcomes of the guards before it.
func TestFlushWaitsForTheOutcomes(t *testing.T) {
	withEachTransport(t, nil, func(t *testing.T, s *server, c *Client) {
		if err := c.Guard(context.Background(), "k", ok); err != nil {
			t.Fatal(err)
		}
		if err := c.Guard(context.Background(), "k", fail); !errors.Is(err, errBoom) {
			t.Fatal(err)
		}
		flush(t, c)
		st := s.key("k")
		if st.GetStats().GetSuccesses() != 1 || st.GetStats().GetFailures() != 1 || st.GetLiveTickets() != 0 {
			t.Fatalf("server saw %v", st)
		}
	})
}

// Close reports every queued outcome before it closes the connection.
func TestCloseFlushes(t *testing.T) {
	withEachTransport(t, nil, func(t *testing.T, s *server, c *Client) {
		const calls = 20
		returned := make(chan error, calls)
		for range calls {
			go func() { returned <- c.Guard(context.Background(), "k", ok) }()
		}
		for range calls {
			if err := within(t, "the guards returned", returned); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		st := s.key("k") // on the server helper's own connection
		if st.GetStats().GetSuccesses() != calls || st.GetLiveTickets() != 0 {
			t.Fatalf("server saw %v", st)
		}
		if got := c.Stats(); got.Completed != calls || got.CompleteFailures != 0 {
			t.Fatalf("stats %+v", got)
		}
		// A guard that ends after Close cannot report; it is counted.
		c.report("k", "a-ticket", Success, nil)
		if got := c.Stats(); got.CompleteFailures != 1 {
			t.Fatalf("stats %+v", got)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("a second Close: %v", err)
		}
	})
}

// A send that fails is counted, and a flush does not wait past it.
func TestFailedSendIsCounted(t *testing.T) {
	withEachTransport(t, nil, func(t *testing.T, s *server, c *Client) {
		err := c.Guard(context.Background(), "k", func(context.Context) error {
			s.stop()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		flush(t, c)
		if st := c.Stats(); st.CompleteFailures != 1 || st.Completed != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// An outcome fusebox answers with an error (an unknown ticket) is counted
// as a failed complete, and the others of its send are reported.
func TestOutcomeAnsweredWithAnErrorIsCounted(t *testing.T) {
	withEachTransport(t, nil, func(t *testing.T, s *server, c *Client) {
		resp, err := c.acquire(context.Background(), &pb.AcquireRequest{Key: "k"})
		if err != nil || resp.GetTicket() == "" {
			t.Fatalf("acquire: %v %v", resp, err)
		}
		// Stopped, fusebox answers nothing: the first outcome's send
		// waits, and the other two go together in the next.
		s.pause()
		c.report("k", "unknown-1", Success, nil)
		c.report("k", "unknown-2", Success, nil)
		c.report("k", resp.GetTicket(), Success, nil)
		s.resume()
		flush(t, c)
		if st := c.Stats(); st.CompleteFailures != 2 || st.Completed != 1 {
			t.Fatalf("stats %+v", st)
		}
		if st := s.key("k"); st.GetStats().GetSuccesses() != 1 || st.GetLiveTickets() != 0 {
			t.Fatalf("server saw %v", st)
		}
	})
}

func TestOutcomeQueueMustHoldOne(t *testing.T) {
	_, err := New("127.0.0.1:1", WithOutcomeQueue(0))
	if err == nil || !strings.Contains(err.Error(), "WithOutcomeQueue(0)") {
		t.Fatalf("want an error naming WithOutcomeQueue, got %v", err)
	}
}

// On the stream, the grant of an Acquire its caller gave up (made before
// the cancel reached fusebox) is completed IGNORED through the queue, so
// its permit comes back at once.
func TestStreamCompletesTheLateGrantOfAnAbandonedAcquire(t *testing.T) {
	s, c, release := heldPermit(t)
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	ran := atomic.Bool{}
	go func() {
		waited <- c.Guard(ctx, "k", func(context.Context) error { ran.Store(true); return nil }, MaxWait(time.Minute))
	}()
	waitFor(t, "a waiter", func() bool { return s.key("k").GetWaiters() == 1 })

	// Stopped, fusebox reads the holder's Complete (which grants the
	// waiter) before the waiter's cancel, and answers the waiter with the
	// grant after its caller gave up.
	s.pause()
	sent := c.mux.framesSent.Load()
	if err := release(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the holder's Complete sent", func() bool { return c.mux.framesSent.Load() == sent+1 })
	cancel()
	if err := within(t, "the waiter gave up", waited); !errors.Is(err, context.Canceled) || ran.Load() {
		t.Fatalf("want the waiter cancelled without running, got %v", err)
	}
	s.resume()
	waitFor(t, "the late grant completed", func() bool {
		st := s.key("k")
		return st.GetLiveTickets() == 0 && st.GetStats().GetIgnored() == 1
	})
	if st := s.key("k").GetStats(); st.GetSuccesses() != 1 || st.GetGranted() != 2 {
		t.Fatalf("server saw %v", st)
	}
}

// The queue's rules, as properties of random runs against a send that the
// test holds and releases: one send at a time; a send takes what waits, in
// order, up to outcomesPerSend; outcomes past the limit are dropped while
// a send is in flight; a flush returns only once what was queued before it
// has been sent and answered; at close what waits is counted lost.
func TestOutcomeQueueProperties(t *testing.T) {
	for seed := range uint64(300) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { outcomeQueueRun(t, seed) })
	}
}

func outcomeQueueRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x6f7574636f6d65))
	limit := 1 + rng.IntN(4)
	if rng.IntN(4) == 0 {
		limit = 1 + rng.IntN(2*outcomesPerSend+500)
	}
	sends := make(chan []string)
	finish := make(chan struct{})
	var inFlight, answered atomic.Int64
	send := func(ctx context.Context, batch []pendingOutcome) {
		if inFlight.Add(1) != 1 {
			t.Error("two sends in flight")
		}
		tickets := make([]string, len(batch))
		for i, o := range batch {
			tickets[i] = o.ticket
		}
		sends <- tickets
		select {
		case <-finish:
		case <-ctx.Done():
		}
		answered.Add(int64(len(batch)))
		inFlight.Add(-1)
	}
	var lost []string
	q := newOutcomeQueue(limit, time.Minute, send, func(batch []pendingOutcome) {
		for _, o := range batch {
			lost = append(lost, o.ticket)
		}
	})

	var waiting, sent []string // the model: queued, and handed to send
	var current []string       // the send in flight; nil when idle
	accepted, dropped, next := 0, 0, 0
	newTicket := func() string { next++; return fmt.Sprint("t", next) }
	takeSend := func() {
		t.Helper()
		got := within(t, "a send", sends)
		n := min(len(waiting), outcomesPerSend)
		if !slices.Equal(got, waiting[:n]) {
			t.Fatalf("seed %d: sent %d outcomes %v..., want the first %d waiting", seed, len(got), got[:min(3, len(got))], n)
		}
		waiting = waiting[n:]
		sent = append(sent, got...)
		current = got
	}
	for range 40 {
		if current == nil { // idle: an outcome is sent at once, alone
			ticket := newTicket()
			if err := q.put(pendingOutcome{ticket: ticket}); err != nil {
				t.Fatalf("seed %d: put while idle: %v", seed, err)
			}
			accepted++
			waiting = append(waiting, ticket)
			takeSend()
			continue
		}
		switch rng.IntN(4) {
		case 0, 1: // outcomes end during the send: queued up to the limit
			for range rng.IntN(limit + 3) {
				ticket := newTicket()
				err := q.put(pendingOutcome{ticket: ticket})
				switch {
				case len(waiting) < limit && err == nil:
					accepted++
					waiting = append(waiting, ticket)
				case len(waiting) >= limit && errors.Is(err, errQueueFull):
					dropped++
				default:
					t.Fatalf("seed %d: put with %d waiting of %d: %v", seed, len(waiting), limit, err)
				}
			}
		case 2: // a flush waits for the send in flight and what waits
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := q.flush(ctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("seed %d: flush with a send in flight and a done context: %v", seed, err)
			}
			target := int64(accepted)
			flushed := make(chan int64, 1)
			go func() {
				q.flush(context.Background())
				flushed <- answered.Load()
			}()
			for current != nil {
				finish <- struct{}{}
				current = nil
				if len(waiting) > 0 {
					takeSend()
				}
			}
			if got := within(t, "the flush", flushed); got < target {
				t.Fatalf("seed %d: flush returned with %d of %d outcomes answered", seed, got, target)
			}
		case 3: // the send ends: the next takes what waits
			finish <- struct{}{}
			current = nil
			if len(waiting) > 0 {
				takeSend()
			}
		}
	}
	q.close() // ends the send in flight; what waits is lost
	if !slices.Equal(lost, waiting) {
		t.Fatalf("seed %d: lost %d at close, want the %d waiting", seed, len(lost), len(waiting))
	}
	if len(sent)+len(lost) != accepted || accepted+dropped != next {
		t.Fatalf("seed %d: %d sent + %d lost != %d queued; %d queued + %d dropped != %d", seed, len(sent), len(lost), accepted, accepted, dropped, next)
	}
	if err := q.put(pendingOutcome{ticket: "late"}); !errors.Is(err, errQueueClosed) {
		t.Fatalf("seed %d: put after close: %v", seed, err)
	}
	if err := q.flush(context.Background()); err != nil {
		t.Fatalf("seed %d: flush after close: %v", seed, err)
	}
}
