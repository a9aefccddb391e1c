// Package chaos is the fault-injection suite of issue 5: each test runs a
// flash sale of real processes (e2e/internal/stack) on an isolated stack,
// injects one fault at a random point, heals it, drains, and asserts I1–I5
// (docs/invariants.md) in MySQL and Redis. The edge limiter's crowd tests
// (ratecrowd_test.go) run a crowd of distinct clients through 2 proxies
// instead, and judge its windows (docs/limiter.md).
//
// Faults local to the test's own processes (kill -9 of a worker or a backend,
// SCRIPT FLUSH, duplicate and poison messages) run in `make test`. Faults that
// disturb the shared services for every other test (RabbitMQ connections
// closed or the app stopped, FLUSHDB, CLIENT PAUSE, a MariaDB restart) run
// only with SECKILL_CHAOS=1, from `make chaos`, which runs this package alone
// and prints the verdict table.
package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
)

// EnvChaos enables the faults that disturb shared services.
const EnvChaos = "SECKILL_CHAOS"

func TestMain(m *testing.M) {
	code := m.Run()
	stack.RemoveBinaries()
	os.Exit(code)
}

// local marks a test whose faults stay inside its own processes.
func local(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("fault injection: builds and runs the binaries")
	}
	t.Parallel()
}

// shared marks a test whose fault disturbs services other tests use: it runs
// only under SECKILL_CHAOS=1 and never in parallel with another test of this
// package (Go runs the parallel tests after every sequential one).
func shared(t *testing.T) {
	t.Helper()
	if os.Getenv(EnvChaos) != "1" {
		t.Skipf("disturbs shared services; run with %s=1 (make chaos)", EnvChaos)
	}
	if testing.Short() {
		t.Skip("fault injection")
	}
}

// saleID gives each test its own activity id (the databases are separate
// anyway; distinct ids make logs easier to read).
func saleID() int64 { return 1000 + rand.Int64N(1_000_000) }

// during runs the crowd in the background and calls inject while it runs.
func during(t *testing.T, s *stack.Stack, c *stack.Crowd, inject func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(s, s.Backends)
	}()
	inject()
	<-done
}

// midSale waits until between lo and hi of the crowd's attempts finished,
// at a random point, so that faults land at different moments.
func midSale(c *stack.Crowd, lo, hi float64) {
	n := c.Size()
	target := int(float64(n) * (lo + rand.Float64()*(hi-lo)))
	deadline := time.Now().Add(time.Minute)
	for c.Done() < target && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := command(t, 2*time.Minute, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// command runs name, killed (with all it started) after bound.
func command(t *testing.T, bound time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	out, err := servicetest.CommandContext(ctx, t, name, args...).CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("not done within %v: %w", bound, err)
	}
	return string(out), err
}

// amqpUp reports whether the broker accepts connections.
func amqpUp() bool {
	c, err := amqp.Dial(servicetest.AMQPURL())
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
