package rls

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// freePort is a port the kernel gave out and took back; a server that
// then fails to bind it is started again on another.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// redisCli runs redis-cli against port with args.
func redisCli(port int, args ...string) (string, error) {
	out, err := exec.Command("redis-cli", append([]string{"-p", strconv.Itoa(port)}, args...)...).CombinedOutput()
	return string(out), err
}

// until polls check every 20 ms until it is true, for at most limit.
func until(t *testing.T, what string, limit time.Duration, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startCluster starts three redis-servers with the module
// ($FUSEBOX_REDIS_MODULE) in cluster mode, joins them as three primaries
// and returns the --store URL; they are stopped when the test ends.
// Skipped without the module or the Redis tools.
func startCluster(t *testing.T) string {
	t.Helper()
	module := os.Getenv("FUSEBOX_REDIS_MODULE")
	if module == "" {
		module, _ = filepath.Abs(filepath.Join("..", "..", "target", "debug", "libfusebox_redis.so"))
	}
	if _, err := os.Stat(module); err != nil {
		t.Skip("no Redis module: build it with `cargo build -p fusebox-redis` or set FUSEBOX_REDIS_MODULE")
	}
	for _, tool := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	dir := t.TempDir()
	var ports []int
	for i := 0; i < 3; i++ {
		var port int
		for attempt := 0; ; attempt++ {
			port = freePort(t)
			node := filepath.Join(dir, strconv.Itoa(port))
			os.MkdirAll(node, 0o755)
			cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
				"--dir", node, "--logfile", filepath.Join(node, "redis.log"), "--save", "",
				"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "2000", "--loadmodule", module)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			exited := make(chan struct{})
			go func() { cmd.Wait(); close(exited) }()
			up := false
			deadline := time.Now().Add(10 * time.Second)
			for !up && time.Now().Before(deadline) {
				select {
				case <-exited:
					deadline = time.Now()
				default:
					out, _ := redisCli(port, "PING")
					up = strings.TrimSpace(out) == "PONG"
					if !up {
						time.Sleep(20 * time.Millisecond)
					}
				}
			}
			if up {
				break
			}
			if attempt == 4 {
				t.Fatalf("redis-server on %d did not start", port)
			}
		}
		ports = append(ports, port)
	}
	args := []string{"--cluster", "create"}
	var nodes []string
	for _, p := range ports {
		nodes = append(nodes, fmt.Sprintf("127.0.0.1:%d", p))
	}
	args = append(args, nodes...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	until(t, "cluster_state:ok on every node", 30*time.Second, func() bool {
		for _, p := range ports {
			out, _ := redisCli(p, "CLUSTER", "INFO")
			if !strings.Contains(out, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
	return "redis-cluster://" + strings.Join(nodes, ",")
}

// The same table over two fusebox servers on one Redis Cluster, each step
// through the other server: the counters are the cluster's.
func TestTableOverTwoServersOnACluster(t *testing.T) {
	store := startCluster(t)
	a := startWith(t, config, []string{"--store", store})
	b := startWith(t, config, []string{"--store", store})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run(t, ctx, []rlsv3.RateLimitServiceClient{
		rlsv3.NewRateLimitServiceClient(a),
		rlsv3.NewRateLimitServiceClient(b),
	}, table())
}
