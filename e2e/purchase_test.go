// Package e2e proves the purchase path end to end: real binaries (2 backends,
// 3 workers) on an isolated stack of the real Redis, MariaDB and RabbitMQ,
// a crowd buying concurrently, then invariants I1–I5 of DESIGN.md §3 checked
// in MySQL and Redis after the queue drained.
package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
)

const (
	activityID = 42
	stock      = 100
	limit      = 2
	nUsers     = 1000
	perUser    = 5 // attempts per user: 5,000 in all
	adminToken = "e2e-admin-token"
)

// attempt is one purchase request and what it got.
type attempt struct {
	user, key string
	qty       int
	backend   int
	status    int
	code      string
	orderID   string
}

func TestPurchaseInvariantsUnderConcurrency(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	dsn := servicetest.MySQLDSN(t)
	rdb, redisPrefix := servicetest.Redis(t)
	amqpPrefix := servicetest.AMQPPrefix(t, []string{".orders", ".orders.dead"}, []string{".orders", ".orders.dlx"})

	bin := t.TempDir()
	build(t, bin, "backend")
	build(t, bin, "worker")
	env := append(os.Environ(),
		conf.EnvMySQLDSN+"="+dsn,
		conf.EnvRedisURL+"="+servicetest.RedisURL(),
		conf.EnvRedisKeyPrefix+"="+redisPrefix,
		conf.EnvAMQPURL+"="+servicetest.AMQPURL(),
		conf.EnvAMQPQueuePrefix+"="+amqpPrefix,
		conf.EnvAdminToken+"="+adminToken,
	)
	config, err := filepath.Abs("../conf/seckill.toml")
	servicetest.Must(t, err, "config path")

	var backends []string
	for i := range 2 {
		addr := freeAddr(t)
		start(t, bin, "backend", i, config, append(env, conf.EnvBackendListen+"="+addr))
		backends = append(backends, "http://"+addr)
	}
	var workers []string
	for i := range 3 {
		addr := freeAddr(t)
		start(t, bin, "worker", i, config, append(env, conf.EnvWorkerListen+"="+addr))
		workers = append(workers, "http://"+addr)
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for _, u := range append(append([]string{}, backends...), workers...) {
		waitFor(t, u+"/readyz", func() bool {
			r, err := client.Get(u + "/readyz")
			if err != nil {
				return false
			}
			_ = r.Body.Close()
			return r.StatusCode == http.StatusOK
		})
	}

	// The sale: 100 units, 2 per user, open now.
	body, _ := json.Marshal(map[string]any{"stock": stock, "per_user_limit": limit,
		"starts_at": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339),
		"ends_at":   time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/admin/v1/activities/%d", backends[0], activityID), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	servicetest.Must(t, err, "create sale")
	msg, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		t.Fatalf("create sale: %d %s", resp.StatusCode, msg)
	}

	// The crowd: 1,000 users × 5 attempts, shuffled, over both backends.
	// Every fourth user asks for 2 units first; attempts 3 and 4 retry the
	// Idempotency-Key of attempts 0 and 1.
	var attempts []*attempt
	for u := range nUsers {
		user := fmt.Sprintf("user-%04d", u)
		for k := range perUser {
			a := &attempt{user: user, qty: 1, backend: rand.IntN(len(backends))}
			if k == 0 && u%4 == 0 {
				a.qty = 2
			}
			a.key = fmt.Sprintf("%s-k%d", user, k%3)
			if k == 2 && u%2 == 1 {
				a.key = "" // some attempts carry no key at all
			}
			attempts = append(attempts, a)
		}
	}
	rand.Shuffle(len(attempts), func(i, j int) { attempts[i], attempts[j] = attempts[j], attempts[i] })
	fire(t, client, backends, attempts)

	// Should a late compensation have given units back, sell them too, so
	// that the sale ends sold out ("sold out" only when nothing is left).
	db := openDB(t, dsn)
	res := reservation.New(rdb, redisPrefix)
	topo := broker.TopologyFor(conf.RabbitMQ{Prefix: amqpPrefix, DeliveryLimit: 5})
	accepted := acceptedIDs(attempts)
	drain(t, db, res, topo, accepted)
	for round := 0; ; round++ {
		sale, _, err := res.Sale(context.Background(), activityID)
		servicetest.Must(t, err, "read sale")
		if sale.Available() == 0 {
			break
		}
		if round == 5 {
			t.Fatalf("%d units still available after the crowd and %d mop-up rounds", sale.Available(), round)
		}
		var more []*attempt
		for i := range 50 {
			more = append(more, &attempt{user: fmt.Sprintf("late-%d-%02d", round, i), qty: 1, backend: i % len(backends)})
		}
		fire(t, client, backends, more)
		attempts = append(attempts, more...)
		accepted = acceptedIDs(attempts)
		drain(t, db, res, topo, accepted)
	}

	statuses := map[string]int{}
	for _, a := range attempts {
		statuses[fmt.Sprintf("%d %s", a.status, a.code)]++
		switch {
		case a.status == http.StatusAccepted:
		case a.status == http.StatusConflict && (a.code == "sold_out" || a.code == "limit_exceeded" || a.code == "insufficient_stock"):
		case a.status == http.StatusServiceUnavailable && a.code == "unavailable":
		default:
			t.Errorf("user %s key %q: %d %q", a.user, a.key, a.status, a.code)
		}
	}
	t.Logf("answers: %v", statuses)
	if len(accepted) == 0 {
		t.Fatal("no purchase was accepted")
	}

	checkInvariants(t, db, rdb, res, attempts, accepted)

	// I5: the sale is sold out in MySQL, and only now is sold out answered.
	a := &attempt{user: "after-the-sale", qty: 1}
	fire(t, client, backends, []*attempt{a})
	if a.status != http.StatusConflict || a.code != "sold_out" {
		t.Errorf("a purchase after the sale: %d %q, want 409 sold_out", a.status, a.code)
	}
}

// fire sends the attempts from 64 concurrent clients.
func fire(t *testing.T, client *http.Client, backends []string, attempts []*attempt) {
	t.Helper()
	work := make(chan *attempt)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range work {
				if err := purchase(client, backends[a.backend%len(backends)], a); err != nil {
					t.Errorf("purchase of %s: %v", a.user, err)
				}
			}
		}()
	}
	for _, a := range attempts {
		work <- a
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

func purchase(client *http.Client, base string, a *attempt) error {
	body, _ := json.Marshal(map[string]int{"quantity": a.qty})
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/api/v1/activities/%d/purchase", base, activityID), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("X-User-ID", a.user)
	req.Header.Set("Content-Type", "application/json")
	if a.key != "" {
		req.Header.Set("Idempotency-Key", a.key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var out struct {
		OrderID string `json:"order_id"`
		Status  string `json:"status"`
		Code    string `json:"code"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return fmt.Errorf("%d with a body that is not JSON: %w", resp.StatusCode, err)
	}
	a.status, a.code, a.orderID = resp.StatusCode, out.Code, out.OrderID
	if a.status == http.StatusAccepted && a.orderID == "" {
		return fmt.Errorf("202 without an order id")
	}
	return nil
}

func acceptedIDs(attempts []*attempt) map[string]bool {
	out := map[string]bool{}
	for _, a := range attempts {
		if a.status == http.StatusAccepted {
			out[a.orderID] = true
		}
	}
	return out
}

// drain waits until the order queue is empty, nothing is pending in Redis
// and every accepted order is in MySQL.
func drain(t *testing.T, db *sql.DB, res *reservation.Store, topo broker.Topology, accepted map[string]bool) {
	t.Helper()
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	waitFor(t, "the queue drained", func() bool {
		q, err := ch.QueueDeclarePassive(topo.Queue, true, false, false, false, nil)
		servicetest.Must(t, err, "inspect queue")
		if q.Messages > 0 {
			return false
		}
		sale, _, err := res.Sale(context.Background(), activityID)
		servicetest.Must(t, err, "read sale")
		if sale.Pending > 0 {
			return false
		}
		var n int
		servicetest.Must(t, db.QueryRow("SELECT COUNT(*) FROM orders WHERE activity_id = ?", activityID).Scan(&n), "count")
		return n >= len(accepted)
	})
}

func checkInvariants(t *testing.T, db *sql.DB, rdb *redis.Client, res *reservation.Store, attempts []*attempt, accepted map[string]bool) {
	ctx := context.Background()
	type row struct {
		user, status, reason, key string
		qty                       int64
	}
	rows := map[string]row{}
	q, err := db.Query("SELECT order_id, user_id, status, COALESCE(reason, ''), COALESCE(idempotency_key, ''), quantity FROM orders WHERE activity_id = ?", activityID)
	servicetest.Must(t, err, "orders")
	for q.Next() {
		var id string
		var r row
		servicetest.Must(t, q.Scan(&id, &r.user, &r.status, &r.reason, &r.key, &r.qty), "scan")
		rows[id] = r
	}
	servicetest.Must(t, q.Err(), "orders")
	_ = q.Close()

	// I1: exactly the stock sold, no more, in orders and in the guard row.
	var confirmed int64
	perUser := map[string]int64{}
	for _, r := range rows {
		if r.status == "confirmed" {
			confirmed += r.qty
			perUser[r.user] += r.qty
		} else if r.reason == "" {
			t.Errorf("a failed order without a reason: %+v", r)
		}
	}
	var left, sold, total int64
	servicetest.Must(t, db.QueryRow("SELECT stock, sold, total_stock FROM activities WHERE id = ?", activityID).Scan(&left, &sold, &total), "sale")
	if confirmed != stock || sold != stock || left != 0 || total != stock {
		t.Errorf("I1: confirmed %d, sold %d, left %d, total %d; want exactly %d sold", confirmed, sold, left, total, stock)
	}

	// I2: nobody over the limit; purchases agrees with the orders.
	bought := map[string]int64{}
	p, err := db.Query("SELECT user_id, quantity FROM purchases WHERE activity_id = ?", activityID)
	servicetest.Must(t, err, "purchases")
	for p.Next() {
		var u string
		var n int64
		servicetest.Must(t, p.Scan(&u, &n), "scan")
		bought[u] = n
	}
	_ = p.Close()
	for u, n := range perUser {
		if n > limit {
			t.Errorf("I2: user %s holds %d > %d", u, n, limit)
		}
		if bought[u] != n {
			t.Errorf("I2: user %s: purchases %d, confirmed orders %d", u, bought[u], n)
		}
	}
	for u, n := range bought {
		if n != perUser[u] {
			t.Errorf("I2: purchases has user %s at %d, orders %d", u, n, perUser[u])
		}
	}

	// I3: one order per (user, key) in MySQL, and every replay answered with
	// the order id of the first.
	perKey := map[string]string{}
	for id, r := range rows {
		if r.key == "" {
			continue
		}
		k := r.user + "\x00" + r.key
		if prev, ok := perKey[k]; ok {
			t.Errorf("I3: key %q of %s produced orders %s and %s", r.key, r.user, prev, id)
		}
		perKey[k] = id
	}
	answered := map[string]string{}
	for _, a := range attempts {
		if a.status != http.StatusAccepted || a.key == "" {
			continue
		}
		k := a.user + "\x00" + a.key
		if prev, ok := answered[k]; ok && prev != a.orderID {
			t.Errorf("I3: %s key %q answered orders %s and %s", a.user, a.key, prev, a.orderID)
		}
		answered[k] = a.orderID
		if id, ok := perKey[k]; ok && id != a.orderID {
			t.Errorf("I3: %s key %q answered %s, MySQL holds %s", a.user, a.key, a.orderID, id)
		}
	}

	// I4: every accepted order decided: in MySQL, or (a replay of an order
	// whose publish failed and was released) failed with a reason in Redis.
	for id := range accepted {
		r, ok := rows[id]
		if ok && (r.status == "confirmed" || r.status == "failed") {
			continue
		}
		rec, found, err := res.Order(ctx, activityID, id)
		servicetest.Must(t, err, "record")
		if ok || !found || rec.State != reservation.Failed || rec.Reason == "" {
			t.Errorf("I4: accepted order %s: MySQL %+v (found %v), Redis %+v (found %v)", id, r, ok, rec, found)
		}
	}
	overdue, err := res.Overdue(ctx, activityID, time.Now().Add(24*time.Hour), 10)
	servicetest.Must(t, err, "deadlines")
	if len(overdue) > 0 {
		t.Errorf("I4: reservations still tracked: %v", overdue)
	}

	// I5: Redis agrees with MySQL: counters, per-user totals, every record.
	sale, found, err := res.Sale(ctx, activityID)
	servicetest.Must(t, err, "Redis sale")
	if !found || sale.Total != total || sale.Sold != sold || sale.Pending != 0 || sale.Available() != 0 {
		t.Errorf("I5: Redis %+v (found %v), MySQL total %d sold %d", sale, found, total, sold)
	}
	for id, r := range rows {
		rec, found, err := res.Order(ctx, activityID, id)
		servicetest.Must(t, err, "record")
		if !found || rec.State.Public() != r.status {
			t.Errorf("I5: order %s: Redis %q, MySQL %s", id, rec.State, r.status)
		}
	}
	users, err := rdb.HGetAll(ctx, res.Keys(activityID).Users).Result()
	servicetest.Must(t, err, "Redis users")
	for u, v := range users {
		if v != fmt.Sprint(bought[u]) {
			t.Errorf("I5: user %s holds %s in Redis, %d in MySQL", u, v, bought[u])
		}
	}
	if len(users) != len(bought) {
		t.Errorf("I5: %d users in Redis, %d in MySQL", len(users), len(bought))
	}
	t.Logf("sold %d/%d to %d users in %d orders (%d accepted)", confirmed, stock, len(perUser), len(rows), len(accepted))
}

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	c := conf.Default().MySQL
	c.DSN = dsn
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := schema.Open(ctx, c)
	servicetest.Must(t, err, "open db")
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// build compiles one binary of the module into dir.
func build(t *testing.T, dir, name string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), "github.com/seckill/seckill/"+name)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
}

// start runs a binary until the test ends; its log is shown when the test fails.
func start(t *testing.T, dir, name string, i int, config string, env []string) {
	t.Helper()
	logPath := filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, i))
	logFile, err := os.Create(logPath)
	servicetest.Must(t, err, "log file")
	cmd := exec.Command(filepath.Join(dir, name), "-config", config)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	servicetest.Must(t, cmd.Start(), "start %s", name)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s %d exited: %v", name, i, err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("%s %d did not stop on SIGTERM", name, i)
		}
		_ = logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("--- %s %d log (last 4 KiB):\n%s", name, i, tail(b, 4096))
			}
		}
	})
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// freeAddr returns a loopback address with a port that was free just now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "free port")
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// waitFor polls cond; the bound keeps a broken build from hanging, it is no
// speed goal.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
