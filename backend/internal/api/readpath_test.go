package api_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/backend/internal/api"
	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

func readCfg(ttl time.Duration) sale.Config {
	return sale.Config{
		ReservationTTL: 30 * time.Second, RedisTimeout: 100 * time.Millisecond, PublishTimeout: 3 * time.Second,
		QueryTimeout: 5 * time.Second, SoldOutTTL: time.Hour, StateTTL: ttl,
		OrderWaitMax: 30 * time.Second, MaxOrderWaiters: 1000,
	}
}

// floodResult counts the answers of a read flood.
type floodResult struct {
	n, stale atomic.Int64
	mu       sync.Mutex
	status   map[int]int
}

// flood GETs the sale state of ids from conns connections for d.
func flood(t *testing.T, url string, ids []int64, conns int, d time.Duration) *floodResult {
	t.Helper()
	c := &fasthttp.HostClient{Addr: strings.TrimPrefix(url, "http://"), MaxConns: conns}
	r := &floodResult{status: map[int]int{}}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range conns {
		wg.Go(func() {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			local := map[int]int{}
			for i := 0; time.Now().Before(end); i++ {
				req.SetRequestURI(fmt.Sprintf("%s/api/v1/activities/%d", url, ids[(g+i)%len(ids)]))
				if err := c.DoTimeout(req, resp, 10*time.Second); err != nil {
					local[-1]++
					continue
				}
				local[resp.StatusCode()]++
				r.n.Add(1)
				if strings.Contains(string(resp.Body()), `"stale":true`) {
					r.stale.Add(1)
				}
			}
			r.mu.Lock()
			for k, v := range local {
				r.status[k] += v
			}
			r.mu.Unlock()
		})
	}
	wg.Wait()
	return r
}

// commandCalls reads calls of one command from INFO commandstats.
func commandCalls(t *testing.T, rdb *redis.Client, cmd string) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	servicetest.Must(t, err, "info commandstats")
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}

func questions(t *testing.T, db *sql.DB) int {
	t.Helper()
	var name string
	var n int
	servicetest.Must(t, db.QueryRow("SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n), "questions")
	return n
}

// The proof of the read path under a flood, on a Redis and a MariaDB of the
// test's own (so that INFO commandstats and Questions count this backend
// only): with Redis up, ≤ 1 Redis read per activity per TTL; with Redis
// stopped, ≤ 1 MySQL read per activity per TTL and never more than one in
// flight, the rest answered the last known state marked stale; purchases keep
// their answers (503 while Redis is down).
func TestStateReadFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own redis-server and mariadbd")
	}
	red := servicetest.PrivateRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: red.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	_, dsn := servicetest.PrivateMariaDB(t)
	const ttl = 100 * time.Millisecond
	// The flood is a CPU hog: in make test (parallel with the fault tests on
	// the shared services) 8 connections for 1s per phase; the figures of
	// docs/read-path.md come from SECKILL_CHAOS=1 (32 connections, 2s).
	conns, phase := 8, time.Second
	if os.Getenv("SECKILL_CHAOS") != "" {
		conns, phase = 32, 2*time.Second
	}
	s := newStackOn(t, readCfg(ttl), rdb, dsn, slog.New(slog.DiscardHandler), nil)
	ids := []int64{1, 2}
	for _, id := range ids {
		s.openSale(t, id, 1000, 1)
	}
	ctx := context.Background()

	// Redis up.
	servicetest.Must(t, rdb.ConfigResetStat(ctx).Err(), "config resetstat")
	start := time.Now()
	r := flood(t, s.url, ids, conns, phase)
	reads := commandCalls(t, rdb, "hmget")
	elapsed := time.Since(start)
	bound := len(ids) * (int(elapsed/ttl) + 1)
	t.Logf("redis up: %d GETs in %v (%.0f/s), %d Redis reads of sale state (bound %d), answers %v",
		r.n.Load(), elapsed.Round(time.Millisecond), float64(r.n.Load())/elapsed.Seconds(), reads, bound, r.status)
	if reads > bound {
		t.Errorf("%d Redis reads for %d activities in %v: more than one per activity per TTL (%d)", reads, len(ids), elapsed, bound)
	}
	if r.status[200] == 0 || len(r.status) != 1 {
		t.Errorf("answers %v, want only 200", r.status)
	}
	if b := s.buy(t, 1, "before", "", ""); b.status != 202 {
		t.Fatalf("purchase with Redis up: %d %s", b.status, b.raw)
	}

	// Redis stopped.
	red.Kill()
	if b := s.buy(t, 1, "during", "", ""); b.status != 503 || b.header.Get("Retry-After") == "" {
		t.Errorf("purchase with Redis down: %d %s, want 503 with Retry-After", b.status, b.raw)
	}
	mdb, err := sql.Open("mysql", strings.TrimSuffix(dsn, "seckill"))
	servicetest.Must(t, err, "open")
	mdb.SetMaxOpenConns(2)
	t.Cleanup(func() { _ = mdb.Close() })
	q0 := questions(t, mdb)
	start = time.Now()
	r = flood(t, s.url, ids, conns, phase)
	q1 := questions(t, mdb)
	elapsed = time.Since(start)
	mysqlReads := q1 - q0 - 1 // the second SHOW STATUS counts itself
	bound = len(ids) * (int(elapsed/ttl) + 1)
	t.Logf("redis down: %d GETs in %v (%.0f/s), %d MySQL statements (bound %d), %d stale, answers %v",
		r.n.Load(), elapsed.Round(time.Millisecond), float64(r.n.Load())/elapsed.Seconds(), mysqlReads, bound, r.stale.Load(), r.status)
	if mysqlReads > bound {
		t.Errorf("%d MySQL reads for %d activities in %v: more than one per activity per TTL (%d)", mysqlReads, len(ids), elapsed, bound)
	}
	if r.status[200] == 0 || len(r.status) != 1 {
		t.Errorf("answers %v, want only 200 (MySQL's state or the last known one)", r.status)
	}

	// Redis stopped and MySQL stuck: the activities table is write-locked, so
	// the fallback read hangs. One read is in flight; every other reader is
	// answered the last known state, marked stale.
	lockConn, err := mdb.Conn(ctx)
	servicetest.Must(t, err, "conn")
	defer lockConn.Close()
	_, err = lockConn.ExecContext(ctx, "LOCK TABLES seckill.activities WRITE")
	servicetest.Must(t, err, "lock tables")
	var maxInFlight atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			var n int64
			if err := mdb.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT total_stock%'`).Scan(&n); err == nil && n > maxInFlight.Load() {
				maxInFlight.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	r = flood(t, s.url, ids[:1], conns, phase)
	close(stop)
	sampler.Wait()
	_, err = lockConn.ExecContext(ctx, "UNLOCK TABLES")
	servicetest.Must(t, err, "unlock tables")
	t.Logf("redis down, MySQL stuck: %d GETs, %d stale, answers %v, MySQL reads in flight at most %d",
		r.n.Load(), r.stale.Load(), r.status, maxInFlight.Load())
	if maxInFlight.Load() != 1 {
		t.Errorf("MySQL reads of one activity in flight: at most %d, want exactly 1", maxInFlight.Load())
	}
	if r.status[200] == 0 || len(r.status) != 1 || r.stale.Load() < r.n.Load()/2 {
		t.Errorf("answers %v with %d stale of %d: want 200, the last known state marked stale", r.status, r.stale.Load(), r.n.Load())
	}
}

// secondBackend serves the same Redis and MySQL as s with another service
// (its own caches and subscriptions): another backend instance.
func (s *stack) secondBackend(t *testing.T, scfg sale.Config) string {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	svc := sale.New(s.store, s.db, s.pub, scfg, log, nil)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	ready := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	wg.Go(func() { svc.WatchStockEvents(ctx, s.rdb, ready[0]) })
	wg.Go(func() { svc.WatchOrders(ctx, s.rdb, ready[1]) })
	t.Cleanup(func() { stop(); wg.Wait() })
	<-ready[0]
	<-ready[1]
	a := api.New(svc, api.Config{AdminToken: token, MaxBodyBytes: 4096, AdminBodyBytes: 65536, RetryAfter: time.Second,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: time.Minute, StateTTL: scfg.StateTTL},
		nil, nil, log, nil)
	return "http://" + servicetest.Serve(t, a.Server(), a.Listener)
}

func (s *stack) activity(t *testing.T, id int64) reply {
	t.Helper()
	r := s.do(t, "GET", fmt.Sprintf("/api/v1/activities/%d", id), "", nil)
	if r.status != 200 {
		t.Fatalf("activity %d: %d %s", id, r.status, r.raw)
	}
	return r
}

// With a TTL of an hour only the news can refresh a cached state: an admin
// change on another backend (announced on the stock-event channel) and this
// backend's own sold-out answer.
func TestStateCacheInvalidation(t *testing.T) {
	t.Parallel()
	s := newStackOn(t, readCfg(time.Hour), nil, "", slog.New(slog.DiscardHandler), nil)
	other := &stack{url: s.secondBackend(t, readCfg(time.Hour))}
	const id = 21
	s.openSale(t, id, 1, 1)
	r := s.activity(t, id)
	if r.body["available"] != 1.0 || r.body["state"] != "open" {
		t.Fatalf("first read: %s", r.raw)
	}
	if cc, age := r.header.Get("Cache-Control"), r.header.Get("Age"); cc != "max-age=3599" && cc != "max-age=3600" || age != "0" {
		t.Errorf("freshness headers: Cache-Control %q Age %q", cc, age)
	}

	// Admin change on the other backend.
	start, end := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	if p := other.put(t, id, 2, 1, start, end); p.status != 200 {
		t.Fatalf("update on the other backend: %d %s", p.status, p.raw)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.activity(t, id).body["stock"] != 2.0 {
		if time.Now().After(deadline) {
			t.Fatal("an admin change on another backend never reached the cached state")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The change sends two events (the warm script's and the announcement):
	// once both are heard, the state read next stays cached.
	s.caughtUp(t)
	s.activity(t, id)

	// Sold out on this backend: two units bought, then the next buyer is told
	// sold out, which drops the cached state showing units.
	for _, u := range []string{"a", "b"} {
		if b := s.buy(t, id, u, "", ""); b.status != 202 {
			t.Fatalf("buy %s: %d %s", u, b.status, b.raw)
		}
	}
	if a := s.activity(t, id); a.body["available"] != 2.0 {
		t.Fatalf("the cache does not hold the state (TTL 1h): %s", a.raw)
	}
	if b := s.buy(t, id, "c", "", ""); b.status != 409 || b.body["code"] != "sold_out" {
		t.Fatalf("third buyer: %d %s", b.status, b.raw)
	}
	if a := s.activity(t, id); a.body["state"] != "sold_out" || a.body["available"] != 0.0 {
		t.Errorf("after this backend answered sold out: %s", a.raw)
	}
}

// Without news, a change is seen once the TTL has passed (and not before:
// the state is cached).
func TestStateCacheTTL(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	s := newStackOn(t, readCfg(ttl), nil, "", slog.New(slog.DiscardHandler), nil)
	const id = 22
	s.openSale(t, id, 10, 5)
	s.activity(t, id)
	read := time.Now() // the cached state is at most this old
	// A reservation behind the backend's back: no event.
	_, err := s.store.Reserve(context.Background(), reservation.Request{ActivityID: id, UserID: "x", Quantity: 3,
		OrderID: fmt.Sprintf("%d-behind", id), TTL: time.Minute})
	servicetest.Must(t, err, "reserve")
	a := s.activity(t, id)
	if time.Since(read) < ttl/2 && a.body["available"] != 10.0 {
		t.Errorf("read within the TTL went past the cache: %s", a.raw)
	}
	time.Sleep(ttl)
	if a := s.activity(t, id); a.body["available"] != 7.0 || a.body["pending"] != 3.0 {
		t.Errorf("after one TTL: %s, want available 7 and pending 3", a.raw)
	}
}

// getOrder runs one GET of an order and decodes it.
func getOrder(t *testing.T, url, oid, query string) (int, map[string]any, time.Duration) {
	t.Helper()
	start := time.Now()
	status, body, err := fasthttp.GetTimeout(nil, url+"/api/v1/orders/"+oid+query, time.Minute)
	servicetest.Must(t, err, "get order")
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("order body %q: %v", body, err)
	}
	return status, m, time.Since(start)
}

func TestOrderLongPoll(t *testing.T) {
	t.Parallel()
	cfg := readCfg(100 * time.Millisecond)
	cfg.OrderWaitMax = 2 * time.Second
	cfg.MaxOrderWaiters = 2
	s := newStackOn(t, cfg, nil, "", slog.New(slog.DiscardHandler), nil)
	const id = 23
	s.openSale(t, id, 10, 5)
	buy := func(u string) string {
		b := s.buy(t, id, u, "", "")
		if b.status != 202 {
			t.Fatalf("buy: %d %s", b.status, b.raw)
		}
		return b.body["order_id"].(string)
	}

	// Woken by the settlement, confirmed and failed (with its reason).
	for _, confirm := range []bool{true, false} {
		oid := buy(fmt.Sprintf("u-%v", confirm))
		type answer struct {
			status int
			body   map[string]any
		}
		got := make(chan answer, 1)
		go func() {
			st, b, _ := getOrder(t, s.url, oid, "?wait=1h") // bounded by order_wait_max
			got <- answer{st, b}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for s.svc.Waiters() != 1 {
			if time.Now().After(deadline) {
				t.Fatal("the long-poll never registered")
			}
			time.Sleep(time.Millisecond)
		}
		s.settle(t, id, oid, confirm)
		a := <-got
		want := "confirmed"
		if !confirm {
			want = "failed"
		}
		if a.status != 200 || a.body["status"] != want || a.body["order_id"] != oid || a.body["user_id"] != fmt.Sprintf("u-%v", confirm) || a.body["quantity"] != 1.0 {
			t.Errorf("long-poll answer %d %v, want %s", a.status, a.body, want)
		}
		if !confirm && a.body["reason"] != "sold_out" {
			t.Errorf("failed order without its reason: %v", a.body)
		}
		// A poll afterwards says the same.
		if _, b, _ := getOrder(t, s.url, oid, ""); b["status"] != want {
			t.Errorf("poll after settlement: %v", b)
		}
	}

	// Still pending when the wait ends: answered pending, not before the
	// bound (order_wait_max 2s, though 1h was asked).
	oid := buy("slow")
	st, b, took := getOrder(t, s.url, oid, "?wait=1h")
	if st != 200 || b["status"] != "pending" || took < 2*time.Second || took > 20*time.Second {
		t.Errorf("unsettled long-poll: %d %v after %v, want pending after the 2s bound", st, b, took)
	}
	// No wait: at once.
	if st, b, _ := getOrder(t, s.url, oid, "?wait=0"); st != 200 || b["status"] != "pending" {
		t.Errorf("wait=0: %d %v", st, b)
	}
	// A settled or unknown order is answered at once.
	if st, b, took := getOrder(t, s.url, fmt.Sprintf("%d-nosuchorder", id), "?wait=10s"); st != 404 || b["code"] != "order_not_found" || took > 2*time.Second {
		t.Errorf("unknown order: %d %v after %v", st, b, took)
	}
	// Bad waits: 400 naming the parameter.
	for _, q := range []string{"?wait=", "?wait=-1s", "?wait=soon", "?wait=1e9"} {
		if st, b, _ := getOrder(t, s.url, oid, q); st != 400 || b["code"] != "bad_request" || !strings.Contains(b["message"].(string), "wait") {
			t.Errorf("%s: %d %v", q, st, b)
		}
	}
	// Beyond max_order_waiters (2) a long-poll is answered at once.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { getOrder(t, s.url, oid, "?wait=2s") })
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.svc.Waiters() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("two long-polls never registered")
		}
		time.Sleep(time.Millisecond)
	}
	if st, b, took := getOrder(t, s.url, oid, "?wait=2s"); st != 200 || b["status"] != "pending" || took > time.Second {
		t.Errorf("over the waiter bound: %d %v after %v, want pending at once", st, b, took)
	}
	wg.Wait()
	if n := s.metric(t, "seckill_backend_order_waits_total", "outcome", "full"); n != 1 {
		t.Errorf("order_waits_total{outcome=full} = %v, want 1", n)
	}
}
