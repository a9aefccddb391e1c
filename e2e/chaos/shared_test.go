package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
)

// Fault 3a: rabbitmqctl close_all_connections, twice mid-sale. Publishers
// treat what was outstanding as unconfirmed (release → 503, or 202 when a
// worker already claimed it), reconnect; consumers re-subscribe; the broker
// redelivers what was unacked.
func TestRabbitCloseAllConnections(t *testing.T) {
	shared(t)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3, Config: stack.Fast("")})
	sale := s.CreateSale(t, saleID(), 1200, 2) // the crowd never sells out: the fault lands mid-sale
	c := stack.NewCrowd(sale, 500, 3, "cac")
	c.Spread = 4 * time.Second
	during(t, s, c, func() {
		for i := range 2 {
			midSale(c, 0.1+float64(i)*0.35, 0.35+float64(i)*0.35)
			run(t, "rabbitmqctl", "close_all_connections", "seckill chaos test")
		}
	})
	c.ExpectContract(t, true)
	s.Finish(t, "rabbitmq close_all_connections ×2", sale, c)
}

// Fault 3b: RabbitMQ stop_app for 2s mid-sale, then start_app.
func TestRabbitStopStartApp(t *testing.T) {
	shared(t)
	t.Cleanup(func() { healRabbit(t) })
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3, Config: stack.Fast("")})
	sale := s.CreateSale(t, saleID(), 1200, 2)
	c := stack.NewCrowd(sale, 500, 3, "ssa")
	c.Spread = 6 * time.Second
	during(t, s, c, func() {
		midSale(c, 0.15, 0.4)
		run(t, "rabbitmqctl", "stop_app")
		time.Sleep(2 * time.Second)
		healRabbit(t)
	})
	c.ExpectContract(t, true)
	if a := c.Answers(); a["503 unavailable"] == 0 {
		t.Errorf("no 503 while the broker was stopped: the fault missed the sale (%v)", a)
	}
	s.Finish(t, "rabbitmq stop_app/start_app", sale, c)
}

func healRabbit(t *testing.T) {
	if amqpUp() {
		return
	}
	// Errors aside: whether the broker is back is what the loop checks.
	_, _ = command(t, time.Minute, "rabbitmqctl", "start_app")
	_, _ = command(t, time.Minute, "rabbitmqctl", "await_startup")
	deadline := time.Now().Add(2 * time.Minute)
	for !amqpUp() {
		if time.Now().After(deadline) {
			t.Errorf("RabbitMQ did not come back within 2m")
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Fault 4b: FLUSHDB of the sale's Redis (a redis-server of the test's own),
// twice mid-sale, with keyed retries in flight: no key may get two orders
// that both confirm, and Redis never sells more than MySQL holds once
// rebuilt (the verdict: I1–I5 and the ledger). The backend rebuilds the
// sale from MySQL (single flight) and must never answer 404 or sold out
// meanwhile (unknown keys get 503 while the sale recovers): the crowd asks
// for fewer units than the stock, so "sold out" would be a lie. Orders in
// flight settle against MySQL's guard; the reconciler repairs the counters.
func TestRedisFlushDB(t *testing.T) {
	shared(t)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3, RedisURL: servicetest.StartRedis(t, 42400), Config: stack.Fast("")})
	s.RedisLost = true
	sale := s.CreateSale(t, saleID(), 1000, 1)
	c := stack.NewCrowd(sale, 600, 2, "fdb") // at most 600 units wanted of 1000
	c.Spread = 4 * time.Second
	during(t, s, c, func() {
		for i := range 2 {
			midSale(c, 0.1+float64(i)*0.4, 0.4+float64(i)*0.4)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			servicetest.Must(t, s.Redis.FlushDB(ctx).Err(), "FLUSHDB")
			cancel()
		}
	})
	for _, a := range c.Attempts {
		for _, x := range a.Answers {
			if strings.HasPrefix(x, "404") || x == "409 sold_out" || x == "409 insufficient_stock" {
				t.Errorf("%s key %s: %s while most of the stock was left (answers %v)", a.User, a.Key, x, a.Answers)
			}
		}
	}
	c.ExpectContract(t, false)
	s.Finish(t, "redis FLUSHDB ×2", sale, c)
}

// Fault 4c: CLIENT PAUSE for 3s, far beyond the backend's 200ms Redis timeout
// and the client's 500ms read timeout. Requests meanwhile get 503 (nothing
// kept) and are retried; nothing is lost or double-sold.
func TestRedisClientPause(t *testing.T) {
	shared(t)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3, Config: stack.Fast("")})
	unpause := func() {
		opt, err := redis.ParseURL(servicetest.RedisURL())
		if err != nil {
			return
		}
		r := redis.NewClient(opt)
		defer r.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Do(ctx, "CLIENT", "UNPAUSE").Err()
	}
	t.Cleanup(unpause)
	sale := s.CreateSale(t, saleID(), 1200, 2)
	c := stack.NewCrowd(sale, 500, 3, "cp")
	c.Spread = 5 * time.Second
	during(t, s, c, func() {
		midSale(c, 0.15, 0.4)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		servicetest.Must(t, s.Redis.Do(ctx, "CLIENT", "PAUSE", 3000, "ALL").Err(), "CLIENT PAUSE")
		cancel()
		time.Sleep(3 * time.Second)
		unpause()
	})
	c.ExpectContract(t, true)
	n503 := c.Answers()["503 unavailable"]
	if n503 == 0 {
		t.Errorf("no 503 during a 3s pause: the fault missed the sale")
	}
	t.Logf("%d answers were 503 during the pause", n503)
	s.Finish(t, "redis CLIENT PAUSE 3s", sale, c)
}

// Fault 5: MariaDB restarted while the workers drain a backlog. Workers stop
// acking, back off and resume; nothing is acked before its commit.
func TestMariaDBRestartMidDrain(t *testing.T) {
	shared(t)
	t.Cleanup(func() { startMariaDB(t) })
	s := stack.New(t, stack.Options{Backends: 2, Workers: 2, NoStartWorkers: true,
		Config: stack.Fast("consumers = 1\nprefetch = 20\nbatch_size = 5")})
	sale := s.CreateSale(t, saleID(), 400, 2)
	c := stack.NewCrowd(sale, 400, 3, "mdb")
	c.Run(s, s.Backends) // the backlog: nothing is consumed yet
	s.StartWorkers(t)
	stack.WaitFor(t, "the drain under way", time.Minute, func() bool {
		var n int
		_ = s.DB.QueryRow("SELECT COUNT(*) FROM orders WHERE activity_id = ?", sale.ID).Scan(&n)
		return n >= 20
	})
	depth, err := s.QueueDepth(t)
	servicetest.Must(t, err, "queue depth")
	if depth == 0 {
		t.Fatalf("the backlog drained before the restart; the fault would test nothing")
	}
	t.Logf("restarting MariaDB with %d messages ready", depth)
	out, err := command(t, time.Minute, "mariadb-admin", "--protocol=tcp", "-h127.0.0.1", "-uroot", "--connect-timeout=5", "shutdown")
	servicetest.Must(t, err, "mariadb-admin shutdown: %s", out)
	stack.WaitFor(t, "MariaDB down", time.Minute, func() bool { return !mariaDBUp(t) })
	time.Sleep(time.Second)
	startMariaDB(t)
	s.Finish(t, "mariadb restart mid-drain", sale, c)
}

func mariaDBUp(t *testing.T) bool {
	out, _ := command(t, 10*time.Second, "mariadb-admin", "--protocol=tcp", "-h127.0.0.1", "-uroot", "--connect-timeout=2", "ping")
	return strings.Contains(out, "is alive")
}

// startMariaDB starts mariadbd the way scripts/services.sh does, when it is
// not running, and waits until it answers.
func startMariaDB(t *testing.T) {
	if mariaDBUp(t) {
		return
	}
	_, _ = command(t, 10*time.Second, "install", "-d", "-o", "mysql", "-g", "mysql", "-m", "0755", "/run/mysqld")
	// --background: the daemon leaves start-stop-daemon's process group
	// (setsid), so the helper's sweep of that group leaves it running.
	if out, err := command(t, time.Minute, "start-stop-daemon", "--start", "--oknodo", "--background",
		"--exec", "/usr/sbin/mariadbd", "--", "--user=mysql"); err != nil {
		t.Errorf("start mariadbd: %v\n%s", err, out)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !mariaDBUp(t) {
		if time.Now().After(deadline) {
			t.Errorf("MariaDB did not come back within 2m")
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}
