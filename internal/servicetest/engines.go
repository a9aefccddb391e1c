package servicetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Environment variables naming a running engine (make cluster / make
// sentinel print the URL) that Cluster and Sentinel reuse.
const (
	EnvClusterURL  = "SECKILL_TEST_REDIS_CLUSTER_URL"
	EnvSentinelURL = "SECKILL_TEST_REDIS_SENTINEL_URL"
)

// Engine is a local Redis Cluster or Sentinel set started by
// scripts/redis-engines.sh for one test.
type Engine struct {
	URL  string
	Dir  string // pid, log and config files
	kind string
}

// Cluster is a Redis Cluster for tests that only use it (not fault it): the
// one named by SECKILL_TEST_REDIS_CLUSTER_URL, else one of the test's own.
func Cluster(t testing.TB, firstPort int) string {
	t.Helper()
	if u := os.Getenv(EnvClusterURL); u != "" {
		return u
	}
	return StartCluster(t, firstPort).URL
}

// Sentinel is Cluster for a Sentinel-managed master.
func Sentinel(t testing.TB, firstPort int) string {
	t.Helper()
	if u := os.Getenv(EnvSentinelURL); u != "" {
		return u
	}
	return StartSentinel(t, firstPort).URL
}

// StartCluster starts a Redis Cluster of 3 masters and 3 replicas of the
// test's own on the first free ports from firstPort (and their bus ports,
// +100), stopped when the test ends. A cluster that cannot start skips the
// test, or fails it under CI.
func StartCluster(t testing.TB, firstPort int) *Engine {
	t.Helper()
	return startEngine(t, "cluster", firstPort)
}

// StartSentinel starts 1 master, 1 replica and 3 Sentinels (master name
// "seckill") of the test's own; as StartCluster.
func StartSentinel(t testing.TB, firstPort int) *Engine {
	t.Helper()
	return startEngine(t, "sentinel", firstPort)
}

// repoScript is the path of scripts/<name> in this repository.
func repoScript(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", name)
}

func enginesScript() string { return repoScript("redis-engines.sh") }

func startEngine(t testing.TB, kind string, firstPort int) *Engine {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		unavailable(t, "redis-server", err)
	}
	e := &Engine{Dir: t.TempDir(), kind: kind}
	var out []byte
	var err error
	// Two tests may race for the same free ports: the loser's servers fail
	// to bind and the script gives up; try further up.
	// Each try is bounded: the script's own waits are (a few seconds), but
	// not every redis-cli call in it.
	for try := 0; try < 3; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := CommandContext(ctx, t, "bash", enginesScript(), kind, "start")
		cmd.Env = append(os.Environ(), "ENGINE_DIR="+e.Dir, "ENGINE_PORT="+strconv.Itoa(firstPort+try*37))
		out, err = cmd.CombinedOutput()
		if ctx.Err() != nil {
			err = fmt.Errorf("not done within 2m: %w", err)
		}
		cancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		unavailable(t, "redis "+kind, fmt.Errorf("%v: %s", err, out))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	e.URL = lines[len(lines)-1]
	t.Cleanup(func() {
		// The servers daemonize (their own sessions): only this stops them.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := CommandContext(ctx, t, "bash", enginesScript(), kind, "stop")
		cmd.Env = append(os.Environ(), "ENGINE_DIR="+e.Dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("stop redis %s (bound 1m): %v: %s", kind, err, out)
		}
	})
	return e
}

// Pid is the pid of the engine's server on port.
func (e *Engine) Pid(t testing.TB, port int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.Dir, strconv.Itoa(port)+".pid"))
	Must(t, err, "pid file of port %d", port)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	Must(t, err, "pid of port %d", port)
	return pid
}

// Restart starts the server of port again with the configuration it had (a
// killed cluster node rejoins as a replica; a killed Sentinel-set master is
// reconfigured by the Sentinels).
func (e *Engine) Restart(t testing.TB, port int) {
	t.Helper()
	p := strconv.Itoa(port)
	args := []string{"--port", p, "--bind", "127.0.0.1", "--protected-mode", "no", "--save", "", "--appendonly", "no",
		"--shutdown-timeout", "0", "--repl-diskless-sync-delay", "0", "--daemonize", "yes", "--dir", e.Dir, "--pidfile", filepath.Join(e.Dir, p+".pid"), "--logfile", filepath.Join(e.Dir, p+".log")}
	if e.kind == "cluster" {
		args = append(args, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(port+100), "--cluster-config-file", filepath.Join(e.Dir, "nodes-"+p+".conf"),
			"--cluster-node-timeout", "2000")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := CommandContext(ctx, t, "redis-server", args...).CombinedOutput(); err != nil {
		t.Fatalf("restart redis-server %d (bound 30s): %v: %s", port, err, out)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + p})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted redis-server %d does not answer: %v", port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
