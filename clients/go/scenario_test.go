package fusebox

// The runner of the shared scenarios (../scenarios/*.json, described in
// ../scenarios/README.md): every file is replayed against its own real
// fusebox server with a manual clock, once with each transport (unary
// calls, and frames of a Decide stream). FUSEBOX_SCENARIOS names another
// folder; without the folder the test is skipped.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

type scenario struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Config      string `json:"config"`
	Steps       []step `json:"steps"`
}

type step struct {
	Guard       *guardSpec                 `json:"guard"`
	Await       *string                    `json:"await"`
	Release     *string                    `json:"release"`
	As          *string                    `json:"as"`
	Cancel      *string                    `json:"cancel"`
	WaitRenewed *string                    `json:"wait_renewed"`
	AdvanceMs   *int64                     `json:"advance_ms"`
	Isolate     *string                    `json:"isolate"`
	Close       *string                    `json:"close"`
	ForgetLocal *string                    `json:"forget_local"`
	StopServer  *bool                      `json:"stop_server"`
	ExpectKey   map[string]json.RawMessage `json:"expect_key"`
	Expect      map[string]json.RawMessage `json:"expect"`
}

type guardSpec struct {
	Key           string  `json:"key"`
	Call          string  `json:"call"`
	ID            string  `json:"id"`
	Background    bool    `json:"background"`
	Permits       *uint32 `json:"permits"`
	MaxWaitMs     int64   `json:"max_wait_ms"`
	LeaseMs       int64   `json:"lease_ms"`
	OnUnavailable string  `json:"on_unavailable"`
	Cost          *uint32 `json:"cost"`
}

type guardResult struct {
	ran, unavailable bool
	err              error
}

type running struct {
	expect  map[string]json.RawMessage
	started chan struct{}
	release chan string
	cancel  context.CancelFunc
	done    chan guardResult
	result  *guardResult
}

const stepWait = 5 * time.Second

func scenarioDir() string {
	if d := os.Getenv("FUSEBOX_SCENARIOS"); d != "" {
		return d
	}
	return filepath.Join("..", "scenarios")
}

func TestScenarios(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(scenarioDir(), "*.json"))
	if len(files) == 0 {
		t.Skipf("no scenarios in %s", scenarioDir())
	}
	sort.Strings(files)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var sc scenario
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&sc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		t.Run(sc.Name, func(t *testing.T) {
			for _, tr := range []Transport{TransportUnary, TransportStream} {
				t.Run(tr.String(), func(t *testing.T) { runScenario(t, sc, tr) })
			}
		})
	}
}

func runScenario(t *testing.T, sc scenario, transport Transport) {
	var args []string
	if sc.Config != "" {
		cfg := filepath.Join(t.TempDir(), "fusebox.toml")
		if err := os.WriteFile(cfg, []byte(sc.Config), 0o600); err != nil {
			t.Fatal(err)
		}
		args = []string{"--config", cfg}
	}
	s := startServer(t, args...)
	c := newClient(t, s, WithGuardDefaults(Deadline(2*time.Second)), WithTransport(transport))
	guards := map[string]*running{}
	get := func(id string) *running {
		g, ok := guards[id]
		if !ok {
			t.Fatalf("no guard %q", id)
		}
		return g
	}
	for i, st := range sc.Steps {
		n := 0
		for _, set := range []bool{st.Guard != nil, st.Await != nil, st.Release != nil, st.Cancel != nil,
			st.WaitRenewed != nil, st.AdvanceMs != nil, st.Isolate != nil, st.Close != nil,
			st.ForgetLocal != nil, st.StopServer != nil, st.ExpectKey != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("step %d: want exactly one action, got %d", i, n)
		}
		where := fmt.Sprintf("step %d", i)
		switch {
		case st.Guard != nil:
			if st.Guard.ID == "" && st.Guard.Call == "hang" {
				t.Fatalf("%s: hang needs an id", where)
			}
			g := startGuard(c, st.Guard, st.Expect)
			if st.Guard.ID == "" {
				checkExpect(t, where, g.wait(t), st.Expect)
			} else {
				guards[st.Guard.ID] = g
				if !st.Guard.Background {
					select {
					case <-g.started:
					case r := <-g.done:
						g.result = &r
					case <-time.After(stepWait):
						t.Fatalf("%s: the call did not start", where)
					}
				}
			}
		case st.Await != nil:
			g := get(*st.Await)
			exp := st.Expect
			if exp == nil {
				exp = g.expect
			}
			checkExpect(t, where, g.wait(t), exp)
		case st.Release != nil:
			g := get(*st.Release)
			as := "succeed"
			if st.As != nil {
				as = *st.As
			}
			g.release <- as
			checkExpect(t, where, g.wait(t), g.expect)
		case st.Cancel != nil:
			g := get(*st.Cancel)
			g.cancel()
			exp := st.Expect
			if exp == nil {
				exp = g.expect
			}
			checkExpect(t, where, g.wait(t), exp)
		case st.WaitRenewed != nil:
			get(*st.WaitRenewed)
			base := c.Stats().Renewals
			waitFor(t, where+": two renewals", func() bool { return c.Stats().Renewals >= base+2 })
		case st.AdvanceMs != nil:
			s.advance(time.Duration(*st.AdvanceMs) * time.Millisecond)
		case st.Isolate != nil:
			if _, err := s.admin.Isolate(context.Background(), &pb.IsolateRequest{Key: *st.Isolate, Reason: "scenario"}); err != nil {
				t.Fatal(err)
			}
		case st.Close != nil:
			if _, err := s.admin.Close(context.Background(), &pb.CloseRequest{Key: *st.Close, Reason: "scenario"}); err != nil {
				t.Fatal(err)
			}
		case st.ForgetLocal != nil:
			c.Forget(*st.ForgetLocal)
		case st.StopServer != nil:
			s.stop()
		case st.ExpectKey != nil:
			var last string
			ok := poll(func() bool {
				var mismatch string
				mismatch = keyMismatch(t, s, st.ExpectKey)
				last = mismatch
				return mismatch == ""
			})
			if !ok {
				t.Fatalf("%s: key state: %s", where, last)
			}
		}
	}
	for id, g := range guards { // let nothing hang past the test
		if g.result == nil {
			g.cancel()
			select {
			case <-g.done:
			case <-time.After(stepWait):
				t.Errorf("guard %s did not end", id)
			}
		}
	}
}

func startGuard(c *Client, spec *guardSpec, expect map[string]json.RawMessage) *running {
	ctx, cancel := context.WithCancel(context.Background())
	g := &running{expect: expect, started: make(chan struct{}), release: make(chan string, 1), cancel: cancel, done: make(chan guardResult, 1)}
	var opts []GuardOption
	if spec.Permits != nil {
		opts = append(opts, Permits(*spec.Permits))
	}
	if spec.MaxWaitMs > 0 {
		opts = append(opts, MaxWait(time.Duration(spec.MaxWaitMs)*time.Millisecond))
	}
	if spec.LeaseMs > 0 {
		opts = append(opts, Lease(time.Duration(spec.LeaseMs)*time.Millisecond))
	}
	if spec.Cost != nil {
		if spec.Call != "succeed" {
			panic(fmt.Sprintf("cost needs call succeed, not %q", spec.Call))
		}
		cost := *spec.Cost
		opts = append(opts, WithCost(func(error) (uint32, bool) { return cost, true }))
	}
	switch spec.OnUnavailable {
	case "closed":
		opts = append(opts, OnUnavailable(FailClosed))
	case "open":
		opts = append(opts, OnUnavailable(FailOpen))
	}
	go func() {
		var res guardResult
		res.err = c.Guard(ctx, spec.Key, func(ctx context.Context) error {
			res.ran = true
			if a, _ := AdmissionFrom(ctx); a.FailedOpen {
				res.unavailable = true
			}
			close(g.started)
			switch spec.Call {
			case "succeed":
				return nil
			case "fail":
				return errBoom
			case "cancel":
				cancel()
				<-ctx.Done()
				return ctx.Err()
			case "hang":
				select {
				case as := <-g.release:
					if as == "fail" {
						return errBoom
					}
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return fmt.Errorf("unknown call %q", spec.Call)
		}, opts...)
		var un *UnavailableError
		if errors.As(res.err, &un) {
			res.unavailable = true
		}
		g.done <- res
	}()
	return g
}

func (g *running) wait(t *testing.T) guardResult {
	t.Helper()
	if g.result != nil {
		return *g.result
	}
	select {
	case r := <-g.done:
		g.result = &r
		return r
	case <-time.After(stepWait):
		t.Fatal("the guard did not end")
	}
	return guardResult{}
}

func checkExpect(t *testing.T, where string, r guardResult, exp map[string]json.RawMessage) {
	t.Helper()
	var blocked *BlockedError
	var denied *DeniedError
	var refused *RefusedError
	var unavail *UnavailableError
	refusal := "null"
	var reason Reason
	var retry time.Duration
	switch {
	case errors.As(r.err, &blocked):
		refusal, reason, retry = "blocked", blocked.Reason, blocked.RetryAfter
	case errors.As(r.err, &denied):
		refusal, reason, retry = "denied", denied.Reason, denied.RetryAfter
	case errors.As(r.err, &refused):
		refusal = "refused"
	case errors.As(r.err, &unavail):
		refusal = "unavailable"
	}
	got := map[string]string{
		"ran":         fmt.Sprint(r.ran),
		"refusal":     refusal,
		"reason":      string(reason),
		"local":       fmt.Sprint(blocked != nil && blocked.Local),
		"error":       fmt.Sprint(errors.Is(r.err, errBoom)),
		"cancelled":   fmt.Sprint(errors.Is(r.err, context.Canceled)),
		"unavailable": fmt.Sprint(r.unavailable),
	}
	if retry > 0 {
		got["retry_after_ms"] = fmt.Sprint(retry.Milliseconds())
	} else {
		got["retry_after_ms"] = "null"
	}
	for k, v := range exp {
		g, ok := got[k]
		if !ok {
			t.Fatalf("%s: unknown expect field %q", where, k)
		}
		var want any
		if err := json.Unmarshal(v, &want); err != nil {
			t.Fatal(err)
		}
		w := "null"
		if want != nil {
			w = fmt.Sprint(want)
		}
		if g != w {
			t.Fatalf("%s: %s = %s, want %s (error %v)", where, k, g, w, r.err)
		}
	}
}

var keyFields = map[string]bool{"key": true, "phase": true, "consecutive_failures": true, "live_tickets": true, "waiters": true, "free": true, "stats": true}

func keyMismatch(t *testing.T, s *server, exp map[string]json.RawMessage) string {
	t.Helper()
	var key string
	if err := json.Unmarshal(exp["key"], &key); err != nil {
		t.Fatalf("expect_key needs a key: %v", err)
	}
	st, err := s.admin.GetKey(context.Background(), &pb.GetKeyRequest{Key: key})
	if err != nil {
		return err.Error()
	}
	raw, _ := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(st)
	var got map[string]any
	json.Unmarshal(raw, &got)
	for k, v := range exp {
		if !keyFields[k] {
			t.Fatalf("unknown expect_key field %q", k)
		}
		var want any
		json.Unmarshal(v, &want)
		if k == "stats" {
			stats, _ := got["stats"].(map[string]any)
			for sk, sv := range want.(map[string]any) {
				if fmt.Sprint(stats[sk]) != fmt.Sprint(sv) {
					return fmt.Sprintf("stats.%s = %v, want %v", sk, stats[sk], sv)
				}
			}
			continue
		}
		g := fmt.Sprint(got[k])
		w := fmt.Sprint(want)
		if k == "phase" {
			w = "PHASE_" + strings.ToUpper(w)
		}
		if g != w {
			return fmt.Sprintf("%s = %s, want %s", k, g, w)
		}
	}
	return ""
}

// poll checks cond until it holds or stepWait has passed.
func poll(cond func() bool) bool {
	deadline := time.Now().Add(stepWait)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(cond) {
		t.Fatalf("%s: not within %v", what, stepWait)
	}
}
