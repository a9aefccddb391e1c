package consume_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/brokertest"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/worker/internal/consume"
	"github.com/seckill/seckill/worker/internal/store"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

// stack is one test's isolated share of the real Redis, MariaDB and RabbitMQ.
type stack struct {
	t     testing.TB
	res   *reservation.Store
	rdb   redis.UniversalClient // res's
	amqp  string                // the test's AMQP name prefix
	db    *sql.DB               // direct, always reachable
	dsn   string
	topo  broker.Topology
	pubCh *amqp.Channel // confirm-mode publisher, separate connection
}

func newStack(t testing.TB) *stack {
	t.Helper()
	return newStackWith(t, 1)
}

// newStackWith is newStack with the order queue in partitions partitions.
func newStackWith(t testing.TB, partitions int) *stack {
	t.Helper()
	rdb, prefix := servicetest.Redis(t)
	s := &stack{t: t, res: reservation.New(rdb, prefix), rdb: rdb, dsn: servicetest.MySQLDSN(t)}
	s.db = s.openDB(s.dsn)
	p := brokertest.Prefix(t)
	s.amqp = p
	s.topo = broker.TopologyFor(conf.RabbitMQ{Prefix: p, DeliveryLimit: 5, Partitions: partitions})
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial publisher")
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	servicetest.Must(t, err, "publisher channel")
	servicetest.Must(t, s.topo.Declare(ch), "declare")
	servicetest.Must(t, ch.Confirm(false), "confirm mode")
	s.pubCh = ch
	return s
}

// openDB opens dsn through schema.Open (creating the schema).
func (s *stack) openDB(dsn string) *sql.DB {
	s.t.Helper()
	c := conf.Default().MySQL
	c.DSN = dsn
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := schema.Open(ctx, c, schema.ReadCommitted)
	servicetest.Must(s.t, err, "open %s", dsn)
	s.t.Cleanup(func() { _ = db.Close() })
	return db
}

// sale creates activity id in MySQL and Redis.
func (s *stack) sale(id, stock, limit int64) {
	s.t.Helper()
	start, end := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	_, err := s.db.Exec(`INSERT INTO activities (id, total_stock, stock, sold, per_user_limit, starts_at, ends_at)
		VALUES (?, ?, ?, 0, ?, ?, ?)`, id, stock, stock, limit, start, end)
	servicetest.Must(s.t, err, "create sale")
	out, _, err := s.res.Warm(context.Background(), id, reservation.WarmArgs{Total: stock, Limit: limit, Start: start, End: end})
	servicetest.Must(s.t, err, "warm")
	if out != reservation.WarmCreated {
		s.t.Fatalf("warm: %s", out)
	}
}

// reserve makes a reservation in Redis, as the backend does, and returns its message.
func (s *stack) reserve(activity int64, user string, qty int64) ordermsg.Order {
	s.t.Helper()
	r, err := s.res.Reserve(context.Background(), reservation.Request{ActivityID: activity, UserID: user,
		Quantity: qty, OrderID: ordermsg.NewOrderID(activity), TTL: time.Minute})
	servicetest.Must(s.t, err, "reserve")
	if r.Outcome != reservation.Reserved {
		s.t.Fatalf("reserve %s×%d: %s", user, qty, r.Outcome)
	}
	return ordermsg.Order{V: ordermsg.Version, OrderID: r.OrderID, ActivityID: activity, UserID: user,
		Quantity: qty, ReservedAt: time.Now().UnixMilli(), Deadline: r.Deadline.UnixMilli()}
}

// publish publishes raw bodies to the order exchange and waits for every confirm.
func (s *stack) publish(msgID string, bodies ...[]byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var confs []*amqp.DeferredConfirmation
	for _, b := range bodies {
		c, err := s.pubCh.PublishWithDeferredConfirmWithContext(ctx, s.topo.Exchange, s.topo.RoutingKey, true, false,
			amqp.Publishing{ContentType: ordermsg.ContentType, DeliveryMode: amqp.Persistent, MessageId: msgID, Body: b})
		servicetest.Must(s.t, err, "publish")
		confs = append(confs, c)
	}
	for _, c := range confs {
		ok, err := c.WaitContext(ctx)
		if err != nil || !ok {
			s.t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

func (s *stack) publishOrders(orders ...ordermsg.Order) {
	s.t.Helper()
	for _, o := range orders {
		b, err := o.Encode()
		servicetest.Must(s.t, err, "encode")
		s.publish(o.OrderID, b)
	}
}

// depth is the number of ready messages of a queue.
func (s *stack) depth(queue string) int {
	s.t.Helper()
	q, err := s.pubCh.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	servicetest.Must(s.t, err, "inspect %s", queue)
	return q.Messages
}

func (s *stack) countOrders() int {
	s.t.Helper()
	var n int
	servicetest.Must(s.t, s.db.QueryRow("SELECT COUNT(*) FROM orders").Scan(&n), "count orders")
	return n
}

func (s *stack) stockSold(id int64) (stock, sold int64) {
	s.t.Helper()
	servicetest.Must(s.t, s.db.QueryRow("SELECT stock, sold FROM activities WHERE id = ?", id).Scan(&stock, &sold), "read sale")
	return stock, sold
}

// orderStatus is the order's status in MySQL ("" when absent).
func (s *stack) orderStatus(id string) string {
	s.t.Helper()
	var st string
	err := s.db.QueryRow("SELECT status FROM orders WHERE order_id = ?", id).Scan(&st)
	if err == sql.ErrNoRows {
		return ""
	}
	servicetest.Must(s.t, err, "read order")
	return st
}

// checkSettled asserts that Redis agrees with MySQL on every order given and
// on the sale's counters, with nothing pending.
func (s *stack) checkSettled(activity int64, orders []ordermsg.Order) {
	s.t.Helper()
	ctx := context.Background()
	for _, o := range orders {
		rec, found, err := s.res.Order(ctx, activity, o.OrderID)
		servicetest.Must(s.t, err, "read record")
		want := s.orderStatus(o.OrderID)
		if !found || rec.State.Public() != want {
			s.t.Errorf("order %s: Redis %q (found %v), MySQL %q", o.OrderID, rec.State, found, want)
		}
	}
	sale, _, err := s.res.Sale(ctx, activity)
	servicetest.Must(s.t, err, "read sale")
	_, sold := s.stockSold(activity)
	if sale.Sold != sold || sale.Pending != 0 {
		t := s.t
		t.Errorf("Redis sold %d pending %d, MySQL sold %d", sale.Sold, sale.Pending, sold)
	}
}

func testConfig(topo broker.Topology) consume.Config {
	return consume.Config{
		URLs:           []string{servicetest.AMQPURL()},
		Topology:       topo,
		Consumers:      2,
		Prefetch:       50,
		BatchSize:      20,
		BatchWait:      5 * time.Millisecond,
		RetryMin:       10 * time.Millisecond,
		RetryMax:       100 * time.Millisecond,
		ReconnectMin:   20 * time.Millisecond,
		ReconnectMax:   200 * time.Millisecond,
		ConfirmTimeout: 10 * time.Second,
		RedisTimeout:   5 * time.Second,
		ShutdownGrace:  30 * time.Second,
		Name:           "consume test",
		// Short, so that a recovery ends within a test's patience.
		RegistryRefresh: 100 * time.Millisecond,
		RegistryTTL:     3 * time.Second,
		MarkerPause:     50 * time.Millisecond,
	}
}

// endRecovery is the worker's: salesdb.EndRecovery on the test's MySQL and
// Redis (s.res as it is when called).
func (s *stack) endRecovery(ctx context.Context, id int64, token string) (bool, error) {
	return salesdb.EndRecovery(ctx, s.db, s.res, id, token)
}

// running is a consumer started by start.
type running struct {
	m    *workermetrics.Metrics
	stop context.CancelFunc
	done chan error
}

// start runs a consumer writing through the writer mk builds on the
// consumer's metrics (nil: a store on s.db).
func (s *stack) start(cfg consume.Config, mk func(*workermetrics.Metrics) consume.Writer) *running {
	s.t.Helper()
	return s.startWith(cfg, s.res, mk)
}

// startWith is start with the consumer's Redis side res.
func (s *stack) startWith(cfg consume.Config, res consume.Reservations, mk func(*workermetrics.Metrics) consume.Writer) *running {
	s.t.Helper()
	m := workermetrics.New(prometheus.NewRegistry())
	var w consume.Writer = store.New(s.db, m, 10*time.Second)
	if mk != nil {
		w = mk(m)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{s.t}, nil))
	}
	c := consume.New(cfg, res, w, s.endRecovery, m, log)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{m: m, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	s.t.Cleanup(func() { r.shutdown(s.t) })
	return r
}

// shutdown stops the consumer and waits for Run to return.
func (r *running) shutdown(t testing.TB) {
	t.Helper()
	r.stop()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run: %v", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("consumer did not stop")
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// waitFor polls cond until it holds; the bound only keeps a broken build from
// hanging, it is no speed goal.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// value reads a counter or the sample count of a histogram.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if h := d.GetHistogram(); h != nil {
		return float64(h.GetSampleCount())
	}
	if g := d.GetGauge(); g != nil {
		return g.GetValue()
	}
	return d.GetCounter().GetValue()
}

// proxy is a TCP forwarder that can be switched off: while down it accepts
// and at once closes every connection (a server that is gone), and switching
// it down cuts the connections it carries.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	up     bool
	conns  map[net.Conn]struct{}
}

func newProxy(t testing.TB, target string, up bool) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "proxy listen")
	p := &proxy{ln: ln, target: target, up: up, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.set(false)
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) set(up bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up = up
	if !up {
		for c := range p.conns {
			_ = c.Close()
		}
		clear(p.conns)
	}
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

func (p *proxy) pipe(c net.Conn) {
	p.mu.Lock()
	up := p.up
	p.mu.Unlock()
	if !up {
		_ = c.Close()
		return
	}
	u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if !p.up {
		p.mu.Unlock()
		_ = c.Close()
		_ = u.Close()
		return
	}
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
	_, _ = io.Copy(c, u)
	_ = c.Close()
}

// proxiedDSN is dsn with its address replaced by addr.
func proxiedDSN(t testing.TB, dsn, addr string) string {
	t.Helper()
	c, err := mysql.ParseDSN(dsn)
	servicetest.Must(t, err, "parse dsn")
	c.Addr = addr
	return c.FormatDSN()
}

// via returns a writer factory of a store on db.
func via(db *sql.DB) func(*workermetrics.Metrics) consume.Writer {
	return func(m *workermetrics.Metrics) consume.Writer { return store.New(db, m, 2*time.Second) }
}

func mustAddr(t testing.TB, dsn string) string {
	t.Helper()
	c, err := mysql.ParseDSN(dsn)
	servicetest.Must(t, err, "parse dsn")
	return c.Addr
}

func mustHostPort(t testing.TB, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	servicetest.Must(t, err, "parse url")
	return u.Host
}

func users(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("user-%03d", i)
	}
	return out
}

func TestMain(m *testing.M) {
	// The driver reports every connection the outage test breaks; quiet it.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	os.Exit(m.Run())
}
