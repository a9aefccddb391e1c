package consume_test

import (
	"context"
	"strings"
	"sync/atomic"
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

// publishBatch publishes orders as one multi-order (v2) message.
func (s *stack) publishBatch(msgID string, orders ...ordermsg.Order) {
	s.t.Helper()
	b, err := ordermsg.Batch{Orders: orders}.Encode()
	servicetest.Must(s.t, err, "encode batch")
	s.publish(msgID, b)
}

// batchBody is a v2 body of the given order bodies, as they are.
func batchBody(t testing.TB, orders ...any) []byte {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"v":2,"orders":[`)
	for i, o := range orders {
		if i > 0 {
			b.WriteString(",")
		}
		switch o := o.(type) {
		case ordermsg.Order:
			b.Write(must(t, o.Encode))
		case string:
			b.WriteString(o)
		}
	}
	b.WriteString("]}")
	return []byte(b.String())
}

// deadLetters takes every message of the dead-letter queue: body and reason
// by message id.
func (s *stack) deadLetters(n int) map[string][2]string {
	s.t.Helper()
	out := map[string][2]string{}
	for range n {
		d, ok, err := s.pubCh.Get(s.topo.DeadQueue, true)
		servicetest.Must(s.t, err, "get dead letter")
		if !ok {
			s.t.Fatalf("dead-letter queue emptied after %d of %d", len(out), n)
		}
		reason, _ := d.Headers[broker.DeadReasonHeader].(string)
		out[d.MessageId] = [2]string{string(d.Body), reason}
	}
	if got := s.depth(s.topo.DeadQueue); got != 0 {
		s.t.Errorf("%d more dead letters", got)
	}
	return out
}

// A poison order inside a multi-order message, one MySQL rejects for good
// inside another, single-order messages of the same activity between them,
// all in one batch: only the two bad orders are dead-lettered, each alone
// (its own v1 body, the reason), every neighbour is confirmed, and every
// message is acked. Then the dead-letter consumer decides the rejected one
// from its single-order body and drops the poison.
func TestConsumeMultiOrderPoisonIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(50, 100, 1)
	_, err := s.db.Exec(`ALTER TABLE orders ADD CONSTRAINT no_toxic CHECK (user_id <> 'toxic')`)
	servicetest.Must(t, err, "add constraint")
	var first, second, single []ordermsg.Order
	for _, u := range []string{"a1", "a2", "a3"} {
		first = append(first, s.reserve(50, u, 1))
	}
	for _, u := range []string{"b1", "toxic", "b2"} {
		second = append(second, s.reserve(50, u, 1))
	}
	for _, u := range []string{"c1", "c2"} {
		single = append(single, s.reserve(50, u, 1))
	}
	toxic := second[1]
	poison := `{"v":1,"order_id":"` + ordermsg.NewOrderID(50) + `","activity_id":50,"user_id":"no spaces","quantity":1,"reserved_at":0,"deadline":0}`
	s.publish("first", batchBody(t, first[0], first[1], poison, first[2]))
	s.publishOrders(single[0])
	s.publishBatch("second", second...)
	s.publishOrders(single[1])

	cfg := testConfig(s.topo)
	cfg.Consumers, cfg.BatchSize, cfg.BatchWait = 1, 50, 300*time.Millisecond // one batch
	r := s.start(cfg, nil)
	good := append(append(append([]ordermsg.Order{}, first...), second[0], second[2]), single...)
	waitFor(t, "the neighbours confirmed and both bad orders dead-lettered", func() bool {
		return s.countOrders() == len(good) && s.depth(s.topo.DeadQueue) == 2 && s.depth(s.topo.Queue) == 0
	})
	r.shutdown(t)
	if got := value(r.m.Deliveries); got != 4 {
		t.Errorf("%v deliveries, want 4: something was redelivered", got)
	}
	for _, o := range good {
		if st := s.orderStatus(o.OrderID); st != "confirmed" {
			t.Errorf("neighbour %s of a bad order: %q, want confirmed", o.UserID, st)
		}
	}
	if st := s.orderStatus(toxic.OrderID); st != "" {
		t.Errorf("the rejected order has a row %q", st)
	}
	dead := s.deadLetters(2)
	if d, ok := dead["first#2"]; !ok || d[0] != poison || !strings.Contains(d[1], "user_id") || !strings.Contains(d[1], "order 2 of the batch") {
		t.Errorf("poison dead letter %q: %+v; want its own body and the reason (all: %v)", "first#2", d, dead)
	}
	d, ok := dead[toxic.OrderID]
	back, err := ordermsg.Decode([]byte(d[0]))
	if !ok || err != nil || back != toxic || !strings.Contains(d[1], "no_toxic") {
		t.Errorf("rejected order's dead letter %+v (%v): want its single-order body and MySQL's reason", d, err)
	}
	rec, _, err := s.res.Order(context.Background(), 50, toxic.OrderID)
	servicetest.Must(t, err, "record")
	if rec.State != reservation.Failed || rec.Reason != consume.ReasonRejected {
		t.Errorf("rejected order in Redis %+v, want failed/rejected", rec)
	}
	s.checkSettled(50, good)
	if stock, sold := s.stockSold(50); sold != int64(len(good)) || stock != 100-int64(len(good)) {
		t.Errorf("stock %d sold %d, want sold %d", stock, sold, len(good))
	}

	// The dead-letter consumer takes the rejected order's own body like any
	// dead-lettered order (the poison is dropped): the queue empties.
	s.deadLetterRaw(toxic.OrderID, []byte(d[0]))
	s.deadLetterRaw("first#2", []byte(poison))
	cfg.DeadLetters = true
	r2 := s.start(cfg, nil)
	waitFor(t, "the dead-letter queue consumed", func() bool { return s.depth(s.topo.DeadQueue) == 0 })
	r2.shutdown(t)
	sale, _, err := s.res.Sale(context.Background(), 50)
	servicetest.Must(t, err, "sale")
	if sale.Pending != 0 || sale.Sold != int64(len(good)) {
		t.Errorf("Redis sale %+v after the dead letters, want sold %d, nothing pending", sale, len(good))
	}
}

// Single-order and multi-order messages of two activities interleaved in one
// batch: the orders of each activity, whichever message carried them, are
// decided in one transaction (two in all), and every message is acked. A
// multi-order message whose orders span two activities is refused whole (the
// backend publishes one per activity: it is a producer bug) with the
// reason; the dead-letter consumer then decides each of its orders, so
// their units do not wait for queued_expire_after.
func TestConsumeMixedVersionsInOneBatch(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(51, 100, 2)
	s.sale(52, 100, 2)
	var a, b []ordermsg.Order
	for _, u := range users(12) {
		a = append(a, s.reserve(51, u, 1))
		b = append(b, s.reserve(52, u, 2))
	}
	s.publishOrders(a[0], b[0])
	s.publishBatch("a-1", a[1:6]...)
	s.publishBatch("b-1", b[1:8]...)
	s.publishOrders(a[6], a[7])
	s.publishBatch("a-2", a[8:10]...)
	s.publishOrders(b[8:10]...)
	span := []ordermsg.Order{a[10], b[10], a[11]}
	s.publish("span", batchBody(t, span[0], span[1], span[2]))
	s.publishBatch("b-2", b[11])

	cfg := testConfig(s.topo)
	cfg.Consumers, cfg.BatchSize, cfg.BatchWait = 1, 100, 300*time.Millisecond
	r := s.start(cfg, nil)
	decidedA, decidedB := a[:10], append(append([]ordermsg.Order{}, b[:10]...), b[11])
	waitFor(t, "every message decided", func() bool {
		return s.countOrders() == len(decidedA)+len(decidedB) && s.depth(s.topo.Queue) == 0 && s.depth(s.topo.DeadQueue) == 1
	})
	r.shutdown(t)
	if got := value(r.m.Batches); got != 2 {
		t.Errorf("%v MySQL batches, want 2: one per activity across single and multi-order messages", got)
	}
	if got := value(r.m.Deliveries); got != 11 {
		t.Errorf("%v deliveries, want 11", got)
	}
	dead := s.deadLetters(1)
	if d := dead["span"]; !strings.Contains(d[1], "activities 51 and 52") {
		t.Errorf("the two-activity message's dead letter %+v, want it whole with the reason", d)
	}
	for _, o := range span {
		if st := s.orderStatus(o.OrderID); st != "" {
			t.Errorf("order %s of the refused message written: %q", o.OrderID, st)
		}
	}

	// Dead-lettered whole, it is decided order by order: failed
	// (dead_lettered) in MySQL, units released in Redis.
	s.deadLetterRaw("span", []byte(dead["span"][0]))
	cfg.DeadLetters = true
	r2 := s.start(cfg, nil)
	waitFor(t, "the refused message's orders decided", func() bool {
		return s.depth(s.topo.DeadQueue) == 0 && s.countOrders() == len(decidedA)+len(decidedB)+3
	})
	r2.shutdown(t)
	for _, o := range span {
		var reason string
		servicetest.Must(t, s.db.QueryRow(`SELECT reason FROM orders WHERE order_id = ? AND status = 'failed'`, o.OrderID).Scan(&reason), "failed row")
		if reason != consume.ReasonDeadLettered {
			t.Errorf("order %s: reason %q, want %s", o.OrderID, reason, consume.ReasonDeadLettered)
		}
	}
	s.checkSettled(51, append(decidedA, a[10], a[11]))
	s.checkSettled(52, append(decidedB, b[10]))
}

// crashWriter passes every Write through but the one numbered at, which
// never commits: it waits for the end of its context (the session lost, as
// when the process dies mid-batch) and fails.
type crashWriter struct {
	consume.Writer
	at      int32
	calls   atomic.Int32
	entered chan []store.Order
}

func (w *crashWriter) Write(ctx context.Context, id int64, orders []store.Order) ([]store.Outcome, error) {
	if w.calls.Add(1) == w.at {
		w.entered <- orders
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return w.Writer.Write(ctx, id, orders)
}

// A multi-order message larger than a MySQL batch is written in several
// transactions; the worker dies after the first committed and before the
// second — its broker connection cut, or its shutdown grace over with the
// connection still up (where an early ack of the message would go through):
// the message is not acked, it is redelivered, the committed orders are
// recognised as redeliveries and the rest written, each order once; Redis
// agrees.
func TestConsumeMultiOrderMessageRedeliveredAfterCrashMidBatch(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"connection cut", "grace over"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			s := newStack(t)
			s.sale(53, 100, 1)
			var orders []ordermsg.Order
			for _, u := range users(12) {
				orders = append(orders, s.reserve(53, u, 1))
			}
			s.publishBatch("big", orders...)
			p := newProxy(t, mustHostPort(t, servicetest.AMQPURL()), true)
			cfg := testConfig(s.topo)
			cfg.URLs = []string{strings.Replace(servicetest.AMQPURL(), mustHostPort(t, servicetest.AMQPURL()), p.addr(), 1)}
			cfg.Consumers, cfg.BatchSize = 1, 5 // groups of 5, 5, 2
			cfg.ShutdownGrace = 100 * time.Millisecond
			w := &crashWriter{at: 2, entered: make(chan []store.Order, 1)}
			r := s.start(cfg, func(m *workermetrics.Metrics) consume.Writer {
				w.Writer = store.New(s.db, m, 10*time.Second)
				return w
			})
			<-w.entered
			if got := s.countOrders(); got != 5 {
				t.Fatalf("%d orders committed before the crash, want the first group's 5", got)
			}
			deliveries := 2.0
			if how == "connection cut" {
				p.set(false) // the worker is gone with the message unacked
				p.set(true)
				waitFor(t, "a new session", func() bool { return value(r.m.Reconnects) >= 1 })
			} else {
				r.shutdown(t)
				waitFor(t, "the message back in the queue", func() bool { return s.depth(s.topo.Queue) == 1 })
				deliveries = 1
				r = s.start(testConfig(s.topo), nil)
			}
			waitFor(t, "the redelivered message decided", func() bool {
				return s.countOrders() == len(orders) && s.depth(s.topo.Queue) == 0
			})
			r.shutdown(t)
			if got := value(r.m.Deliveries); got != deliveries {
				t.Errorf("%v deliveries, want %v", got, deliveries)
			}
			if got := value(r.m.Orders.WithLabelValues(workermetrics.OutcomeRedelivered)); got != 5 {
				t.Errorf("%v redeliveries recognised, want the 5 committed before the crash", got)
			}
			for _, o := range orders {
				if st := s.orderStatus(o.OrderID); st != "confirmed" {
					t.Errorf("order %s: %q", o.UserID, st)
				}
			}
			if stock, sold := s.stockSold(53); sold != 12 || stock != 88 {
				t.Errorf("stock %d sold %d, want each order once (sold 12)", stock, sold)
			}
			s.checkSettled(53, orders)
		})
	}
}

// While one batch is being written the next is collected and claimed in
// Redis (the claim's round trip overlaps the commit) — but not when the
// batch in hand carries a drain marker, whose recovery ends only once that
// batch is decided. Either way every order ends written once and settled.
func TestConsumeClaimsTheNextBatchWhileOneCommits(t *testing.T) {
	t.Parallel()
	for _, withMarker := range []bool{false, true} {
		name := "plain"
		if withMarker {
			name = "marker in hand"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newStack(t)
			s.sale(54, 100, 1)
			var orders []ordermsg.Order
			for _, u := range users(30) {
				orders = append(orders, s.reserve(54, u, 1))
			}
			if withMarker {
				s.publishMarker(ordermsg.Marker{ActivityID: 54, Token: "none"})
			}
			s.publishBatch("first", orders[:10]...)
			s.publishBatch("second", orders[10:20]...)
			s.publishBatch("third", orders[20:]...)
			cfg := testConfig(s.topo)
			// Each message fills a batch; the long wait keeps the marker
			// with the first one.
			cfg.Consumers, cfg.BatchSize, cfg.BatchWait = 1, 10, time.Second
			g := &gate{entered: make(chan []store.Order, 1), release: make(chan struct{})}
			r := s.start(cfg, func(m *workermetrics.Metrics) consume.Writer {
				g.w = store.New(s.db, m, 10*time.Second)
				return g
			})
			held := <-g.entered
			if len(held) != 10 || held[0].OrderID != orders[0].OrderID {
				t.Fatalf("first write: %d orders", len(held))
			}
			state := func(o ordermsg.Order) reservation.State {
				rec, _, err := s.res.Order(context.Background(), 54, o.OrderID)
				servicetest.Must(t, err, "record")
				return rec.State
			}
			if withMarker {
				// Give the next batch time to be collected (it is), and
				// to be claimed (it must not be).
				time.Sleep(300 * time.Millisecond)
				for _, o := range orders[10:] {
					if st := state(o); st != reservation.Pending {
						t.Errorf("order %s behind a batch with a marker is %q while that batch is written, want still pending", o.UserID, st)
					}
				}
			} else {
				waitFor(t, "the next batch claimed while the first is written", func() bool {
					for _, o := range orders[10:20] {
						if state(o) != reservation.Claimed {
							return false
						}
					}
					return true
				})
				for _, o := range orders[20:] {
					if st := state(o); st != reservation.Pending {
						t.Errorf("order %s two batches ahead is %q, want pending: one batch is claimed ahead, not more", o.UserID, st)
					}
				}
			}
			close(g.release)
			waitFor(t, "every order written", func() bool { return s.countOrders() == len(orders) && s.depth(s.topo.Queue) == 0 })
			r.shutdown(t)
			for _, o := range orders {
				if st := s.orderStatus(o.OrderID); st != "confirmed" {
					t.Errorf("order %s: %q", o.UserID, st)
				}
			}
			s.checkSettled(54, orders)
		})
	}
}

// The dead-letter publish of one order of a multi-order message fails (the
// dead-letter queue unbound: the mandatory publish is returned). The message
// is not rejected whole — that would send its neighbours to the dead-letter
// exchange — but left unacked: the channel starts over, the redelivery
// dead-letters the poison alone and finds its neighbours in MySQL.
func TestConsumeFailedDeadLetterOfOneOrderRedeliversTheMessage(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(55, 100, 1)
	probe := s.reserve(55, "probe", 1)
	a, b := s.reserve(55, "a", 1), s.reserve(55, "b", 1)
	cfg := testConfig(s.topo)
	cfg.Consumers = 1
	r := s.start(cfg, nil)
	s.publishOrders(probe)
	waitFor(t, "the session up", func() bool { return s.orderStatus(probe.OrderID) == "confirmed" })
	servicetest.Must(t, s.pubCh.QueueUnbind(s.topo.DeadQueue, s.topo.DeadRoutingKey, s.topo.DeadExchange, nil), "unbind")
	poison := `{"v":1,"order_id":"bad"}`
	s.publish("msg", batchBody(t, a, poison, b))
	waitFor(t, "the poison dead-lettered after the redelivery", func() bool {
		return s.depth(s.topo.DeadQueue) == 1 && s.depth(s.topo.Queue) == 0 && s.countOrders() == 3
	})
	r.shutdown(t)
	if got := value(r.m.Reconnects); got < 1 {
		t.Errorf("%v reconnects: the channel did not start over", got)
	}
	if got := value(r.m.Deliveries); got != 3 {
		t.Errorf("%v deliveries, want 3 (the probe, the message, its redelivery)", got)
	}
	if got := value(r.m.Orders.WithLabelValues(workermetrics.OutcomeRedelivered)); got != 2 {
		t.Errorf("%v redeliveries recognised, want the 2 neighbours", got)
	}
	if got := value(r.m.DeadLettered.WithLabelValues(workermetrics.DeadRejected)); got != 0 {
		t.Errorf("%v messages rejected to the dead-letter exchange, want 0", got)
	}
	dead := s.deadLetters(1)
	if d := dead["msg#1"]; d[0] != poison {
		t.Errorf("dead letters %v, want the poison alone as msg#1", dead)
	}
	s.checkSettled(55, []ordermsg.Order{probe, a, b})
}
