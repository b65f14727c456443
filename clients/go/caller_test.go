package fusebox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

// refusedForCaller fails the test unless err is fusebox's INVALID_ARGUMENT
// naming the caller field (rule Q1: more than 128 bytes is refused).
func refusedForCaller(t *testing.T, what string, err error) {
	t.Helper()
	var re *RequestError
	if !errors.As(err, &re) || status.Code(re.Err) != codes.InvalidArgument {
		t.Fatalf("%s: want an INVALID_ARGUMENT RequestError, got %v", what, err)
	}
	if msg := status.Convert(re.Err).Message(); !strings.HasPrefix(msg, "caller:") {
		t.Fatalf("%s: want a message naming caller, got %q", what, msg)
	}
}

// The server refuses a caller of 129 bytes and takes one of 128: a refusal
// proves the client sent what it was given, the client's own and a guard's.
func TestCallerIsSentOnEveryAcquire(t *testing.T) {
	s := startServer(t)
	long, fits := strings.Repeat("c", 129), strings.Repeat("c", 128)
	for _, tr := range []Transport{TransportUnary, TransportStream} {
		ran := 0
		call := func(context.Context) error { ran++; return nil }

		c := newClient(t, s, WithTransport(tr), WithCaller(long))
		refusedForCaller(t, tr.String()+", the client's caller", c.Guard(context.Background(), "k", call))
		if err := c.Guard(context.Background(), "k", call, Caller("checkout")); err != nil {
			t.Fatalf("%v: a guard's caller replaces the client's: %v", tr, err)
		}

		c = newClient(t, s, WithTransport(tr), WithCaller(fits))
		if err := c.Guard(context.Background(), "k", call); err != nil {
			t.Fatalf("%v: a caller of 128 bytes: %v", tr, err)
		}
		refusedForCaller(t, tr.String()+", a guard's caller", c.Guard(context.Background(), "k", call, Caller(long)))
		if ran != 2 {
			t.Fatalf("%v: the call ran %d times, want 2 (never when refused)", tr, ran)
		}
	}
}

// What goes on the wire, read by an interceptor on the way to a real
// server: the caller and the attempt a guard was given, none without.
func TestAttemptAndCallerGoOnTheWire(t *testing.T) {
	s := startServer(t)
	var mu sync.Mutex
	var sent []*pb.AcquireRequest
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*pb.AcquireRequest); ok {
			mu.Lock()
			sent = append(sent, r)
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c := newClient(t, s, WithCaller("billing"), WithDialOptions(grpc.WithUnaryInterceptor(record)))
	ctx := context.Background()
	if err := c.Guard(ctx, "k", ok); err != nil {
		t.Fatal(err)
	}
	if err := c.Guard(ctx, "k", ok, Attempt(3), Caller("billing-retrier")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 {
		t.Fatalf("want 2 Acquires, saw %d", len(sent))
	}
	if sent[0].Attempt != nil || sent[0].GetCaller() != "billing" {
		t.Fatalf("first: want no attempt and caller billing, got %v", sent[0])
	}
	if sent[1].GetAttempt() != 3 || sent[1].GetCaller() != "billing-retrier" {
		t.Fatalf("second: want attempt 3 and caller billing-retrier, got %v", sent[1])
	}
}

// A key whose retry budget has seen no first attempt denies a retry
// (attempt 2, rule R2: DENIED retry_budget, no hint) and grants a first
// attempt: the attempt reaches the server's budget.
func TestAttemptIsCountedByTheRetryBudget(t *testing.T) {
	s := startServer(t)
	s.setPolicy("budget/*", &pb.Policy{RetryBudget: &pb.RetryBudget{
		Ratio: 0.1, MinPerSecond: 0, Window: durationpb.New(10 * time.Second),
	}})
	for _, tr := range []Transport{TransportUnary, TransportStream} {
		c := newClient(t, s, WithTransport(tr))
		key := "budget/" + tr.String()
		ran := 0
		call := func(context.Context) error { ran++; return nil }
		var denied *DeniedError
		if err := c.Guard(context.Background(), key, call, Attempt(2)); !errors.As(err, &denied) || denied.Reason != "retry_budget" || denied.RetryAfter != 0 {
			t.Fatalf("%v: want DENIED retry_budget without a hint, got %v", tr, err)
		}
		if err := c.Guard(context.Background(), key, call, Attempt(1)); err != nil {
			t.Fatalf("%v: a first attempt: %v", tr, err)
		}
		if ran != 1 {
			t.Fatalf("%v: the call ran %d times, want 1", tr, ran)
		}
	}
}

// On a shadow policy (enforce = false, D1) a retry the budget would deny
// runs, and the call's admission says what it would have been.
func TestAShadowPolicyRunsTheCallAndSaysWhatItWouldHaveBeen(t *testing.T) {
	s := startServer(t)
	enforce := false
	s.setPolicy("dry/*", &pb.Policy{Enforce: &enforce, RetryBudget: &pb.RetryBudget{
		Ratio: 0.1, MinPerSecond: 0, Window: durationpb.New(10 * time.Second),
	}})
	for _, tr := range []Transport{TransportUnary, TransportStream} {
		c := newClient(t, s, WithTransport(tr))
		var adm Admission
		call := func(ctx context.Context) error { adm, _ = AdmissionFrom(ctx); return nil }
		if err := c.Guard(context.Background(), "dry/"+tr.String(), call, Attempt(2)); err != nil {
			t.Fatalf("%v: a shadow policy runs the call: %v", tr, err)
		}
		if adm.Ticket == "" || adm.ShadowDecision != "denied" || adm.ShadowReason != "retry_budget" {
			t.Fatalf("%v: want a shadow ticket, denied retry_budget, got %+v", tr, adm)
		}
	}
}
