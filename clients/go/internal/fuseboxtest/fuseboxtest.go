// Package fuseboxtest starts a real fusebox server for the tests of the
// client and of its tool: `fusebox serve` on port 0 with a manual clock.
package fuseboxtest

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Bin is $FUSEBOX_BIN, else target/debug/fusebox of the repository, whose
// root is repo (relative to the test's package); without either the test
// is skipped.
func Bin(t testing.TB, repo string) string {
	if b := os.Getenv("FUSEBOX_BIN"); b != "" {
		return b
	}
	b, _ := filepath.Abs(filepath.Join(repo, "target", "debug", "fusebox"))
	if _, err := os.Stat(b); err != nil {
		t.Skip("no fusebox binary: build it with `cargo build` or set FUSEBOX_BIN")
	}
	return b
}

// Start runs bin as `fusebox serve` with gRPC and HTTP on 127.0.0.1 port
// 0, a manual clock and args, and returns the process and the address it
// listens on. The process is killed when the test ends.
func Start(t testing.TB, bin string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	all := append([]string{"serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--manual-clock"}, args...)
	cmd := exec.Command(bin, all...)
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
	return cmd, strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
}
