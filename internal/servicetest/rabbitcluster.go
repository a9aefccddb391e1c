package servicetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RabbitCluster is a 3-node RabbitMQ cluster of one test's own, started by
// scripts/rabbit-cluster.sh (make rabbit-cluster) in a directory of its own.
type RabbitCluster struct {
	// URL names the three nodes (amqp://guest:guest@h:p1,h:p2,h:p3/).
	URL string
	Dir string
	// Started is how long the cluster took to start.
	Started time.Duration
}

func rabbitScript() string { return repoScript("rabbit-cluster.sh") }

// StartRabbitCluster starts the cluster on the first free run of ports from
// firstPort and stops it when the test ends. Without rabbitmq-server the
// test is skipped (fails under CI).
func StartRabbitCluster(t testing.TB, firstPort int) *RabbitCluster {
	t.Helper()
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		unavailable(t, "rabbitmq-server", err)
	}
	// Not t.TempDir: the server drops to the rabbitmq user, which must
	// reach the directory (the script opens it to everyone).
	dir, err := os.MkdirTemp("", "seckill-rabbit-cluster-")
	Must(t, err, "state directory")
	Must(t, os.Chmod(dir, 0o777), "state directory")
	c := &RabbitCluster{Dir: dir}
	t.Cleanup(func() {
		if out, err := c.script("stop"); err != nil {
			t.Errorf("stop the rabbitmq cluster: %v: %s", err, out)
		}
		_ = os.RemoveAll(dir)
	})
	start := time.Now()
	out, err := c.script("start", "RABBIT_PORT="+strconv.Itoa(firstPort))
	if err != nil {
		t.Fatalf("rabbitmq cluster did not start: %v: %s", err, out)
	}
	c.Started = time.Since(start)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	c.URL = lines[len(lines)-1]
	return c
}

func (c *RabbitCluster) script(args ...string) (string, error) {
	var env []string
	for len(args) > 0 && strings.Contains(args[len(args)-1], "=") {
		env = append(env, args[len(args)-1])
		args = args[:len(args)-1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Not Command: the nodes the script starts detach but stay in its
	// process group, which Command kills when the script exits. WaitDelay:
	// a detached node that kept the script's output open cannot hold Wait.
	cmd := exec.CommandContext(ctx, "bash", append([]string{rabbitScript()}, args...)...)
	cmd.WaitDelay = childWaitDelay
	cmd.Env = append(append(os.Environ(), "RABBIT_DIR="+c.Dir), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Addr is node i's (1..3) host:port.
func (c *RabbitCluster) Addr(i int) string {
	hosts := strings.TrimSuffix(strings.SplitN(strings.TrimPrefix(c.URL, "amqp://"), "@", 2)[1], "/")
	return strings.Split(hosts, ",")[i-1]
}

// NodeURL is node i's URL alone.
func (c *RabbitCluster) NodeURL(i int) string { return "amqp://guest:guest@" + c.Addr(i) + "/" }

// Kill kill -9s node i.
func (c *RabbitCluster) Kill(t testing.TB, i int) {
	t.Helper()
	if out, err := c.script("kill", strconv.Itoa(i)); err != nil {
		t.Fatalf("kill node %d: %v: %s", i, err, out)
	}
}

// Restart starts node i again and waits until it runs (it rejoins).
func (c *RabbitCluster) Restart(t testing.TB, i int) {
	t.Helper()
	if out, err := c.script("restart", strconv.Itoa(i)); err != nil {
		t.Fatalf("restart node %d: %v: %s", i, err, out)
	}
}

// Leader is the number (1..3) of the node leading quorum queue q of vhost
// ("/" if empty), or an error while none is known.
func (c *RabbitCluster) Leader(q, vhost string) (int, error) {
	if vhost == "" {
		vhost = "/"
	}
	out, err := c.script("leader", q, vhost)
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, out)
	}
	return strconv.Atoi(strings.TrimSpace(out))
}

// Ctl runs rabbitmqctl against node i.
func (c *RabbitCluster) Ctl(i int, args ...string) (string, error) {
	return c.script(append([]string{"ctl", strconv.Itoa(i)}, args...)...)
}
