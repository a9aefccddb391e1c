package consume_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/worker/internal/consume"
	"github.com/seckill/seckill/worker/internal/store"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

// Orders of two activities, interleaved, one of them published three times:
// every order is decided once, batches are grouped per activity, the copies
// are recognised as redeliveries, and Redis is settled to MySQL's outcome.
func TestConsumeDecidesSettlesAndRecognisesRedeliveries(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(1, 30, 2)
	s.sale(2, 1000, 2)
	var one, two []ordermsg.Order
	for i, u := range users(15) {
		one = append(one, s.reserve(1, u, int64(1+i%2)))
		two = append(two, s.reserve(2, u, 2))
	}
	var all []ordermsg.Order
	for i := range one {
		all = append(all, one[i], two[i])
	}
	s.publishOrders(all...)
	dup, err := one[3].Encode()
	servicetest.Must(t, err, "encode")
	s.publish(one[3].OrderID, dup, dup) // the same message twice more

	r := s.start(testConfig(s.topo), nil)
	waitFor(t, "every delivery decided", func() bool {
		return value(r.m.Deliveries) == float64(len(all)+2) && s.countOrders() == len(all) && s.depth(s.topo.Queue) == 0
	})
	r.shutdown(t)

	if got := s.depth(s.topo.Queue); got != 0 {
		t.Errorf("%d messages left in the queue after shutdown: not acked", got)
	}
	if got := value(r.m.Orders.WithLabelValues(workermetrics.OutcomeRedelivered)); got != 2 {
		t.Errorf("%v redeliveries recognised, want 2", got)
	}
	var want1 int64
	for _, o := range one {
		want1 += o.Quantity
	}
	if stock, sold := s.stockSold(1); sold != want1 || stock != 30-want1 {
		t.Errorf("activity 1: stock %d sold %d, want sold %d (each order once)", stock, sold, want1)
	}
	if _, sold := s.stockSold(2); sold != 30 {
		t.Errorf("activity 2: sold %d, want 30", sold)
	}
	for _, o := range all {
		if st := s.orderStatus(o.OrderID); st != "confirmed" {
			t.Errorf("order %s: %q", o.OrderID, st)
		}
	}
	s.checkSettled(1, one)
	s.checkSettled(2, two)
}

// Sold out in MySQL although Redis sold (its keys were rebuilt wrong): the
// orders MySQL cannot hold fail as sold_out and give their units back in Redis.
func TestConsumeFailsWhatMySQLCannotHold(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(5, 10, 5)
	_, err := s.db.Exec("UPDATE activities SET stock = 4, total_stock = 4 WHERE id = 5")
	servicetest.Must(t, err, "shrink stock")
	var orders []ordermsg.Order
	for _, u := range users(8) {
		orders = append(orders, s.reserve(5, u, 1))
	}
	s.publishOrders(orders...)
	r := s.start(testConfig(s.topo), nil)
	waitFor(t, "all orders decided", func() bool { return s.countOrders() == len(orders) && s.depth(s.topo.Queue) == 0 })
	r.shutdown(t)

	if got := value(r.m.Orders.WithLabelValues(store.ReasonSoldOut)); got != 4 {
		t.Errorf("%v sold out, want 4", got)
	}
	s.checkSettled(5, orders)
	sale, _, err := s.res.Sale(context.Background(), 5)
	servicetest.Must(t, err, "sale")
	if sale.Sold != 4 || sale.Available() != 6 {
		t.Errorf("Redis sold %d available %d, want 4 and 6 (failed units given back)", sale.Sold, sale.Available())
	}
}

// A body that is not JSON and one of an unknown version go to the
// dead-letter queue exactly once each, with the reason; the valid order
// between them is written; nothing is redelivered.
func TestConsumePoisonGoesToDeadLetterOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(3, 10, 1)
	good := s.reserve(3, "ann", 1)
	bad := good
	bad.OrderID = ordermsg.NewOrderID(3)
	badBody := []byte(strings.Replace(string(must(t, bad.Encode)), `"v":1`, `"v":9`, 1))
	s.publish("garbage", []byte("{not json"))
	s.publishOrders(good)
	s.publish(bad.OrderID, badBody)

	cfg := testConfig(s.topo)
	r := s.start(cfg, nil)
	waitFor(t, "the good order written and the poison dead-lettered", func() bool {
		return s.orderStatus(good.OrderID) == "confirmed" && s.depth(s.topo.DeadQueue) == 2 && s.depth(s.topo.Queue) == 0
	})
	r.shutdown(t)

	if got := value(r.m.Deliveries); got != 3 {
		t.Errorf("%v deliveries, want 3: something was redelivered", got)
	}
	if got := value(r.m.DeadLettered.WithLabelValues(workermetrics.DeadPublished)); got != 2 {
		t.Errorf("%v dead-lettered with a reason, want 2", got)
	}
	if got := s.depth(s.topo.Queue); got != 0 {
		t.Errorf("%d messages back in the order queue", got)
	}
	reasons := map[string]string{}
	for range 2 {
		d, ok, err := s.pubCh.Get(s.topo.DeadQueue, true)
		servicetest.Must(t, err, "get dead letter")
		if !ok {
			t.Fatal("dead-letter queue emptied early")
		}
		reason, _ := d.Headers[broker.DeadReasonHeader].(string)
		reasons[d.MessageId] = reason
	}
	if s.depth(s.topo.DeadQueue) != 0 {
		t.Error("more than two dead letters")
	}
	if r := reasons["garbage"]; !strings.Contains(r, "invalid order message") {
		t.Errorf("reason of the garbage body: %q", r)
	}
	if r := reasons[bad.OrderID]; !strings.Contains(r, "version 9") {
		t.Errorf("reason of the bad version: %q", r)
	}
	if s.orderStatus(bad.OrderID) != "" {
		t.Error("the invalid order reached MySQL")
	}
}

func must(t testing.TB, f func() ([]byte, error)) []byte {
	t.Helper()
	b, err := f()
	servicetest.Must(t, err, "encode")
	return b
}

// gate holds the first Write until released, so that a shutdown begins while
// a batch is in hand; it records the orders of every Write.
type gate struct {
	w       consume.Writer
	once    sync.Once
	entered chan []store.Order
	release chan struct{}
	mu      sync.Mutex
	written []store.Order
}

func (g *gate) Write(ctx context.Context, id int64, orders []store.Order) ([]store.Outcome, error) {
	g.once.Do(func() {
		g.entered <- slices.Clone(orders)
		<-g.release
	})
	g.mu.Lock()
	g.written = append(g.written, orders...)
	g.mu.Unlock()
	return g.w.Write(ctx, id, orders)
}

func (g *gate) Fail(ctx context.Context, o ordermsg.Order, reason string) (store.Outcome, error) {
	return g.w.Fail(ctx, o, reason)
}

// A shutdown that begins while a batch is being written finishes it, and the
// batch collected (and claimed) behind it meanwhile: both are committed,
// acked and settled; deliveries not yet in hand are left unacked, and
// pending in Redis, for another worker.
func TestConsumeGracefulShutdownAcksBatchInHand(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(4, 100, 2)
	var orders []ordermsg.Order
	for _, u := range users(70) {
		orders = append(orders, s.reserve(4, u, 1))
	}
	s.publishOrders(orders...)
	cfg := testConfig(s.topo)
	cfg.Consumers = 1
	g := &gate{entered: make(chan []store.Order, 1), release: make(chan struct{})}
	r := s.start(cfg, func(m *workermetrics.Metrics) consume.Writer {
		g.w = store.New(s.db, m, 10*time.Second)
		return g
	})
	first := <-g.entered
	r.stop() // shutdown begins with the batch in hand
	close(g.release)
	r.shutdown(t)

	inHand := g.written // the first batch and the one collected behind it
	if len(first) == 0 || len(first) > cfg.BatchSize || len(inHand) < len(first) || len(inHand) > 2*cfg.BatchSize {
		t.Fatalf("batches in hand: %d orders, the first %d; want at most two batches", len(inHand), len(first))
	}
	if got := s.countOrders(); got != len(inHand) {
		t.Errorf("%d orders in MySQL, want the %d in hand", got, len(inHand))
	}
	// Only an acked batch leaves the queue.
	want := len(orders) - len(inHand)
	waitFor(t, "the unacked deliveries back in the queue", func() bool { return s.depth(s.topo.Queue) >= want })
	if got := s.depth(s.topo.Queue); got != want {
		t.Errorf("%d messages in the queue, want %d: the batch in hand was not acked", got, want)
	}
	handed := map[string]bool{}
	for _, o := range inHand {
		handed[o.OrderID] = true
		if st := s.orderStatus(o.OrderID); st != "confirmed" {
			t.Errorf("order %s in hand: %q", o.OrderID, st)
		}
	}
	var rest []ordermsg.Order
	ctx := context.Background()
	for _, o := range orders {
		if handed[o.OrderID] {
			continue
		}
		rest = append(rest, o)
		rec, _, err := s.res.Order(ctx, 4, o.OrderID)
		servicetest.Must(t, err, "record")
		if rec.State != reservation.Pending {
			t.Errorf("order %s not in hand is %q in Redis, want still pending", o.OrderID, rec.State)
		}
	}
	sale, _, err := s.res.Sale(ctx, 4)
	servicetest.Must(t, err, "sale")
	if sale.Sold != int64(len(inHand)) || sale.Pending != int64(len(rest)) {
		t.Errorf("Redis sold %d pending %d, want %d and %d", sale.Sold, sale.Pending, len(inHand), len(rest))
	}

	// Another worker drains the rest.
	r2 := s.start(testConfig(s.topo), nil)
	waitFor(t, "the rest drained", func() bool { return s.countOrders() == len(orders) && s.depth(s.topo.Queue) == 0 })
	r2.shutdown(t)
	s.checkSettled(4, orders)
}

// MySQL unreachable: nothing is acked, the messages stay queued (a worker
// stopped during the outage leaves every one of them), and once MySQL is back
// the queue drains with each order written once.
func TestConsumeMySQLUnreachable(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(6, 100, 2)
	var orders []ordermsg.Order
	for _, u := range users(25) {
		orders = append(orders, s.reserve(6, u, 2))
	}
	s.publishOrders(orders...)

	p := newProxy(t, mustAddr(t, s.dsn), true)
	down := s.openDB(proxiedDSN(t, s.dsn, p.addr()))
	p.set(false)

	cfg := testConfig(s.topo)
	cfg.ShutdownGrace = 200 * time.Millisecond
	a := s.start(cfg, via(down))
	waitFor(t, "retries during the outage", func() bool {
		return value(a.m.Retries.WithLabelValues(workermetrics.CauseMySQL)) >= 3
	})
	a.shutdown(t)
	if got := s.countOrders(); got != 0 {
		t.Fatalf("%d orders written through an unreachable MySQL", got)
	}
	waitFor(t, "every message back in the queue", func() bool { return s.depth(s.topo.Queue) >= len(orders) })
	if got := s.depth(s.topo.Queue); got != len(orders) {
		t.Fatalf("%d of %d messages in the queue: something was acked without a commit", got, len(orders))
	}

	b := s.start(testConfig(s.topo), via(down))
	waitFor(t, "retries during the outage", func() bool {
		return value(b.m.Retries.WithLabelValues(workermetrics.CauseMySQL)) >= 2
	})
	if got := s.countOrders(); got != 0 {
		t.Fatalf("%d orders written through an unreachable MySQL", got)
	}
	p.set(true)
	waitFor(t, "the queue drained after MySQL came back", func() bool {
		return s.countOrders() == len(orders) && s.depth(s.topo.Queue) == 0
	})
	b.shutdown(t)
	if stock, sold := s.stockSold(6); sold != 50 || stock != 50 {
		t.Errorf("stock %d sold %d, want 50 and 50", stock, sold)
	}
	s.checkSettled(6, orders)
}

// A dropped broker connection: the consumer re-dials with back-off,
// re-declares, re-subscribes, and what was in flight is redelivered and
// recognised; every order ends written once.
func TestConsumeReconnectsAfterDroppedConnection(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(8, 1000, 2)
	var orders []ordermsg.Order
	for _, u := range users(60) {
		orders = append(orders, s.reserve(8, u, 1))
	}
	s.publishOrders(orders[:40]...)
	p := newProxy(t, mustHostPort(t, servicetest.AMQPURL()), true)
	cfg := testConfig(s.topo)
	cfg.URLs = []string{strings.Replace(servicetest.AMQPURL(), mustHostPort(t, servicetest.AMQPURL()), p.addr(), 1)}
	r := s.start(cfg, nil)
	waitFor(t, "some orders written", func() bool { return s.countOrders() >= 10 })
	p.set(false) // cut the connection
	p.set(true)
	waitFor(t, "a new session", func() bool { return value(r.m.Reconnects) >= 1 })
	s.publishOrders(orders[40:]...)
	waitFor(t, "every order written after the reconnect", func() bool {
		return s.countOrders() == len(orders) && s.depth(s.topo.Queue) == 0
	})
	r.shutdown(t)
	if stock, sold := s.stockSold(8); sold != int64(len(orders)) || stock != 1000-int64(len(orders)) {
		t.Errorf("stock %d sold %d, want sold %d", stock, sold, len(orders))
	}
	s.checkSettled(8, orders)
}

// Several broker addresses: the consumer connects past a node that is down
// (the first address) and, when its node dies mid-consumption, goes on on
// the next one — without that node coming back.
func TestConsumeMovesToTheNextNode(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(9, 1000, 2)
	var orders []ordermsg.Order
	for _, u := range users(60) {
		orders = append(orders, s.reserve(9, u, 1))
	}
	s.publishOrders(orders[:40]...)
	broker := mustHostPort(t, servicetest.AMQPURL())
	down, a, b := newProxy(t, broker, false), newProxy(t, broker, true), newProxy(t, broker, true)
	at := func(p *proxy) string { return strings.Replace(servicetest.AMQPURL(), broker, p.addr(), 1) }
	cfg := testConfig(s.topo)
	cfg.URLs = []string{at(down), at(a), at(b)}
	r := s.start(cfg, nil)
	waitFor(t, "some orders written", func() bool { return s.countOrders() >= 10 })
	if got := value(r.m.Node.WithLabelValues(a.addr())); got != 1 {
		t.Fatalf("consuming from node %s: %v, want 1 (the first that is up)", a.addr(), got)
	}
	a.set(false) // its node dies, and stays down
	waitFor(t, "a session on the next node", func() bool { return value(r.m.Node.WithLabelValues(b.addr())) == 1 })
	s.publishOrders(orders[40:]...)
	waitFor(t, "every order written on the next node", func() bool {
		return s.countOrders() == len(orders) && s.depth(s.topo.Queue) == 0
	})
	r.shutdown(t)
	if _, sold := s.stockSold(9); sold != int64(len(orders)) {
		t.Errorf("sold %d, want %d", sold, len(orders))
	}
	s.checkSettled(9, orders)
}

// An order MySQL rejects for good (here CHECK constraints the test adds) is
// tried a bounded number of times, then recorded failed ("rejected") in
// MySQL — the truth, which outlives Redis — and settled failed in Redis; only
// an order whose failed row MySQL refuses too is dead-lettered, once, with
// MySQL's reason. The rest of the batch is confirmed and the channel goes on.
func TestConsumePermanentMySQLErrorRecordsTheOrderFailed(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(4, 10, 1)
	// poison: MySQL refuses to confirm it; toxic: MySQL refuses any row of it.
	_, err := s.db.Exec(`ALTER TABLE orders ADD CONSTRAINT no_poison CHECK (status <> 'confirmed' OR user_id <> 'poison')`)
	servicetest.Must(t, err, "add constraint")
	_, err = s.db.Exec(`ALTER TABLE orders ADD CONSTRAINT no_toxic CHECK (user_id <> 'toxic')`)
	servicetest.Must(t, err, "add constraint")
	var orders []ordermsg.Order
	for _, u := range []string{"ann", "bob", "poison", "cat", "toxic", "dan"} {
		orders = append(orders, s.reserve(4, u, 1))
	}
	s.publishOrders(orders...)
	cfg := testConfig(s.topo)
	cfg.BatchSize = 10
	cfg.BatchWait = 200 * time.Millisecond // one batch
	r := s.start(cfg, nil)
	waitFor(t, "the batch decided and the toxic row dead-lettered", func() bool {
		return s.countOrders() == 5 && s.depth(s.topo.DeadQueue) == 1 && s.depth(s.topo.Queue) == 0
	})
	later := s.reserve(4, "eve", 1)
	s.publishOrders(later)
	waitFor(t, "the channel goes on", func() bool { return s.orderStatus(later.OrderID) == "confirmed" })
	r.shutdown(t)
	for _, o := range orders {
		want := "confirmed"
		switch o.UserID {
		case "poison":
			want = "failed"
		case "toxic":
			want = ""
		}
		if got := s.orderStatus(o.OrderID); got != want {
			t.Errorf("order of %s: %q, want %q", o.UserID, got, want)
		}
	}
	var reason string
	servicetest.Must(t, s.db.QueryRow(`SELECT reason FROM orders WHERE order_id = ?`, orders[2].OrderID).Scan(&reason), "reason")
	if reason != consume.ReasonRejected {
		t.Errorf("rejected order's reason in MySQL: %q, want %q", reason, consume.ReasonRejected)
	}
	d, ok, err := s.pubCh.Get(s.topo.DeadQueue, true)
	servicetest.Must(t, err, "get dead letter")
	if !ok || d.MessageId != orders[4].OrderID {
		t.Fatalf("dead letter %q (found %v), want the toxic order", d.MessageId, ok)
	}
	if reason, _ := d.Headers[broker.DeadReasonHeader].(string); !strings.Contains(reason, "no_toxic") {
		t.Errorf("dead-letter reason %q does not name the constraint", reason)
	}
	if got := value(r.m.DeadLettered.WithLabelValues(workermetrics.DeadPublished)); got != 1 {
		t.Errorf("%v dead letters, want 1", got)
	}
	for _, o := range []ordermsg.Order{orders[2], orders[4]} {
		rec, found, err := s.res.Order(context.Background(), 4, o.OrderID)
		servicetest.Must(t, err, "record")
		if !found || rec.State != reservation.Failed || rec.Reason != consume.ReasonRejected {
			t.Errorf("rejected order of %s in Redis: %+v (found %v), want failed/rejected", o.UserID, rec, found)
		}
	}
	if stock, sold := s.stockSold(4); sold != 5 || stock != 5 {
		t.Errorf("stock %d sold %d, want 5 and 5", stock, sold)
	}
}

// The backend answered 503 after a publish whose confirm it never saw (the
// frame reached the broker): it refused the order in MySQL first (a failed
// row, "publish_failed") and then released it in Redis. Redis then loses the
// sale, so the worker's claim answers "?" and only MySQL can stop the queued
// message from confirming: the 503'd order must stay failed.
func TestConsumeRefusedOrderStaysFailedAfterRedisLoss(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	rdb, prefix := servicetest.Redis(t)
	s.res = reservation.New(rdb, prefix)
	s.sale(41, 10, 1)
	o := s.reserve(41, "told-503", 1)
	o.IdempotencyKey = "k"
	_, err := s.db.Exec(`INSERT IGNORE INTO orders (order_id, activity_id, user_id, quantity, status, reason) VALUES (?, ?, ?, ?, 'failed', 'publish_failed')`,
		o.OrderID, o.ActivityID, o.UserID, o.Quantity)
	servicetest.Must(t, err, "refusal")
	out, err := s.res.Undo(context.Background(), 41, o.OrderID, "publish_failed", o.UserID, "k")
	servicetest.Must(t, err, "undo")
	if out != reservation.Released {
		t.Fatalf("undo: %s", out)
	}
	s.publishOrders(o) // the message the broker had all along
	keys, err := s.res.SaleKeys(context.Background(), 41)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, rdb.Del(context.Background(), keys...).Err(), "lose Redis")
	r := s.start(testConfig(s.topo), nil)
	waitFor(t, "the order decided", func() bool { return s.countOrders() == 1 && s.depth(s.topo.Queue) == 0 })
	r.shutdown(t)
	if st := s.orderStatus(o.OrderID); st != "failed" {
		t.Errorf("order %s was answered 503 (refused in MySQL), yet ended %q after Redis lost the sale", o.OrderID, st)
	}
	if _, sold := s.stockSold(41); sold != 0 {
		t.Errorf("sold %d, want 0", sold)
	}
}
