// Command clienttool is the client tool of the Go library (see
// clients/README.md): a worker for the fleet test, and the overhead bench.
//
//	clienttool worker --target HOST:PORT [--token T]
//	clienttool bench  --target HOST:PORT --key KEY --iterations N [--token T]
//
// worker reads JSON-lines commands (guard, release, forget) on standard
// input and writes JSON-lines events (ready, running, done, forgotten,
// error) on standard output, and closes its client (which reports the
// outcomes still queued) at the end of its input. bench times the raw
// stub's Acquire against a guarded no-op (whose outcome is reported in the
// background) on the same connection, checks that every outcome reached
// fusebox, and writes one line of medians, p99s and outcome counts. Logs
// go to standard error.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"google.golang.org/grpc/status"

	fusebox "github.com/fusebox/fusebox/clients/go"
	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

// deadline of calls to fusebox, as the scenario runners use it: a slow
// answer from a busy test server is not an outage.
const deadline = 2000 * time.Millisecond

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage:
  clienttool worker --target HOST:PORT [--token T]
  clienttool bench  --target HOST:PORT --key KEY --iterations N [--token T]
`

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	flags := flag.NewFlagSet("clienttool "+args[0], flag.ContinueOnError)
	flags.SetOutput(stderr)
	target := flags.String("target", "", "fusebox's gRPC address, HOST:PORT")
	token := flags.String("token", "", "sent as `authorization: Bearer TOKEN`")
	switch args[0] {
	case "worker":
		if err := flags.Parse(args[1:]); err != nil || *target == "" || flags.NArg() > 0 {
			fmt.Fprint(stderr, usage)
			return 2
		}
		return worker(*target, *token, stdin, stdout)
	case "bench":
		key := flags.String("key", "", "the key (always granted)")
		iterations := flags.Int("iterations", 0, "timed rounds (after N/10 warm-up rounds)")
		if err := flags.Parse(args[1:]); err != nil || *target == "" || *key == "" || flags.NArg() > 0 {
			fmt.Fprint(stderr, usage)
			return 2
		}
		line, err := bench(*target, *token, *key, *iterations)
		if err != nil {
			fmt.Fprintf(stderr, "clienttool bench: %v\n", err)
			return 1
		}
		out, _ := json.Marshal(line)
		fmt.Fprintf(stdout, "%s\n", out)
		if line.Outcomes.Lost > 0 {
			fmt.Fprintf(stderr, "clienttool bench: %d of %d outcomes did not reach fusebox (%d dropped by the outcome queue, %d failed to send)\n",
				line.Outcomes.Lost, line.Outcomes.Expected, line.Outcomes.Dropped, line.Outcomes.Failed)
			return 1
		}
		return 0
	}
	fmt.Fprint(stderr, usage)
	return 2
}

func newClient(target, token string) (*fusebox.Client, error) {
	opts := []fusebox.Option{fusebox.WithGuardDefaults(fusebox.Deadline(deadline))}
	if token != "" {
		opts = append(opts, fusebox.WithToken(token))
	}
	return fusebox.New(target, opts...)
}

// events writes one JSON object a line, whole lines at once.
type events struct {
	mu  sync.Mutex
	out io.Writer
}

func (e *events) emit(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// A closed standard output leaves nobody to tell.
	_, _ = e.out.Write(append(line, '\n'))
}

// done is the event of a guard that ended, its fields in the README's order.
type done struct {
	Event        string  `json:"event"`
	ID           string  `json:"id"`
	Ran          bool    `json:"ran"`
	Refusal      *string `json:"refusal"`
	Reason       *string `json:"reason"`
	RetryAfterMs *int64  `json:"retry_after_ms"`
	Local        bool    `json:"local"`
	Error        bool    `json:"error"`
	Unavailable  bool    `json:"unavailable"`
}

var errCallFailed = errors.New("the call failed")

func ptr[T any](v T) *T { return &v }

func millis(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	return ptr(d.Milliseconds())
}

// snake turns a gRPC code's name (InvalidArgument) into invalid_argument.
func snake(name string) string {
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) && i > 0 {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

func doneOf(id string, err error, ran, failedOpen bool) done {
	d := done{Event: "done", ID: id, Ran: ran, Unavailable: failedOpen}
	var blocked *fusebox.BlockedError
	var denied *fusebox.DeniedError
	var refused *fusebox.RefusedError
	var unavailable *fusebox.UnavailableError
	var rejected *fusebox.RequestError
	switch {
	case err == nil:
	case errors.Is(err, errCallFailed):
		d.Error = true
	case errors.As(err, &blocked):
		d.Refusal, d.Reason = ptr("blocked"), ptr(string(blocked.Reason))
		d.RetryAfterMs, d.Local = millis(blocked.RetryAfter), blocked.Local
	case errors.As(err, &denied):
		d.Refusal, d.Reason = ptr("denied"), ptr(string(denied.Reason))
		d.RetryAfterMs = millis(denied.RetryAfter)
	case errors.As(err, &refused):
		d.Refusal = ptr("refused")
	case errors.As(err, &unavailable):
		d.Refusal, d.Unavailable = ptr("unavailable"), true
	case errors.As(err, &rejected):
		// Not a refusal: fusebox rejected the request itself (a bad key,
		// a missing token); the reason is the gRPC code's name.
		d.Refusal, d.Reason = ptr("rejected"), ptr(snake(status.Code(rejected.Err).String()))
	default:
		d.Refusal, d.Reason = ptr("rejected"), ptr(err.Error())
	}
	return d
}

// command is one checked input line.
type command struct {
	op, id, key, call string
}

var knownFields = map[string][]string{
	"guard":   {"op", "id", "key", "call"},
	"release": {"op", "id"},
	"forget":  {"op", "key"},
}

func parse(line []byte) (command, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil {
		return command{}, fmt.Errorf("not a JSON object: %v", err)
	}
	str := func(name string) (string, error) {
		raw, ok := fields[name]
		if !ok {
			return "", fmt.Errorf("%s is missing", name)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("%s must be a string, not %s", name, raw)
		}
		return s, nil
	}
	op, err := str("op")
	if err != nil {
		return command{}, err
	}
	known, ok := knownFields[op]
	if !ok {
		return command{}, fmt.Errorf("unknown op %q", op)
	}
	for name := range fields {
		if !contains(known, name) {
			return command{}, fmt.Errorf("%s: unknown field %q", op, name)
		}
	}
	c := command{op: op}
	for _, name := range known[1:] {
		v, err := str(name)
		if err != nil {
			return command{}, err
		}
		switch name {
		case "id":
			c.id = v
		case "key":
			c.key = v
		case "call":
			c.call = v
		}
	}
	if op == "guard" && c.call != "succeed" && c.call != "fail" && c.call != "hang" {
		return command{}, fmt.Errorf("unknown call %q", c.call)
	}
	return c, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func worker(target, token string, stdin io.Reader, stdout io.Writer) int {
	out := &events{out: stdout}
	c, err := newClient(target, token)
	if err != nil {
		out.emit(map[string]string{"event": "error", "message": err.Error()})
		return 1
	}
	out.emit(map[string]string{"event": "ready", "lang": "go"})

	// Every id a guard command started: its release channel, nil once used.
	releases := map[string]chan struct{}{}
	var wg sync.WaitGroup
	// After an error the process exits at once: guards still running are
	// left as they are.
	fail := func(message string) int {
		out.emit(map[string]string{"event": "error", "message": message})
		return 1
	}
	in := bufio.NewReader(stdin)
	for {
		line, readErr := in.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			cmd, err := parse(line)
			if err != nil {
				return fail(fmt.Sprintf("%v: %s", err, bytes.TrimSpace(line)))
			}
			switch cmd.op {
			case "guard":
				if _, used := releases[cmd.id]; used {
					return fail(fmt.Sprintf("guard id %q used twice", cmd.id))
				}
				release := make(chan struct{})
				releases[cmd.id] = release
				wg.Add(1)
				go func() {
					defer wg.Done()
					guard(c, out, cmd, release)
				}()
			case "release":
				release, ok := releases[cmd.id]
				if !ok {
					return fail(fmt.Sprintf("release: no guard %q", cmd.id))
				}
				// A call that already ended (or is not a hang) ignores it.
				if release != nil {
					close(release)
					releases[cmd.id] = nil
				}
			case "forget":
				c.Forget(cmd.key)
				out.emit(map[string]string{"event": "forgotten", "key": cmd.key})
			}
		}
		if readErr == io.EOF {
			break
		}
		if readErr != nil {
			return fail("reading standard input: " + readErr.Error())
		}
	}
	// The end of the input: calls still hanging return a value.
	for _, release := range releases {
		if release != nil {
			close(release)
		}
	}
	wg.Wait()
	// Close reports the outcomes still queued before the process exits.
	if err := c.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "clienttool worker: closing the client: %v\n", err)
	}
	return 0
}

// guard runs one guarded call and writes its running and done events.
func guard(c *fusebox.Client, out *events, cmd command, release <-chan struct{}) {
	ran, failedOpen := false, false
	err := c.Guard(context.Background(), cmd.key, func(ctx context.Context) error {
		ran = true
		if a, ok := fusebox.AdmissionFrom(ctx); ok && a.FailedOpen {
			failedOpen = true
		}
		out.emit(map[string]string{"event": "running", "id": cmd.id})
		switch cmd.call {
		case "fail":
			return errCallFailed
		case "hang":
			<-release // released, or the worker is ending: a value
		}
		return nil
	})
	out.emit(doneOf(cmd.id, err, ran, failedOpen))
}

type summary struct {
	Median float64 `json:"median"`
	P99    float64 `json:"p99"`
}

type benchLine struct {
	Lang       string   `json:"lang"`
	Iterations int      `json:"iterations"`
	RawUs      summary  `json:"raw_us"`
	GuardUs    summary  `json:"guard_us"`
	Outcomes   outcomes `json:"outcomes"`
}

// outcomes says whether every unit's outcome reached fusebox.
type outcomes struct {
	Expected uint64 `json:"expected"` // every raw and guard unit's, warm-up included
	Reached  uint64 `json:"reached"`  // how much the key's successes grew
	Lost     uint64 `json:"lost"`     // expected minus reached
	Dropped  uint64 `json:"dropped"`  // the client's Stats.OutcomesDropped
	Failed   uint64 `json:"failed"`   // the client's Stats.CompleteFailures
}

// quantile is the sample at q (nearest rank) of sorted samples, in µs
// rounded to 0.1.
func quantile(sorted []time.Duration, q float64) float64 {
	rank := int(math.Ceil(q * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	us := float64(sorted[rank-1].Nanoseconds()) / 1000
	return math.Round(us*10) / 10
}

func summarize(samples []time.Duration) summary {
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	return summary{Median: quantile(samples, 0.5), P99: quantile(samples, 0.99)}
}

// flushWithin bounds the final flush: every outcome's send has a deadline
// of its own, so this is only a guard against a server that stopped.
const flushWithin = time.Minute

func bench(target, token, key string, iterations int) (benchLine, error) {
	if iterations < 1 {
		return benchLine{}, errors.New("--iterations must be at least 1")
	}
	c, err := newClient(target, token)
	if err != nil {
		return benchLine{}, err
	}
	defer c.Close()
	// The raw stub on the guard's own connection (which carries the token).
	raw := pb.NewFuseboxClient(c.Conn())
	ctx := context.Background()
	successes := func() (uint64, error) {
		state, err := c.Admin().GetKey(ctx, &pb.GetKeyRequest{Key: key})
		if err != nil {
			return 0, fmt.Errorf("Admin.GetKey(%s): %w", key, err)
		}
		return state.GetStats().GetSuccesses(), nil
	}
	before, err := successes()
	if err != nil {
		return benchLine{}, err
	}
	noop := func(context.Context) error { return nil }
	// One round trip, timed; its Complete is awaited so that it does not
	// overlap the next unit, but not timed.
	rawUnit := func() (time.Duration, error) {
		start := time.Now()
		resp, err := raw.Acquire(ctx, &pb.AcquireRequest{Key: key})
		took := time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("Acquire: %w", err)
		}
		if resp.GetDecision() != pb.Decision_DECISION_GRANTED {
			return 0, fmt.Errorf("%s was not granted: %v", key, resp)
		}
		if _, err := raw.Complete(ctx, &pb.CompleteRequest{Ticket: resp.GetTicket(), Outcome: pb.Outcome_OUTCOME_SUCCESS}); err != nil {
			return 0, fmt.Errorf("Complete: %w", err)
		}
		return took, nil
	}
	// The guard's outcome is reported in the background: nothing is
	// flushed between rounds.
	guardUnit := func() (time.Duration, error) {
		start := time.Now()
		if err := c.Guard(ctx, key, noop); err != nil {
			return 0, fmt.Errorf("the guard: %w", err)
		}
		return time.Since(start), nil
	}
	warmup := iterations / 10
	rawUs := make([]time.Duration, 0, iterations)
	guardUs := make([]time.Duration, 0, iterations)
	for round := 0; round < warmup+iterations; round++ {
		var rawTook, guardTook time.Duration
		for unit := 0; unit < 2; unit++ {
			var err error
			if (unit == 0) == (round%2 == 0) {
				rawTook, err = rawUnit()
			} else {
				guardTook, err = guardUnit()
			}
			if err != nil {
				return benchLine{}, err
			}
		}
		if round >= warmup {
			rawUs = append(rawUs, rawTook)
			guardUs = append(guardUs, guardTook)
		}
	}
	if n := c.Stats().Unavailable; n > 0 {
		return benchLine{}, fmt.Errorf("fusebox was unavailable to the guard %d times: its timings would not be a guard's", n)
	}
	fctx, cancel := context.WithTimeout(ctx, flushWithin)
	err = c.Flush(fctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "clienttool bench: the guards' outcomes were not all reported within %v: %v\n", flushWithin, err)
	}
	after, err := successes()
	if err != nil {
		return benchLine{}, err
	}
	st := c.Stats()
	o := outcomes{
		Expected: 2 * uint64(warmup+iterations),
		Reached:  after - before,
		Dropped:  st.OutcomesDropped,
		Failed:   st.CompleteFailures,
	}
	if o.Reached < o.Expected {
		o.Lost = o.Expected - o.Reached
	}
	return benchLine{Lang: "go", Iterations: iterations, RawUs: summarize(rawUs), GuardUs: summarize(guardUs), Outcomes: o}, nil
}
