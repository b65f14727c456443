// Package rls is the acceptance test of fusebox's Envoy rate-limit service
// (RLS v3): a client built from Envoy's own generated stubs
// (go-control-plane) against a real fusebox server started on port 0 from
// $FUSEBOX_BIN (else ../../target/debug/fusebox), with a manual clock.
package rls

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const config = `
[[rls.domain]]
name = "edge"

[[rls.domain.descriptor]]
key = "remote_address"
rate_limit = { unit = "minute", requests_per_unit = 3 }

[[rls.domain.descriptor]]
key = "path"
value = "/api"
rate_limit = { unit = "hour", requests_per_unit = 100, algorithm = "sliding_window" }

  [[rls.domain.descriptor.descriptor]]
  key = "user"
  rate_limit = { unit = "second", requests_per_unit = 2, algorithm = "token_bucket" }

[[rls.domain.descriptor]]
key = "health"
unlimited = true
`

const token = "rls-acceptance-test-token-0123456789"

func bin(t *testing.T) string {
	if b := os.Getenv("FUSEBOX_BIN"); b != "" {
		return b
	}
	b, _ := filepath.Abs(filepath.Join("..", "..", "target", "debug", "fusebox"))
	if _, err := os.Stat(b); err != nil {
		t.Skip("no fusebox binary: build it with `cargo build` or set FUSEBOX_BIN")
	}
	return b
}

// start runs `fusebox serve` on port 0 with text as its config and
// returns a connection to it; the process is killed when the test ends.
func start(t *testing.T, text string, env ...string) *grpc.ClientConn {
	t.Helper()
	return startWith(t, text, nil, env...)
}

// startWith is start with more arguments for `fusebox serve`.
func startWith(t *testing.T, text string, args []string, env ...string) *grpc.ClientConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fusebox.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	all := append([]string{"serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--manual-clock", "--config", path}, args...)
	cmd := exec.Command(bin(t), all...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening on ") {
		t.Fatalf("fusebox did not start: %q %v", line, err)
	}
	go io.Copy(io.Discard, out)
	addr := strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

type entry struct{ k, v string }

func desc(hits *uint64, entries ...entry) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for _, e := range entries {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: e.k, Value: e.v})
	}
	if hits != nil {
		d.HitsAddend = wrapperspb.UInt64(*hits)
	}
	return d
}

func u64(n uint64) *uint64 { return &n }

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// want is one descriptor's expected status; limit 0 means no current_limit.
type want struct {
	code      rlsv3.RateLimitResponse_Code
	limit     uint32
	remaining uint32
	resetSecs int64
}

type step struct {
	name    string
	domain  string
	hits    uint32
	descs   []*rlcommon.RateLimitDescriptor
	overall rlsv3.RateLimitResponse_Code
	want    []want
	err     codes.Code // non-OK: the call must fail with this code
}

// run sends each step to the next of clients in turn and checks its answer.
func run(t *testing.T, ctx context.Context, clients []rlsv3.RateLimitServiceClient, steps []step) {
	t.Helper()
	for n, s := range steps {
		client := clients[n%len(clients)]
		r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: s.domain, Descriptors: s.descs, HitsAddend: s.hits})
		if s.err != codes.OK {
			if status.Code(err) != s.err {
				t.Fatalf("%s: want %v, got %v", s.name, s.err, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if r.OverallCode != s.overall {
			t.Fatalf("%s: overall %v, want %v (%v)", s.name, r.OverallCode, s.overall, r)
		}
		if len(r.Statuses) != len(s.want) {
			t.Fatalf("%s: %d statuses, want %d", s.name, len(r.Statuses), len(s.want))
		}
		for i, w := range s.want {
			got := r.Statuses[i]
			if got.Code != w.code {
				t.Fatalf("%s: status %d code %v, want %v", s.name, i, got.Code, w.code)
			}
			if w.limit == 0 {
				if got.CurrentLimit != nil {
					t.Fatalf("%s: status %d has a limit %v", s.name, i, got.CurrentLimit)
				}
				continue
			}
			if got.CurrentLimit.GetRequestsPerUnit() != w.limit || got.LimitRemaining != w.remaining {
				t.Fatalf("%s: status %d limit %d remaining %d, want %d and %d", s.name, i,
					got.CurrentLimit.GetRequestsPerUnit(), got.LimitRemaining, w.limit, w.remaining)
			}
			if w.resetSecs >= 0 && got.DurationUntilReset.GetSeconds() != w.resetSecs {
				t.Fatalf("%s: status %d resets in %v, want %d s", s.name, i, got.DurationUntilReset.AsDuration(), w.resetSecs)
			}
		}
	}
}

// The table: at clock 0, so a minute window resets in 60 s.
func table() []step {
	ip := func(v string) *rlcommon.RateLimitDescriptor { return desc(nil, entry{"remote_address", v}) }
	api := desc(nil, entry{"path", "/api"})
	user := func(hits *uint64) *rlcommon.RateLimitDescriptor {
		return desc(hits, entry{"path", "/api"}, entry{"user", "ann"})
	}
	own := func(n uint32) *rlcommon.RateLimitDescriptor {
		d := ip("c")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	return []step{
		{name: "first", domain: "edge", descs: []*rlcommon.RateLimitDescriptor{ip("a"), api},
			overall: ok, want: []want{{ok, 3, 2, 60}, {ok, 100, 99, -1}}},
		{name: "request hits_addend 2", domain: "edge", hits: 2, descs: []*rlcommon.RateLimitDescriptor{ip("a")},
			overall: ok, want: []want{{ok, 3, 0, 60}}},
		{name: "over: nothing charged", domain: "edge", descs: []*rlcommon.RateLimitDescriptor{ip("a"), api},
			overall: over, want: []want{{over, 3, 0, 60}, {ok, 100, 99, -1}}},
		{name: "another value, its own counter", domain: "edge", descs: []*rlcommon.RateLimitDescriptor{ip("b")},
			overall: ok, want: []want{{ok, 3, 2, 60}}},
		{name: "descriptor hits_addend wins", domain: "edge", hits: 5, descs: []*rlcommon.RateLimitDescriptor{user(u64(2))},
			overall: ok, want: []want{{ok, 2, 0, -1}}},
		{name: "descriptor hits_addend 0 checks", domain: "edge", descs: []*rlcommon.RateLimitDescriptor{user(u64(0))},
			overall: over, want: []want{{over, 2, 0, -1}}},
		{name: "a descriptor's own limit", domain: "edge", descs: []*rlcommon.RateLimitDescriptor{own(1)},
			overall: ok, want: []want{{ok, 1, 0, 60}}},
		{name: "its own counter, over", domain: "edge", descs: []*rlcommon.RateLimitDescriptor{own(1)},
			overall: over, want: []want{{over, 1, 0, 60}}},
		{name: "an override of 0", domain: "edge", descs: []*rlcommon.RateLimitDescriptor{own(0)},
			err: codes.InvalidArgument},
		{name: "unlimited and unmatched", domain: "edge",
			descs:   []*rlcommon.RateLimitDescriptor{desc(nil, entry{"health", "x"}), desc(nil, entry{"path", "/other"})},
			overall: ok, want: []want{{code: ok}, {code: ok}}},
		{name: "unknown domain", domain: "nowhere", descs: []*rlcommon.RateLimitDescriptor{ip("a")},
			overall: ok, want: []want{{code: ok}}},
		{name: "an over-long value is counted at its digest's key", domain: "edge", descs: []*rlcommon.RateLimitDescriptor{ip(strings.Repeat("x", 129))},
			overall: ok, want: []want{{ok, 3, 2, 60}}},
		{name: "the same over-long value, the same counter", domain: "edge", descs: []*rlcommon.RateLimitDescriptor{ip(strings.Repeat("x", 129))},
			overall: ok, want: []want{{ok, 3, 1, 60}}},
		{name: "empty domain", domain: "", descs: []*rlcommon.RateLimitDescriptor{ip("a")}, err: codes.InvalidArgument},
		{name: "no descriptors", domain: "edge", err: codes.InvalidArgument},
	}
}

func TestTable(t *testing.T) {
	conn := start(t, config)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run(t, ctx, []rlsv3.RateLimitServiceClient{rlsv3.NewRateLimitServiceClient(conn)}, table())
}

func TestAuth(t *testing.T) {
	text := config + `
[auth]
[[auth.token]]
name = "envoy"
role = "caller"
env = "FUSEBOX_RLS_TOKEN"
[[auth.token]]
name = "other"
role = "caller"
prefixes = ["elsewhere/*"]
env = "FUSEBOX_RLS_OTHER_TOKEN"
`
	conn := start(t, text, "FUSEBOX_RLS_TOKEN="+token, "FUSEBOX_RLS_OTHER_TOKEN="+token+"-other")
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc(nil, entry{"remote_address", "a"})}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		name string
		auth string
		code codes.Code
	}{
		{"no token", "", codes.Unauthenticated},
		{"bad token", "Bearer not-a-token-the-server-knows", codes.Unauthenticated},
		{"token without the keys", "Bearer " + token + "-other", codes.PermissionDenied},
		{"good token", "Bearer " + token, codes.OK},
	} {
		call := ctx
		if c.auth != "" {
			call = metadata.AppendToOutgoingContext(ctx, "authorization", c.auth)
		}
		_, err := client.ShouldRateLimit(call, req)
		if status.Code(err) != c.code {
			t.Fatalf("%s: want %v, got %v", c.name, c.code, err)
		}
	}
}
