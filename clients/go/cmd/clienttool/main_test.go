package main

// The tool runs as a subprocess against a real fusebox (--manual-clock,
// port 0): the test binary itself, which runs main when
// CLIENTTOOL_RUN_MAIN=1 (see TestMain), so no separate build is needed.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
	"github.com/fusebox/fusebox/clients/go/internal/fuseboxtest"
)

func TestMain(m *testing.M) {
	if os.Getenv("CLIENTTOOL_RUN_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

const limit = 30 * time.Second

// One failure opens svc/* for 10 s; other keys have the default policy.
const config = "[[rule]]\nmatch = \"svc/*\"\nbreaker = { mode = \"consecutive\", failures = 1, break = \"10s\" }\n"

// startServer starts fusebox ($FUSEBOX_BIN, else the repository's
// target/debug/fusebox) with config and returns its address; without a
// binary the test is skipped.
func startServer(t *testing.T, config string) string {
	t.Helper()
	var args []string
	if config != "" {
		file := filepath.Join(t.TempDir(), "fusebox.toml")
		if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", file)
	}
	_, addr := fuseboxtest.Start(t, fuseboxtest.Bin(t, "../../../.."), args...)
	return addr
}

// tool is the client tool as a subprocess (this test binary running main).
func tool(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "CLIENTTOOL_RUN_MAIN=1")
	cmd.Stderr = os.Stderr
	return cmd
}

type workerProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan map[string]any
}

func startWorker(t *testing.T, addr string) *workerProc {
	t.Helper()
	cmd := tool("worker", "--target", addr)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &workerProc{t: t, cmd: cmd, stdin: stdin, events: make(chan map[string]any, 100)}
	go func() {
		defer close(w.events)
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			var ev map[string]any
			if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
				ev = map[string]any{"not_json": lines.Text()}
			}
			w.events <- ev
		}
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return w
}

func (w *workerProc) send(command string) {
	w.t.Helper()
	if _, err := io.WriteString(w.stdin, command+"\n"); err != nil {
		w.t.Fatal(err)
	}
}

// expect reads the next event and checks that it has every field of want
// (a JSON object).
func (w *workerProc) expect(want string) map[string]any {
	w.t.Helper()
	var fields map[string]any
	if err := json.Unmarshal([]byte(want), &fields); err != nil {
		w.t.Fatal(err)
	}
	select {
	case ev, ok := <-w.events:
		if !ok {
			w.t.Fatalf("the worker's output ended; wanted %s", want)
		}
		for k, v := range fields {
			if !reflect.DeepEqual(ev[k], v) {
				w.t.Fatalf("%s = %v in %v, want %s", k, ev[k], ev, want)
			}
		}
		return ev
	case <-time.After(limit):
		w.t.Fatalf("no event within %v; wanted %s", limit, want)
	}
	return nil
}

var doneFields = []string{"error", "event", "id", "local", "ran", "reason", "refusal", "retry_after_ms", "unavailable"}

// done checks a done event's fields (all there, and those of want).
func (w *workerProc) done(id, want string) {
	w.t.Helper()
	ev := w.expect(fmt.Sprintf(`{"event":"done","id":%q}`, id))
	var names []string
	for k := range ev {
		names = append(names, k)
	}
	sort.Strings(names)
	if !reflect.DeepEqual(names, doneFields) {
		w.t.Fatalf("done fields %v, want %v", names, doneFields)
	}
	var fields map[string]any
	if err := json.Unmarshal([]byte(want), &fields); err != nil {
		w.t.Fatal(err)
	}
	for k, v := range fields {
		if !reflect.DeepEqual(ev[k], v) {
			w.t.Fatalf("%s: %s = %v in %v, want %s", id, k, ev[k], ev, want)
		}
	}
}

func (w *workerProc) guard(id, key, call string, runs bool, want string) {
	w.t.Helper()
	w.send(fmt.Sprintf(`{"op":"guard","id":%q,"key":%q,"call":%q}`, id, key, call))
	if runs {
		w.expect(fmt.Sprintf(`{"event":"running","id":%q}`, id))
	}
	w.done(id, want)
}

func (w *workerProc) exitCode() int {
	w.t.Helper()
	w.stdin.Close()
	done := make(chan error, 1)
	go func() {
		for range w.events { // the rest of the output
		}
		done <- w.cmd.Wait()
	}()
	select {
	case <-done:
	case <-time.After(limit):
		w.t.Fatalf("the worker did not exit within %v", limit)
	}
	return w.cmd.ProcessState.ExitCode()
}

// adminOf is the Admin service of the server at addr, on a connection of
// its own.
func adminOf(t *testing.T, addr string) pb.AdminClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewAdminClient(conn)
}

func TestWorkerProtocol(t *testing.T) {
	addr := startServer(t, config)
	w := startWorker(t, addr)
	w.expect(`{"event":"ready","lang":"go"}`)

	w.guard("g1", "other/a", "succeed", true,
		`{"ran":true,"refusal":null,"reason":null,"retry_after_ms":null,"local":false,"error":false,"unavailable":false}`)

	w.send(`{"op":"guard","id":"g2","key":"other/a","call":"hang"}`)
	w.expect(`{"event":"running","id":"g2"}`)
	w.send(`{"op":"release","id":"g2"}`)
	w.done("g2", `{"ran":true,"refusal":null,"error":false}`)

	w.guard("g3", "svc/a", "fail", true, `{"ran":true,"refusal":null,"error":true}`)
	// The outcome is reported in the background: wait until fusebox has it
	// (svc/a open) before the next Acquire, as the fleet test does.
	admin := adminOf(t, addr)
	end := time.Now().Add(limit)
	for {
		state, err := admin.GetKey(context.Background(), &pb.GetKeyRequest{Key: "svc/a"})
		if err == nil && state.GetPhase() == pb.Phase_PHASE_OPEN {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the failure did not open svc/a within %v: %v %v", limit, state, err)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, bounded by limit
	}
	w.guard("g4", "svc/a", "succeed", false,
		`{"ran":false,"refusal":"blocked","reason":"open","retry_after_ms":10000,"local":false,"error":false}`)
	w.guard("g5", "svc/a", "succeed", false, `{"ran":false,"refusal":"blocked","reason":"open","local":true}`)

	w.send(`{"op":"forget","key":"svc/a"}`)
	w.expect(`{"event":"forgotten","key":"svc/a"}`)
	w.guard("g6", "svc/a", "succeed", false,
		`{"ran":false,"refusal":"blocked","reason":"open","retry_after_ms":10000,"local":false}`)

	// A call still hanging at the end of the input returns a value.
	w.send(`{"op":"guard","id":"g7","key":"other/b","call":"hang"}`)
	w.expect(`{"event":"running","id":"g7"}`)
	w.stdin.Close()
	w.done("g7", `{"ran":true,"refusal":null,"error":false}`)
	if code := w.exitCode(); code != 0 {
		t.Fatalf("exit code %d at the end of the input, want 0", code)
	}
	// It closed its client, which reported every outcome before the exit:
	// one read, no waiting.
	for key, successes := range map[string]uint64{"other/a": 2, "other/b": 1} {
		state, err := admin.GetKey(context.Background(), &pb.GetKeyRequest{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if state.GetStats().GetSuccesses() != successes || state.GetLiveTickets() != 0 {
			t.Fatalf("%s: %v, want %d successes and no live ticket", key, state, successes)
		}
	}

	// A command it cannot read: an error event, exit 1.
	w = startWorker(t, addr)
	w.expect(`{"event":"ready"}`)
	w.send(`{"op":"guard","id":"g1","key":"other/a","call":"explode"}`)
	ev := w.expect(`{"event":"error"}`)
	if _, ok := ev["message"].(string); !ok {
		t.Fatalf("an error event has a message: %v", ev)
	}
	if code := w.exitCode(); code != 1 {
		t.Fatalf("exit code %d after a bad command, want 1", code)
	}
}

func TestBench(t *testing.T) {
	addr := startServer(t, "")
	cmd := tool("bench", "--target", addr, "--key", "bench/tool", "--iterations", "50")
	ctx, cancel := context.WithTimeout(context.Background(), 2*limit)
	defer cancel()
	go func() { <-ctx.Done(); cmd.Process.Kill() }()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("bench wrote %d lines, want 1: %q", len(lines), out)
	}
	var line struct {
		Lang       string
		Iterations int
		RawUs      map[string]float64 `json:"raw_us"`
		GuardUs    map[string]float64 `json:"guard_us"`
		Outcomes   map[string]uint64  `json:"outcomes"`
	}
	dec := json.NewDecoder(strings.NewReader(lines[0]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&line); err != nil {
		t.Fatalf("%v: %s", err, lines[0])
	}
	if line.Lang != "go" || line.Iterations != 50 {
		t.Fatalf("lang and iterations: %s", lines[0])
	}
	for unit, s := range map[string]map[string]float64{"raw_us": line.RawUs, "guard_us": line.GuardUs} {
		if len(s) != 2 || s["median"] <= 0 || s["median"] > s["p99"] {
			t.Fatalf("%s: %v in %s", unit, s, lines[0])
		}
	}
	// Every round's two Acquires were granted and completed: 2 × 55.
	want := map[string]uint64{"expected": 110, "reached": 110, "lost": 0, "dropped": 0, "failed": 0}
	if !reflect.DeepEqual(line.Outcomes, want) {
		t.Fatalf("outcomes %v, want %v", line.Outcomes, want)
	}
	state, err := adminOf(t, addr).GetKey(context.Background(), &pb.GetKeyRequest{Key: "bench/tool"})
	if err != nil {
		t.Fatal(err)
	}
	if s := state.GetStats(); s.GetGranted() != 110 || s.GetSuccesses() != 110 || state.GetLiveTickets() != 0 {
		t.Fatalf("granted %d, successes %d, live tickets %d, want 110, 110, 0", s.GetGranted(), s.GetSuccesses(), state.GetLiveTickets())
	}
}
