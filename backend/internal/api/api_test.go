package api_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/backend/internal/api"
	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/brokertest"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/redisnodes"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/internal/soldout"
	"github.com/seckill/seckill/lua"
)

const token = "test-admin-token"

// hookPublisher lets a test run code where the confirm would arrive, and
// replace the outcome: the deterministic way to force the publish races.
type hookPublisher struct {
	real *broker.Publisher
	hook func(o ordermsg.Order, err error) error
}

func (h *hookPublisher) Publish(ctx context.Context, o ordermsg.Order) error {
	err := h.real.Publish(ctx, o)
	if h.hook != nil {
		return h.hook(o, err)
	}
	return err
}

// PublishBatch runs the hook for each order of the batch with the batch's
// outcome; the first outcome the hook replaces is the batch's.
func (h *hookPublisher) PublishBatch(ctx context.Context, orders []ordermsg.Order) error {
	err := h.real.PublishBatch(ctx, orders)
	if h.hook != nil {
		for _, o := range orders {
			if e := h.hook(o, err); e != err {
				return e
			}
		}
	}
	return err
}

func (h *hookPublisher) PublishMarker(ctx context.Context, m ordermsg.Marker) error {
	return h.real.PublishMarker(ctx, m)
}

type stack struct {
	url   string
	rdb   redis.UniversalClient
	store *reservation.Store
	db    *sql.DB
	topo  broker.Topology
	ch    *amqp.Channel
	pub   *hookPublisher
	reg   *prometheus.Registry
	api   *api.API
	svc   *sale.Service
	heard *heard
}

// heard records the stock events the backend has acted on. It listens after
// the service on the same subscription, so an event it records has already
// reached the service's caches.
type heard struct {
	mu      sync.Mutex
	ids     map[int64]bool
	soldOut map[int64]int // v2 "sold out" events per activity
}

func (h *heard) SoldOut(id int64) {
	h.mu.Lock()
	h.soldOut[id]++
	h.mu.Unlock()
}

func (h *heard) soldOuts(id int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.soldOut[id]
}

func (h *heard) Changed(id int64) {
	h.mu.Lock()
	h.ids[id] = true
	h.mu.Unlock()
}

func (h *heard) Reset() {}

func (h *heard) has(id int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ids[id]
}

// fences numbers the fence events of all tests (ids far above any sale's).
var fences atomic.Int64

// caughtUp returns once the backend has acted on every stock event published
// before the call: it publishes a fence event and waits to hear it, as one
// subscription delivers in publish order. A test calls it after an admin
// change so that the change's own late events (the warm script's and the
// announcement) cannot drop a state the test means to read from the cache.
func (s *stack) caughtUp(t *testing.T) {
	t.Helper()
	fence := 1<<62 + fences.Add(1)
	servicetest.Must(t, s.rdb.Publish(context.Background(), reservation.Channel(s.store.Prefix()), fence).Err(), "publish fence")
	for deadline := time.Now().Add(10 * time.Second); !s.heard.has(fence); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the backend never heard the fence event on its stock-event channel")
		}
	}
}

func newStack(t *testing.T, soldOutTTL time.Duration) *stack {
	t.Helper()
	return newStackWith(t, soldOutTTL, slog.New(slog.DiscardHandler), nil)
}

// newStackWith is newStack with the API's logger and a hook to change its
// config.
func newStackWith(t *testing.T, soldOutTTL time.Duration, log *slog.Logger, edit func(*api.Config)) *stack {
	t.Helper()
	return newStackOn(t, sale.Config{
		ReservationTTL: 30 * time.Second, RedisTimeout: 2 * time.Second, PublishTimeout: 3 * time.Second,
		QueryTimeout: 5 * time.Second, SoldOutTTL: soldOutTTL,
	}, nil, "", log, edit)
}

// newStackOn runs the backend with scfg on rdb (nil: the shared Redis) and
// the database of dsn ("": a fresh one on the shared MariaDB).
func newStackOn(t *testing.T, scfg sale.Config, rdb redis.UniversalClient, dsn string, log *slog.Logger, edit func(*api.Config)) *stack {
	t.Helper()
	var prefix string
	if rdb == nil {
		rdb, prefix = servicetest.Redis(t)
	} else {
		prefix = servicetest.Name(t) + ":"
	}
	cfg := conf.Default()
	cfg.MySQL.DSN = dsn
	if dsn == "" {
		cfg.MySQL.DSN = servicetest.MySQLDSN(t)
	}
	cfg.RabbitMQ.URL = servicetest.AMQPURL()
	cfg.RabbitMQ.Prefix = brokertest.Prefix(t)
	ctx := context.Background()
	servicetest.Must(t, lua.Preload(ctx, rdb), "preload")
	db, err := schema.Open(ctx, cfg.MySQL)
	servicetest.Must(t, err, "schema")
	t.Cleanup(func() { _ = db.Close() })
	reg := prometheus.NewRegistry()
	real, err := broker.NewPublisher(ctx, broker.PublisherConfigFrom(cfg.RabbitMQ, "api-test"), log, broker.NewPublisherMetrics(reg, "seckill_backend"))
	servicetest.Must(t, err, "publisher")
	t.Cleanup(func() { _ = real.Close() })
	pub := &hookPublisher{real: real}
	store := reservation.New(rdb, prefix)
	svc := sale.New(store, db, pub, scfg, log, sale.NewMetrics(reg))
	wctx, stop := context.WithCancel(ctx)
	var watched sync.WaitGroup
	subscribed := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	events := &heard{ids: map[int64]bool{}, soldOut: map[int64]int{}}
	watched.Go(func() { soldout.Watch(wctx, rdb, reservation.Channel(prefix), log, subscribed[0], svc, events) })
	watched.Go(func() { svc.WatchOrders(wctx, rdb, subscribed[1]) })
	t.Cleanup(func() { stop(); watched.Wait() })
	<-subscribed[0]
	<-subscribed[1]

	acfg := api.Config{
		AdminToken: token, MaxBodyBytes: 4096, AdminBodyBytes: 65536, RetryAfter: time.Second,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: time.Minute,
		StateTTL: scfg.StateTTL,
	}
	if edit != nil {
		edit(&acfg)
	}
	a := api.New(svc, acfg, []api.Check{
		{Name: "redis", Fn: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }},
		{Name: "mysql", Fn: db.PingContext},
		{Name: "rabbitmq", Fn: func(context.Context) error { return real.Ready() }},
	}, reg, log, api.NewMetrics(reg))
	addr := servicetest.Serve(t, a.Server(), a.Listener)

	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	return &stack{url: "http://" + addr, rdb: rdb, store: store, db: db,
		topo: broker.TopologyFor(cfg.RabbitMQ), ch: ch, pub: pub, reg: reg, api: a, svc: svc, heard: events}
}

type reply struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (s *stack) do(t *testing.T, method, path, body string, headers map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	servicetest.Must(t, err, "request")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	servicetest.Must(t, err, "%s %s", method, path)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("%s %s: %d, body is not a JSON object: %q", method, path, resp.StatusCode, raw)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, path, ct)
	}
	return r
}

// raw sends a request head (without body) over a fresh connection.
func (s *stack) raw(t *testing.T, head string) (int, map[string]any) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	_, err = io.WriteString(conn, head+"Host: test\r\nContent-Type: application/json\r\n\r\n")
	servicetest.Must(t, err, "write")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	servicetest.Must(t, err, "read response")
	defer resp.Body.Close()
	var body map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("body is not JSON: %q", raw)
	}
	return resp.StatusCode, body
}

func (s *stack) put(t *testing.T, id int64, stock, limit int64, start, end time.Time) reply {
	t.Helper()
	body := fmt.Sprintf(`{"stock":%d,"per_user_limit":%d,"starts_at":%q,"ends_at":%q}`,
		stock, limit, start.Format(time.RFC3339Nano), end.Format(time.RFC3339Nano))
	return s.do(t, "PUT", fmt.Sprintf("/admin/v1/activities/%d", id), body, map[string]string{"Authorization": "Bearer " + token})
}

// openSale creates a sale open for the next hour and returns once this
// backend has acted on the events of its creation.
func (s *stack) openSale(t *testing.T, id, stock, limit int64) {
	t.Helper()
	if r := s.put(t, id, stock, limit, time.Now().Add(-time.Hour), time.Now().Add(time.Hour)); r.status != 201 {
		t.Fatalf("create activity: %d %s", r.status, r.raw)
	}
	s.caughtUp(t)
}

func (s *stack) buy(t *testing.T, id int64, user, key, body string) reply {
	t.Helper()
	h := map[string]string{"X-User-ID": user}
	if key != "" {
		h["Idempotency-Key"] = key
	}
	return s.do(t, "POST", fmt.Sprintf("/api/v1/activities/%d/purchase", id), body, h)
}

// state is everything Redis and MySQL hold for the test.
func (s *stack) state(t *testing.T) map[string]any {
	t.Helper()
	ctx := context.Background()
	out := map[string]any{}
	keys, err := redisnodes.Scan(ctx, s.rdb, s.store.Prefix()+"*")
	servicetest.Must(t, err, "keys")
	for _, k := range keys {
		switch s.rdb.Type(ctx, k).Val() {
		case "hash":
			out["redis "+k] = s.rdb.HGetAll(ctx, k).Val()
		case "zset":
			out["redis "+k] = s.rdb.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "set":
			out["redis "+k] = s.rdb.SMembers(ctx, k).Val()
		}
	}
	for _, table := range []string{"activities", "orders", "purchases"} {
		rows, err := s.db.QueryContext(ctx, "SELECT * FROM "+table)
		servicetest.Must(t, err, "select %s", table)
		cols, _ := rows.Columns()
		var all [][]string
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			servicetest.Must(t, rows.Scan(ptrs...), "scan")
			row := make([]string, len(cols))
			for i, v := range vals {
				row[i] = v.String
			}
			all = append(all, row)
		}
		rows.Close()
		out["mysql "+table] = all
	}
	return out
}

func (s *stack) queueDepth(t *testing.T) int {
	t.Helper()
	q, err := s.ch.QueueDeclarePassive(s.topo.Queue, true, false, false, false, nil)
	servicetest.Must(t, err, "inspect queue")
	return q.Messages
}

// settle plays the worker for one order: claim, MySQL transaction, settle.
func (s *stack) settle(t *testing.T, id int64, orderID string, confirm bool) {
	t.Helper()
	ctx := context.Background()
	states, err := s.store.Claim(ctx, id, []string{orderID})
	servicetest.Must(t, err, "claim")
	rec, _, err := s.store.Order(ctx, id, orderID)
	servicetest.Must(t, err, "order record")
	if states[0] != reservation.Claimed {
		t.Fatalf("claim = %s", states[0])
	}
	status, reason := "confirmed", sql.NullString{}
	if !confirm {
		status, reason = "failed", sql.NullString{String: "sold_out", Valid: true}
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO orders (order_id, activity_id, user_id, quantity, status, reason) VALUES (?,?,?,?,?,?)`,
		orderID, id, rec.UserID, rec.Quantity, status, reason)
	servicetest.Must(t, err, "insert order")
	if confirm {
		_, err = s.db.ExecContext(ctx, `INSERT INTO purchases (activity_id, user_id, quantity) VALUES (?,?,?)
			ON DUPLICATE KEY UPDATE quantity = quantity + VALUES(quantity)`, id, rec.UserID, rec.Quantity)
		servicetest.Must(t, err, "purchases")
		_, err = s.db.ExecContext(ctx, `UPDATE activities SET stock = stock - ?, sold = sold + ? WHERE id = ? AND stock >= ?`,
			rec.Quantity, rec.Quantity, id, rec.Quantity)
		servicetest.Must(t, err, "stock")
	}
	_, err = s.store.Settle(ctx, id, []reservation.Settlement{{
		OrderID: orderID, Confirmed: confirm, Reason: reason.String, Quantity: rec.Quantity, UserID: rec.UserID,
	}})
	servicetest.Must(t, err, "settle")
}

func (s *stack) metric(t *testing.T, name, label, value string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	servicetest.Must(t, err, "gather")
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestPurchaseLifecycle(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Minute)
	const id = 42
	s.openSale(t, id, 5, 2)
	if r := s.put(t, id, 6, 2, time.Now().Add(-time.Hour), time.Now().Add(time.Hour)); r.status != 200 || r.body["stock"] != 6.0 {
		t.Fatalf("update: %d %s", r.status, r.raw)
	}
	r := s.buy(t, id, "alice", "k1", `{"quantity":2}`)
	if r.status != 202 || r.body["status"] != "pending" {
		t.Fatalf("purchase: %d %s", r.status, r.raw)
	}
	oid, _ := r.body["order_id"].(string)
	if s.queueDepth(t) != 1 {
		t.Fatal("a 202 was answered but no message is in the queue")
	}
	d, ok, err := s.ch.Get(s.topo.Queue, true)
	servicetest.Must(t, err, "get")
	if !ok || d.MessageId != oid {
		t.Fatalf("message id %q, want %s", d.MessageId, oid)
	}
	msg, err := ordermsg.Decode(d.Body)
	servicetest.Must(t, err, "decode")
	if msg.UserID != "alice" || msg.Quantity != 2 || msg.IdempotencyKey != "k1" || msg.ActivityID != id {
		t.Errorf("message = %+v", msg)
	}
	got := s.do(t, "GET", "/api/v1/orders/"+oid, "", nil)
	if got.status != 200 || got.body["status"] != "pending" || got.body["user_id"] != "alice" || got.body["quantity"] != 2.0 {
		t.Fatalf("order: %d %s", got.status, got.raw)
	}
	act := s.do(t, "GET", fmt.Sprintf("/api/v1/activities/%d", id), "", nil)
	if act.body["pending"] != 2.0 || act.body["available"] != 4.0 || act.body["state"] != "open" {
		t.Errorf("activity: %s", act.raw)
	}
	s.settle(t, id, oid, true)
	got = s.do(t, "GET", "/api/v1/orders/"+oid, "", nil)
	if got.body["status"] != "confirmed" {
		t.Errorf("order after the worker: %s", got.raw)
	}
	// A replay returns the same order with its current status, reserving nothing.
	before := s.state(t)
	rep := s.buy(t, id, "alice", "k1", `{"quantity":1}`)
	if rep.status != 202 || rep.body["order_id"] != oid || rep.body["status"] != "confirmed" {
		t.Errorf("replay: %d %s", rep.status, rep.raw)
	}
	if !reflect.DeepEqual(before, s.state(t)) {
		t.Error("a replay changed Redis or MySQL")
	}
	if lim := s.buy(t, id, "alice", "k2", ""); lim.status != 409 || lim.body["code"] != "limit_exceeded" {
		t.Errorf("over the limit: %d %s", lim.status, lim.raw)
	}
	if ins := s.buy(t, id, "bob", "", `{"quantity":2}`); ins.status != 202 {
		t.Fatalf("bob: %d %s", ins.status, ins.raw)
	}
	if r := s.buy(t, id, "dave", "", ""); r.status != 202 {
		t.Fatalf("dave: %d %s", r.status, r.raw)
	}
	if ins := s.buy(t, id, "carol", "", `{"quantity":2}`); ins.status != 409 || ins.body["code"] != "insufficient_stock" || ins.body["available"] != 1.0 {
		t.Errorf("insufficient: %d %s", ins.status, ins.raw)
	}
	// Service endpoints.
	if h := s.do(t, "GET", "/healthz", "", nil); h.status != 200 {
		t.Errorf("healthz %d", h.status)
	}
	if h := s.do(t, "GET", "/readyz", "", nil); h.status != 200 {
		t.Errorf("readyz %d %s", h.status, h.raw)
	}
	resp, err := http.Get(s.url + "/metrics")
	servicetest.Must(t, err, "metrics")
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`seckill_backend_reservations_total{result="ok"} 3`, `seckill_backend_publish_total{outcome="confirmed"} 3`,
		"seckill_backend_reserve_seconds_bucket", "seckill_backend_http_requests_total"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestSaleWindowAnswers(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Minute)
	if r := s.put(t, 1, 5, 1, time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)); r.status != 201 || r.body["state"] != "upcoming" {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	if r := s.buy(t, 1, "u", "", ""); r.status != 409 || r.body["code"] != "not_started" {
		t.Errorf("before start: %d %s", r.status, r.raw)
	}
	s.put(t, 2, 5, 1, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	if r := s.buy(t, 2, "u", "", ""); r.status != 409 || r.body["code"] != "ended" {
		t.Errorf("after end: %d %s", r.status, r.raw)
	}
	if r := s.do(t, "GET", "/api/v1/activities/2", "", nil); r.body["state"] != "ended" {
		t.Errorf("state: %s", r.raw)
	}
}

// TestBadInput: each refused request answers its status and code and changes
// nothing in Redis or MySQL.
func TestBadInput(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Minute)
	const id = 5
	s.openSale(t, id, 10, 2)
	s.buy(t, id, "someone", "", "") // some state to keep intact
	user := map[string]string{"X-User-ID": "u1"}
	auth := map[string]string{"Authorization": "Bearer " + token}
	purchase := "/api/v1/activities/5/purchase"
	admin := "/admin/v1/activities/5"
	validSpec := `{"stock":3,"per_user_limit":1,"starts_at":"2020-01-01T00:00:00Z","ends_at":"2040-01-01T00:00:00Z"}`
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{}
		for a, b := range m {
			out[a] = b
		}
		out[k] = v
		return out
	}
	cases := []struct {
		name, method, path, body string
		headers                  map[string]string
		status                   int
		code                     string
	}{
		{"malformed JSON", "POST", purchase, `{"quantity":`, user, 400, "bad_request"},
		{"array body", "POST", purchase, `[1]`, user, 400, "bad_request"},
		{"string quantity", "POST", purchase, `{"quantity":"2"}`, user, 400, "bad_request"},
		{"float quantity", "POST", purchase, `{"quantity":1.5}`, user, 400, "bad_request"},
		{"exponent quantity", "POST", purchase, `{"quantity":1e12}`, user, 400, "bad_request"},
		{"huge quantity", "POST", purchase, `{"quantity":1000000000000}`, user, 400, "bad_request"},
		{"quantity 0", "POST", purchase, `{"quantity":0}`, user, 400, "bad_request"},
		{"quantity -1", "POST", purchase, `{"quantity":-1}`, user, 400, "bad_request"},
		{"quantity over the per-user limit", "POST", purchase, `{"quantity":3}`, user, 400, "bad_request"},
		{"unknown field", "POST", purchase, `{"quantity":1,"price":0}`, user, 400, "bad_request"},
		{"trailing data", "POST", purchase, `{"quantity":1} {}`, user, 400, "bad_request"},
		{"missing X-User-ID", "POST", purchase, ``, nil, 400, "bad_request"},
		{"invalid X-User-ID", "POST", purchase, ``, map[string]string{"X-User-ID": "a b"}, 400, "bad_request"},
		{"long X-User-ID", "POST", purchase, ``, map[string]string{"X-User-ID": strings.Repeat("a", 65)}, 400, "bad_request"},
		{"long Idempotency-Key", "POST", purchase, ``, with(user, "Idempotency-Key", strings.Repeat("k", 129)), 400, "bad_request"},
		{"non-ASCII Idempotency-Key", "POST", purchase, ``, with(user, "Idempotency-Key", "clé"), 400, "bad_request"},
		{"unknown activity", "POST", "/api/v1/activities/999/purchase", ``, user, 404, "activity_not_found"},
		{"malformed activity id", "POST", "/api/v1/activities/abc/purchase", ``, user, 400, "bad_request"},
		{"zero activity id", "POST", "/api/v1/activities/0/purchase", ``, user, 400, "bad_request"},
		{"unknown activity (GET)", "GET", "/api/v1/activities/999", ``, nil, 404, "activity_not_found"},
		{"unknown order", "GET", "/api/v1/orders/5-00000000000000000000000000", ``, nil, 404, "order_not_found"},
		{"malformed order id", "GET", "/api/v1/orders/nope", ``, nil, 404, "order_not_found"},
		{"admin without token", "PUT", admin, validSpec, nil, 401, "unauthorized"},
		{"admin with a wrong token", "PUT", admin, validSpec, map[string]string{"Authorization": "Bearer nope-nope-nope"}, 401, "unauthorized"},
		{"admin with another scheme", "PUT", admin, validSpec, map[string]string{"Authorization": "Basic " + token}, 401, "unauthorized"},
		{"admin malformed JSON", "PUT", admin, `{"stock":`, auth, 400, "bad_request"},
		{"admin missing field", "PUT", admin, `{"stock":3,"per_user_limit":1,"starts_at":"2020-01-01T00:00:00Z"}`, auth, 400, "bad_request"},
		{"admin negative stock", "PUT", admin, strings.Replace(validSpec, `"stock":3`, `"stock":-1`, 1), auth, 400, "bad_request"},
		{"admin string stock", "PUT", admin, strings.Replace(validSpec, `"stock":3`, `"stock":"3"`, 1), auth, 400, "bad_request"},
		{"admin limit 0", "PUT", admin, strings.Replace(validSpec, `"per_user_limit":1`, `"per_user_limit":0`, 1), auth, 400, "bad_request"},
		{"admin stock_shards 0", "PUT", admin, strings.Replace(validSpec, `{`, `{"stock_shards":0,`, 1), auth, 400, "bad_request"},
		{"admin stock_shards 65", "PUT", admin, strings.Replace(validSpec, `{`, `{"stock_shards":65,`, 1), auth, 400, "bad_request"},
		{"admin bad time", "PUT", admin, strings.Replace(validSpec, `2020-01-01T00:00:00Z`, `yesterday`, 1), auth, 400, "bad_request"},
		{"admin start after end", "PUT", admin, strings.Replace(validSpec, `2020-01-01`, `2050-01-01`, 1), auth, 400, "bad_request"},
		{"admin unknown field", "PUT", admin, strings.Replace(validSpec, `{`, `{"sold":1,`, 1), auth, 400, "bad_request"},
		{"admin bad id", "PUT", "/admin/v1/activities/-5", validSpec, auth, 400, "bad_request"},
		{"unknown route", "GET", "/api/v1/nothing", ``, nil, 404, "not_found"},
		{"wrong method", "DELETE", purchase, ``, user, 405, "method_not_allowed"},
	}
	// Oversized bodies: fasthttp refuses them from the Content-Length, before
	// reading; the raw request sends the header only, so the client cannot
	// lose the answer to a reset while still writing.
	for _, c := range []struct {
		name, head string
	}{
		{"oversized purchase body", "POST " + purchase + " HTTP/1.1\r\nX-User-ID: u1\r\nContent-Length: 4097\r\n"},
		{"oversized admin body", "PUT " + admin + " HTTP/1.1\r\nAuthorization: Bearer " + token + "\r\nContent-Length: 65537\r\n"},
	} {
		status, body := s.raw(t, c.head)
		if status != 413 || body["code"] != "body_too_large" {
			t.Errorf("%s: %d %v", c.name, status, body)
		}
	}
	// Just under the purchase limit, the body is read and judged as JSON.
	if r := s.do(t, "POST", purchase, `{"quantity":1}`+strings.Repeat(" ", 4096-14), user); r.status != 202 {
		t.Errorf("body of exactly max_body_bytes: %d %s", r.status, r.raw)
	}
	before := s.state(t)
	for _, c := range cases {
		r := s.do(t, c.method, c.path, c.body, c.headers)
		if r.status != c.status || r.body["code"] != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, r.status, r.raw, c.status, c.code)
		}
		if msg, _ := r.body["message"].(string); msg == "" {
			t.Errorf("%s: no message", c.name)
		}
	}
	if after := s.state(t); !reflect.DeepEqual(before, after) {
		t.Errorf("refused requests changed state:\nbefore %v\nafter  %v", before, after)
	}
	if n := s.queueDepth(t); n != 2 {
		t.Errorf("queue holds %d messages, want only the two valid purchases", n)
	}
}

func TestPublishFailureReleasesAndKeepsNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Minute)
	const id = 7
	s.openSale(t, id, 3, 1)
	servicetest.Must(t, s.ch.QueueUnbind(s.topo.Queue, s.topo.RoutingKey, s.topo.Exchange, nil), "unbind")
	r := s.buy(t, id, "u", "key-1", "")
	if r.status != 503 || r.body["code"] != "unavailable" || r.header.Get("Retry-After") != "1" {
		t.Fatalf("returned publish: %d %v %s", r.status, r.header, r.raw)
	}
	sale, _, err := s.store.Sale(context.Background(), id)
	servicetest.Must(t, err, "sale")
	if sale.Pending != 0 || sale.Available() != 3 {
		t.Errorf("sale after a failed publish = %+v", sale)
	}
	if e, err := s.store.User(context.Background(), id, "u"); err != nil || e.Held != 0 || len(e.Keys) != 0 { // the user's entry holds both
		t.Error("the user's hold or key survived a failed publish")
	}
	servicetest.Must(t, s.ch.QueueBind(s.topo.Queue, s.topo.RoutingKey, s.topo.Exchange, false, nil), "bind")
	if r := s.buy(t, id, "u", "key-1", ""); r.status != 202 {
		t.Errorf("retry with the same key: %d %s", r.status, r.raw)
	}
}

// The release-versus-claim race, forced both ways through the backend.
func TestReleaseVersusClaimThroughBackend(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Minute)
	const id = 8
	s.openSale(t, id, 5, 1)
	lost := errors.New("confirm lost") // may have arrived: MySQL decides
	nacked := fmt.Errorf("publish: %w", broker.ErrNacked)

	// A worker committed the order before the backend learns that the
	// outcome of its publish is unknown: the worker's row answers, 202.
	s.pub.hook = func(o ordermsg.Order, err error) error {
		if err != nil {
			return err
		}
		if _, cerr := s.store.Claim(context.Background(), o.ActivityID, []string{o.OrderID}); cerr != nil {
			return cerr
		}
		if _, ierr := s.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?,?,?,?, 'confirmed')`,
			o.OrderID, o.ActivityID, o.UserID, o.Quantity); ierr != nil {
			return ierr
		}
		return lost
	}
	r := s.buy(t, id, "a", "", "")
	if r.status != 202 || r.body["status"] != "confirmed" {
		t.Fatalf("committed by a worker before the refusal: %d %s, want 202 confirmed", r.status, r.raw)
	}

	// A worker only claimed it: the refusal in MySQL comes first (503), and
	// the worker's insert then finds the failed row.
	var refused string
	s.pub.hook = func(o ordermsg.Order, err error) error {
		if err != nil {
			return err
		}
		refused = o.OrderID
		_, cerr := s.store.Claim(context.Background(), o.ActivityID, []string{o.OrderID})
		return errors.Join(cerr, lost)
	}
	r = s.buy(t, id, "c", "", "")
	if r.status != 503 {
		t.Fatalf("claimed, not committed: %d %s, want 503", r.status, r.raw)
	}
	var status, reason string
	servicetest.Must(t, s.db.QueryRow(`SELECT status, reason FROM orders WHERE order_id = ?`, refused).Scan(&status, &reason), "refusal row")
	if status != "failed" || reason != "publish_failed" {
		t.Errorf("refused order in MySQL: %s %s, want failed publish_failed", status, reason)
	}

	// A nack (nothing queued from this publish) after a claim: release.lua
	// answers claimed, the worker decides: 202.
	s.pub.hook = func(o ordermsg.Order, err error) error {
		if err != nil {
			return err
		}
		_, cerr := s.store.Claim(context.Background(), o.ActivityID, []string{o.OrderID})
		return errors.Join(cerr, nacked)
	}
	r = s.buy(t, id, "d", "", "")
	if r.status != 202 {
		t.Fatalf("claimed before release: %d %s, want 202", r.status, r.raw)
	}
	oid, _ := r.body["order_id"].(string)
	rec, _, err := s.store.Order(context.Background(), id, oid)
	servicetest.Must(t, err, "record")
	if rec.State != reservation.Claimed {
		t.Errorf("record state %s, want C (never released)", rec.State)
	}

	// The release comes first: the worker's later claim finds F.
	var released string
	s.pub.hook = func(o ordermsg.Order, err error) error { released = o.OrderID; return nacked }
	r = s.buy(t, id, "b", "", "")
	if r.status != 503 {
		t.Fatalf("release first: %d %s, want 503", r.status, r.raw)
	}
	states, err := s.store.Claim(context.Background(), id, []string{released})
	servicetest.Must(t, err, "claim")
	if states[0] != reservation.Failed {
		t.Errorf("claim after release = %s, want F", states[0])
	}
}

// TestSoldOutFlag: sold out is answered locally, and a unit given back clears
// the flag through pub/sub (the TTL here is an hour, so only the event can).
func TestSoldOutFlag(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Hour)
	const id = 9
	s.openSale(t, id, 1, 1)
	first := s.buy(t, id, "a", "", "")
	if first.status != 202 {
		t.Fatalf("first: %d %s", first.status, first.raw)
	}
	if r := s.buy(t, id, "b", "", ""); r.status != 409 || r.body["code"] != "sold_out" {
		t.Fatalf("second: %d %s", r.status, r.raw)
	}
	if r := s.buy(t, id, "c", "", ""); r.status != 409 || r.body["code"] != "sold_out" {
		t.Fatalf("third: %d %s", r.status, r.raw)
	}
	if n := s.metric(t, "seckill_backend_reservations_total", "result", "sold_out_cached"); n != 1 {
		t.Errorf("sold_out_cached = %v, want 1 (the third answered without Redis)", n)
	}
	// With an Idempotency-Key the key is checked in Redis first.
	if r := s.buy(t, id, "a", "k", ""); r.status != 409 || r.body["code"] != "limit_exceeded" {
		t.Errorf("keyed request while flagged: %d %s", r.status, r.raw)
	}
	oid, _ := first.body["order_id"].(string)
	s.settle(t, id, oid, false) // the worker fails it: the unit is sellable again
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := s.buy(t, id, "d", "", "")
		if r.status == 202 {
			break
		}
		if r.body["code"] != "sold_out" || time.Now().After(deadline) {
			t.Fatalf("after a unit came back: %d %s", r.status, r.raw)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The backend announces a sale sold out (a v2 stock event, for the proxies
// to read its keys) once per fresh flag: not for every sold_out answer, and
// again after news cleared the flag and the sale sold out anew.
func TestSoldOutAnnounced(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Hour)
	const id = 19
	s.openSale(t, id, 1, 1)
	first := s.buy(t, id, "a", "ka", "")
	if first.status != 202 {
		t.Fatalf("first: %d %s", first.status, first.raw)
	}
	for _, u := range []string{"b", "c", "d"} { // keyed: each reaches reserve.lua
		if r := s.buy(t, id, u, "k"+u, ""); r.status != 409 || r.body["code"] != "sold_out" {
			t.Fatalf("%s: %d %s", u, r.status, r.raw)
		}
	}
	s.caughtUp(t)
	if n := s.heard.soldOuts(id); n != 1 {
		t.Fatalf("%d sold-out events for three sold_out answers, want 1", n)
	}
	oid, _ := first.body["order_id"].(string)
	s.settle(t, id, oid, false) // a unit comes back: news clears the flag
	deadline := time.Now().Add(20 * time.Second)
	for s.buy(t, id, "e", "ke", "").status != 202 {
		if time.Now().After(deadline) {
			t.Fatal("the unit that came back was never sold")
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.caughtUp(t) // the news of the unit that came back has cleared the flag
	if r := s.buy(t, id, "f", "kf", ""); r.status != 409 {
		t.Fatalf("f: %d %s", r.status, r.raw)
	}
	s.caughtUp(t)
	if n := s.heard.soldOuts(id); n != 2 {
		t.Fatalf("%d sold-out events after the second sell-out, want 2", n)
	}
}

func TestRebuildAfterRedisLoss(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Minute)
	const id = 10
	s.openSale(t, id, 5, 2)
	r := s.buy(t, id, "u", "", "")
	oid, _ := r.body["order_id"].(string)
	s.settle(t, id, oid, true)
	keys, err := s.store.SaleKeys(context.Background(), id)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, s.rdb.Del(context.Background(), keys...).Err(), "flush")
	if a := s.do(t, "GET", fmt.Sprintf("/api/v1/activities/%d", id), "", nil); a.status != 200 || a.body["sold"] != 1.0 || a.body["available"] != 4.0 {
		t.Errorf("activity from MySQL: %d %s", a.status, a.raw)
	}
	// MySQL's per-user totals come back with the sale: u holds 1 of 2.
	if r := s.buy(t, id, "u", "", `{"quantity":2}`); r.status != 409 || r.body["code"] != "limit_exceeded" {
		t.Errorf("after rebuild: %d %s", r.status, r.raw)
	}
	if r := s.buy(t, id, "u", "", ""); r.status != 202 {
		t.Errorf("after rebuild: %d %s", r.status, r.raw)
	}
	a := s.do(t, "GET", fmt.Sprintf("/api/v1/activities/%d", id), "", nil)
	if a.body["sold"] != 1.0 || a.body["pending"] != 1.0 || a.body["available"] != 3.0 {
		t.Errorf("activity after rebuild: %s", a.raw)
	}
	if o := s.do(t, "GET", "/api/v1/orders/"+oid, "", nil); o.body["status"] != "confirmed" {
		t.Errorf("order from MySQL: %s", o.raw)
	}
}

func TestUnknownActivityThenCreated(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Minute)
	if r := s.buy(t, 11, "u", "", ""); r.status != 404 || r.body["code"] != "activity_not_found" {
		t.Fatalf("unknown: %d %s", r.status, r.raw)
	}
	s.openSale(t, 11, 1, 1) // clears the negative cache
	if r := s.buy(t, 11, "u", "", ""); r.status != 202 {
		t.Errorf("after create: %d %s", r.status, r.raw)
	}
}

func TestAdminStockChanges(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Minute)
	const id = 12
	start, end := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	s.openSale(t, id, 10, 3)
	r := s.buy(t, id, "a", "", `{"quantity":3}`)
	s.settle(t, id, r.body["order_id"].(string), true) // MySQL sold 3
	s.buy(t, id, "b", "", `{"quantity":2}`)            // Redis pending 2

	before := s.state(t)
	if r := s.put(t, id, 4, 3, start, end); r.status != 409 || r.body["code"] != "stock_conflict" {
		t.Errorf("below Redis sold+pending: %d %s", r.status, r.raw)
	}
	if after := s.state(t); !reflect.DeepEqual(before, after) {
		t.Errorf("a refused change changed state:\nbefore %v\nafter  %v", before, after)
	}
	if r := s.put(t, id, 2, 3, start, end); r.status != 409 {
		t.Errorf("below MySQL sold: %d %s", r.status, r.raw)
	}
	if r := s.put(t, id, 5, 3, start, end); r.status != 200 || r.body["stock"] != 5.0 || r.body["available"] != 0.0 {
		t.Errorf("lower to sold+pending: %d %s", r.status, r.raw)
	}
	var total, stock int64
	servicetest.Must(t, s.db.QueryRow(`SELECT total_stock, stock FROM activities WHERE id = ?`, id).Scan(&total, &stock), "row")
	if total != 5 || stock != 2 {
		t.Errorf("MySQL after lowering: total %d stock %d", total, stock)
	}
	if r := s.put(t, id, 20, 3, start, end); r.status != 200 || r.body["available"] != 15.0 {
		t.Errorf("raise: %d %s", r.status, r.raw)
	}
}

// A connection beyond the backend's bound gets the API's 503 (JSON with a
// code, Retry-After) instead of fasthttp's text/plain refusal; the
// connection held still serves.
func TestConnectionBoundAnswersLikeTheAPI(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, time.Second, slog.New(slog.DiscardHandler), func(c *api.Config) { c.MaxConns = 1 })
	addr := strings.TrimPrefix(s.url, "http://")
	held, err := net.Dial("tcp", addr)
	servicetest.Must(t, err, "dial")
	defer held.Close()
	hr := bufio.NewReader(held)
	get := func() {
		t.Helper()
		_, err := held.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
		servicetest.Must(t, err, "write")
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		_ = held.SetReadDeadline(time.Now().Add(5 * time.Second))
		if err := resp.Read(hr); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("held connection: %d %v", resp.StatusCode(), err)
		}
	}
	get()
	c, err := net.Dial("tcp", addr)
	servicetest.Must(t, err, "dial")
	defer c.Close()
	_, _ = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	servicetest.Must(t, resp.Read(bufio.NewReader(c)), "read the refusal")
	var body map[string]string
	if resp.StatusCode() != 503 || string(resp.Header.ContentType()) != "application/json" ||
		string(resp.Header.Peek("Retry-After")) != "1" || json.Unmarshal(resp.Body(), &body) != nil || body["code"] != "unavailable" {
		t.Fatalf("refused connection: %d %q Retry-After %q: %s", resp.StatusCode(), resp.Header.ContentType(), resp.Header.Peek("Retry-After"), resp.Body())
	}
	get()
}

// TestShardedSale: an activity created with "stock_shards" keeps its
// count (another one is refused, 409, nothing changed), sells exactly its
// stock to buyers on every shard, its view sums the shards, and its orders
// are found by id.
func TestShardedSale(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Minute)
	const id = 13
	start, end := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	body := func(stock, shards int) string {
		return fmt.Sprintf(`{"stock":%d,"per_user_limit":1,"starts_at":%q,"ends_at":%q,"stock_shards":%d}`,
			stock, start.Format(time.RFC3339Nano), end.Format(time.RFC3339Nano), shards)
	}
	auth := map[string]string{"Authorization": "Bearer " + token}
	path := fmt.Sprintf("/admin/v1/activities/%d", id)
	if r := s.do(t, "PUT", path, body(12, 4), auth); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	before := s.state(t)
	if r := s.do(t, "PUT", path, body(12, 3), auth); r.status != 409 || !strings.Contains(fmt.Sprint(r.body["message"]), "stock_shards") {
		t.Errorf("another shard count: %d %s", r.status, r.raw)
	}
	if after := s.state(t); !reflect.DeepEqual(before, after) {
		t.Errorf("a refused change changed state")
	}
	var shards int
	servicetest.Must(t, s.db.QueryRow(`SELECT stock_shards FROM activities WHERE id = ?`, id).Scan(&shards), "row")
	if shards != 4 {
		t.Errorf("MySQL stock_shards = %d, want 4", shards)
	}
	var ids []string
	for i := 0; i < 20; i++ {
		r := s.buy(t, id, fmt.Sprintf("user%d", i), "", `{"quantity":1}`)
		switch {
		case r.status == 202:
			ids = append(ids, r.body["order_id"].(string))
		case r.status == 409 && r.body["code"] == "sold_out":
			if len(ids) < 12 {
				t.Errorf("sold_out after %d of 12", len(ids))
			}
		default:
			t.Fatalf("buy: %d %s", r.status, r.raw)
		}
	}
	if len(ids) != 12 {
		t.Errorf("sold %d, want 12", len(ids))
	}
	seen := map[int]bool{}
	for _, oid := range ids {
		k, _, err := ordermsg.ShardOf(oid)
		servicetest.Must(t, err, "order id %s", oid)
		seen[k] = true
		if r := s.do(t, "GET", "/api/v1/orders/"+oid, ``, nil); r.status != 200 || r.body["status"] != "pending" {
			t.Errorf("order %s: %d %s", oid, r.status, r.raw)
		}
	}
	if len(seen) != 4 {
		t.Errorf("orders on %d shards, want 4", len(seen))
	}
	if r := s.do(t, "GET", fmt.Sprintf("/api/v1/activities/%d", id), ``, nil); r.status != 200 ||
		r.body["stock"] != 12.0 || r.body["pending"] != 12.0 || r.body["available"] != 0.0 || r.body["state"] != "sold_out" {
		t.Errorf("view: %d %s", r.status, r.raw)
	}
}
