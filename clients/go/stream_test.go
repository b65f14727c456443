package fusebox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// callCounter counts the unary calls and the streams a client makes.
type callCounter struct {
	unary, streams atomic.Int32
}

func (n *callCounter) options() Option {
	return WithDialOptions(
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			n.unary.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			n.streams.Add(1)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	)
}

// heldPermit starts a server on which key "k" has one permit and room for
// one waiter, and a client of it on the stream transport (made with opts
// too) whose guard of "k" holds the permit until release, which returns
// the guard's error.
func heldPermit(t *testing.T, opts ...Option) (s *server, c *Client, release func() error) {
	t.Helper()
	s = startServer(t)
	p := concurrency(1)
	p.Limiter.QueueLimit = 1
	s.setPolicy("k", p)
	c = newClient(t, s, append([]Option{WithTransport(TransportStream)}, opts...)...)
	running, done := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- c.Guard(context.Background(), "k", func(context.Context) error {
			close(running)
			<-done
			return nil
		})
	}()
	within(t, "the holder runs", running)
	return s, c, func() error {
		close(done)
		return within(t, "the holder returned", held)
	}
}

func TestStreamTransportSendsEveryCallOnOneDecideStream(t *testing.T) {
	s := startServer(t)
	s.setPolicy("k", breaker(100, 10*time.Second))
	var n callCounter
	c := newClient(t, s, WithTransport(TransportStream), n.options())
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%4 == 0 {
				errs <- c.Guard(context.Background(), "k", fail)
			} else {
				errs <- c.Guard(context.Background(), "k", ok)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, errBoom) {
			t.Fatal(err)
		}
	}
	flush(t, c)
	st := s.key("k").GetStats()
	if st.GetSuccesses() != 30 || st.GetFailures() != 10 {
		t.Fatalf("server saw %v", st)
	}
	if u, str := n.unary.Load(), n.streams.Load(); u != 0 || str != 1 {
		t.Fatalf("%d unary calls and %d streams, want 0 and 1", u, str)
	}
	if got := c.Stats(); got.Completed != 40 {
		t.Fatalf("stats %+v", got)
	}
}

func TestStreamErrorIsTheUnaryCallsError(t *testing.T) {
	s := startServer(t)
	for _, tr := range []Transport{TransportUnary, TransportStream} {
		c := newClient(t, s, WithTransport(tr))
		var re *RequestError
		err := c.Guard(context.Background(), "", ok)
		if !errors.As(err, &re) || status.Code(re.Err) != codes.InvalidArgument {
			t.Fatalf("%v: want an INVALID_ARGUMENT RequestError, got %v", tr, err)
		}
	}
}

func TestStreamCancelsAWaitingAcquire(t *testing.T) {
	s, c, release := heldPermit(t)

	// Given up by its caller.
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- c.Guard(ctx, "k", ok, MaxWait(time.Minute)) }()
	waitFor(t, "a waiter", func() bool { return s.key("k").GetWaiters() == 1 })
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	waitFor(t, "the waiter withdrawn", func() bool { return s.key("k").GetWaiters() == 0 })

	// Past its deadline (the manual clock does not move, so only the client
	// gives up): the guard fails open and the waiter is withdrawn.
	ranOpen := make(chan bool, 1)
	go func() {
		opened := false
		err := c.Guard(context.Background(), "k", func(ctx context.Context) error {
			a, _ := AdmissionFrom(ctx)
			opened = a.FailedOpen
			return nil
		}, MaxWait(time.Second), Deadline(100*time.Millisecond))
		ranOpen <- err == nil && opened
	}()
	waitFor(t, "a waiter", func() bool { return s.key("k").GetWaiters() == 1 })
	if !<-ranOpen {
		t.Fatal("want the call run failing open")
	}
	waitFor(t, "the waiter withdrawn", func() bool { return s.key("k").GetWaiters() == 0 })

	if err := release(); err != nil {
		t.Fatal(err)
	}
}

func TestStreamEndFailsCallsInFlightUnavailableThenReopens(t *testing.T) {
	var n callCounter
	// The outage backoff reads this clock: the test moves it past the
	// window instead of waiting for it.
	var elapsed atomic.Int64
	start := time.Unix(1_000_000, 0)
	clock := func() time.Time { return start.Add(time.Duration(elapsed.Load())) }
	s, c, release := heldPermit(t, n.options(), WithClock(clock))
	waited := make(chan *UnavailableError, 1)
	go func() {
		err := c.Guard(context.Background(), "k", ok, MaxWait(time.Minute), OnUnavailable(FailClosed))
		var un *UnavailableError
		errors.As(err, &un)
		waited <- un
	}()
	waitFor(t, "a waiter", func() bool { return s.key("k").GetWaiters() == 1 })
	c.mux.mu.Lock()
	c.mux.cur.end()
	c.mux.mu.Unlock()
	un := <-waited
	if un == nil || status.Code(un.Err) != codes.Unavailable {
		t.Fatalf("want UNAVAILABLE failing closed, got %v", un)
	}
	if err := release(); err != nil { // its Complete opens the next stream
		t.Fatal(err)
	}
	flush(t, c)
	if got := s.key("k").GetStats().GetSuccesses(); got != 1 {
		t.Fatalf("%d successes, want 1 (the holder's Complete goes on a new stream)", got)
	}
	elapsed.Add(int64(initialBackoff)) // past the outage backoff
	if err := c.Guard(context.Background(), "other", ok); err != nil {
		t.Fatal(err)
	}
	if got := n.streams.Load(); got != 2 {
		t.Fatalf("%d streams, want 2", got)
	}
}
