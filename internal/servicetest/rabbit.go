package servicetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitNode is a RabbitMQ node of one test's own, for faults that would
// disturb every other test on the shared broker (memory alarms, stops).
type RabbitNode struct {
	Name string // Erlang node name, for rabbitmqctl -n
	URL  string // amqp://guest:guest@127.0.0.1:PORT/
	dir  string
}

// StartRabbit starts a node on the first free pair of ports from firstPort
// (AMQP, then Erlang distribution), waits until it accepts connections and
// stops it when the test ends. Without rabbitmq-server the test is skipped,
// or fails under CI.
func StartRabbit(t testing.TB, firstPort int) *RabbitNode {
	t.Helper()
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		unavailable(t, "rabbitmq-server", err)
	}
	var errs []string
	for port := firstPort; port < firstPort+20; port += 2 {
		n, err := startRabbit(t, port)
		if err == nil {
			return n
		}
		errs = append(errs, fmt.Sprintf("port %d: %v", port, err))
		if errors.Is(err, errNoAnswer) {
			break // not a lost port: another try would wait as long again
		}
	}
	t.Fatalf("own RabbitMQ node did not start: %s", strings.Join(errs, "; "))
	return nil
}

func startRabbit(t testing.TB, port int) (*RabbitNode, error) {
	// The server drops to the rabbitmq user: its directory must be writable
	// by it.
	dir, err := os.MkdirTemp("", "seckill-rabbit-")
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o777); err != nil {
			return nil, err
		}
	}
	conf := fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\nloopback_users = none\n", port)
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o666); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins"), []byte("[].\n"), 0o666); err != nil {
		return nil, err
	}
	_ = filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error { return os.Chmod(p, 0o777) })
	n := &RabbitNode{Name: fmt.Sprintf("seckill-test-%d@localhost", port), URL: fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port), dir: dir}
	cmd := Command(t, "rabbitmq-server")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"RABBITMQ_NODENAME="+n.Name,
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", port+1),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
	)
	out, err := os.Create(filepath.Join(dir, "out.txt"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = out.Close(); close(exited) }()
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// The node runs under su -c, in a session of its own: the
		// helper's group kill does not reach it, this stop does.
		_ = CommandContext(ctx, t, "rabbitmqctl", "-n", n.Name, "stop").Run()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = os.RemoveAll(dir)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if c, err := amqp.Dial(n.URL); err == nil {
			_ = c.Close()
			t.Cleanup(stop)
			return n, nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "out.txt"))
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("exited: %s", tail(string(log), 400))
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("%w: no AMQP listener after 2m", errNoAnswer)
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Ctl runs rabbitmqctl against the node.
func (n *RabbitNode) Ctl(t testing.TB, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := CommandContext(ctx, t, "rabbitmqctl", append([]string{"-n", n.Name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
