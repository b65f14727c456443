package fusebox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
	"github.com/fusebox/fusebox/clients/go/internal/fuseboxtest"
)

// server is a real fusebox started with --manual-clock on port 0.
type server struct {
	t     *testing.T
	cmd   *exec.Cmd
	addr  string
	admin pb.AdminClient
	clock pb.ClockClient
	c     *Client // an extra client for the admin and clock services
	once  sync.Once
}

// startServer starts fusebox ($FUSEBOX_BIN, else ../../target/debug/fusebox)
// with args; without a binary the test is skipped.
func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	cmd, addr := fuseboxtest.Start(t, fuseboxtest.Bin(t, "../.."), args...)
	c, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, cmd: cmd, addr: addr, c: c, admin: c.Admin(), clock: pb.NewClockClient(c.Conn())}
	t.Cleanup(func() { s.c.Close(); s.stop() })
	return s
}

func (s *server) stop() {
	s.once.Do(func() {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	})
}

// pause stops the server process (SIGSTOP) and returns once every one of
// its threads has stopped: its sockets stay open, so calls to it are sent
// and wait, but nothing is answered until resume. A test that ends while
// it is paused resumes it first, so that its clients close at once.
func (s *server) pause() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { s.cmd.Process.Signal(syscall.SIGCONT) })
	waitFor(s.t, "the server stopped", s.stopped)
}

// stopped reports whether every thread of the server is stopped, as
// /proc/PID/task/*/stat says (state T).
func (s *server) stopped() bool {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", s.cmd.Process.Pid))
	if len(stats) == 0 {
		s.t.Fatal("cannot read the server's threads from /proc")
	}
	for _, f := range stats {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that just ended
		}
		// The state follows the command name, which is in parentheses.
		rest := string(raw[bytes.LastIndexByte(raw, ')')+1:])
		if fields := strings.Fields(rest); len(fields) == 0 || (fields[0] != "T" && fields[0] != "t") {
			return false
		}
	}
	return true
}

// resume lets a paused server go on (SIGCONT).
func (s *server) resume() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatal(err)
	}
}

func (s *server) setPolicy(match string, p *pb.Policy) {
	s.t.Helper()
	if _, err := s.admin.SetPolicy(context.Background(), &pb.SetPolicyRequest{Rule: &pb.PolicyRule{Match: match, Policy: p}}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *server) key(k string) *pb.KeyState {
	s.t.Helper()
	st, err := s.admin.GetKey(context.Background(), &pb.GetKeyRequest{Key: k})
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

func (s *server) advance(d time.Duration) {
	s.t.Helper()
	if _, err := s.clock.Advance(context.Background(), &pb.AdvanceRequest{By: durationpb.New(d)}); err != nil {
		s.t.Fatal(err)
	}
}

// testClock is a local clock that the tests move along with the server's
// manual clock.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func breaker(failures uint32, brk time.Duration) *pb.Policy {
	return &pb.Policy{Breaker: &pb.Breaker{
		Mode:          &pb.Breaker_Consecutive{Consecutive: &pb.Consecutive{Failures: failures}},
		BreakDuration: durationpb.New(brk),
	}}
}

func concurrency(permits uint32) *pb.Policy {
	return &pb.Policy{Limiter: &pb.Limiter{Kind: &pb.Limiter_Concurrency{Concurrency: &pb.Concurrency{Permits: permits}}}}
}

// tokenBucket is a bucket of capacity tokens that refills one token an hour:
// on the manual clock, which these tests do not move, never.
func tokenBucket(capacity uint32) *pb.Policy {
	return &pb.Policy{Limiter: &pb.Limiter{Kind: &pb.Limiter_TokenBucket{TokenBucket: &pb.TokenBucket{
		Capacity: capacity, Refill: 1, Period: durationpb.New(time.Hour),
	}}}}
}
