package consume_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/worker/internal/consume"
)

// Orders in the dead-letter queue are decided instead of holding their
// units until queued_expire_after: one MySQL never saw is stored failed
// (dead_lettered) and its unit released in Redis; one a worker committed
// before its message was dead-lettered keeps its row (MySQL arbitrates) and
// Redis follows it; a second copy of a message changes nothing (the
// consumer is idempotent on the order id, which is how a copy left by a
// dead-letter publish whose original's ack was lost is harmless); a message
// that is no order is dropped. The queue ends empty.
func TestConsumeDeadLetteredOrdersAreDecided(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	s.sale(43, 10, 2)
	lost := s.reserve(43, "never-written", 1)
	_, err := s.res.MarkQueued(ctx, 43, lost.OrderID)
	servicetest.Must(t, err, "mark queued")
	kept := s.reserve(43, "written-first", 1)
	// A worker committed kept before its message was dead-lettered.
	_, err = s.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?, 43, ?, 1, 'confirmed')`, kept.OrderID, kept.UserID)
	servicetest.Must(t, err, "row")
	_, err = s.db.Exec(`UPDATE activities SET stock = stock - 1, sold = sold + 1 WHERE id = 43`)
	servicetest.Must(t, err, "sell")
	_, err = s.db.Exec(`INSERT INTO purchases (activity_id, user_id, quantity) VALUES (43, ?, 1)`, kept.UserID)
	servicetest.Must(t, err, "purchases")

	s.deadLetter(lost.OrderID, lost)
	s.deadLetter(lost.OrderID, lost) // a second copy
	s.deadLetter(kept.OrderID, kept)
	s.deadLetterRaw("poison", []byte("{not json"))

	cfg := testConfig(s.topo)
	cfg.DeadLetters = true
	r := s.start(cfg, nil)
	waitFor(t, "the dead-letter queue consumed", func() bool {
		rec, _, _ := s.res.Order(ctx, 43, kept.OrderID)
		return s.depth(s.topo.DeadQueue) == 0 && s.orderStatus(lost.OrderID) == "failed" && rec.State == reservation.Confirmed
	})
	r.shutdown(t)
	var reason string
	servicetest.Must(t, s.db.QueryRow(`SELECT reason FROM orders WHERE order_id = ?`, lost.OrderID).Scan(&reason), "reason")
	if reason != consume.ReasonDeadLettered {
		t.Errorf("dead-lettered order failed with %q, want %q", reason, consume.ReasonDeadLettered)
	}
	if st := s.orderStatus(kept.OrderID); st != "confirmed" {
		t.Errorf("order committed before its dead-lettering is %q, want confirmed (MySQL's row stands)", st)
	}
	rec, _, err := s.res.Order(ctx, 43, lost.OrderID)
	servicetest.Must(t, err, "record")
	if rec.State != reservation.Failed || rec.Reason != consume.ReasonDeadLettered {
		t.Errorf("Redis record of the dead-lettered order %+v, want F dead_lettered", rec)
	}
	sale, _, err := s.res.Sale(ctx, 43)
	servicetest.Must(t, err, "sale")
	if sale.Pending != 0 || sale.Sold != 1 || sale.Available() != 9 {
		t.Errorf("Redis sale %+v: want the dead-lettered unit released (available 9), sold 1", sale)
	}
	if got := value(r.m.Orders.WithLabelValues(consume.ReasonDeadLettered)); got != 1 {
		t.Errorf("%v orders failed dead_lettered, want 1 (the copy changes nothing)", got)
	}
	if n := s.countOrders(); n != 2 {
		t.Errorf("%d order rows, want 2", n)
	}
}

// deadLetter publishes o to the dead-letter exchange, as the broker's
// delivery limit does.
func (s *stack) deadLetter(id string, o ordermsg.Order) {
	s.t.Helper()
	b, err := o.Encode()
	servicetest.Must(s.t, err, "encode")
	s.deadLetterRaw(id, b)
}

func (s *stack) deadLetterRaw(id string, body []byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := s.pubCh.PublishWithDeferredConfirmWithContext(ctx, s.topo.DeadExchange, s.topo.DeadRoutingKey, true, false,
		amqp.Publishing{ContentType: ordermsg.ContentType, DeliveryMode: amqp.Persistent, MessageId: id, Body: body,
			Headers: amqp.Table{broker.DeadReasonHeader: "delivery limit"}})
	servicetest.Must(s.t, err, "publish dead letter")
	if ok, err := c.WaitContext(ctx); err != nil || !ok {
		s.t.Fatalf("dead letter not confirmed: %v", err)
	}
}

// A multi-order message in the dead-letter queue (the broker's delivery
// limit took it whole) is decided order by order: the order a worker had
// committed keeps its row and Redis follows it, the others are stored failed
// (dead_lettered) and their units released, an invalid element is dropped.
func TestConsumeDeadLetteredBatchIsDecidedPerOrder(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	s.sale(44, 10, 1)
	kept, lost1, lost2 := s.reserve(44, "kept", 1), s.reserve(44, "lost1", 1), s.reserve(44, "lost2", 1)
	for _, o := range []ordermsg.Order{kept, lost1, lost2} {
		_, err := s.res.MarkQueued(ctx, 44, o.OrderID)
		servicetest.Must(t, err, "mark queued")
	}
	_, err := s.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?, 44, ?, 1, 'confirmed')`, kept.OrderID, kept.UserID)
	servicetest.Must(t, err, "row")
	_, err = s.db.Exec(`UPDATE activities SET stock = stock - 1, sold = sold + 1 WHERE id = 44`)
	servicetest.Must(t, err, "sell")
	_, err = s.db.Exec(`INSERT INTO purchases (activity_id, user_id, quantity) VALUES (44, ?, 1)`, kept.UserID)
	servicetest.Must(t, err, "purchases")
	s.deadLetterRaw("batch", batchBody(t, lost1, kept, `{"v":1,"order_id":"junk"}`, lost2))

	cfg := testConfig(s.topo)
	cfg.DeadLetters = true
	r := s.start(cfg, nil)
	waitFor(t, "the dead-lettered batch decided", func() bool {
		return s.depth(s.topo.DeadQueue) == 0 && s.countOrders() == 3
	})
	r.shutdown(t)
	for _, o := range []ordermsg.Order{lost1, lost2} {
		var reason string
		servicetest.Must(t, s.db.QueryRow(`SELECT reason FROM orders WHERE order_id = ? AND status = 'failed'`, o.OrderID).Scan(&reason), "failed row")
		if reason != consume.ReasonDeadLettered {
			t.Errorf("order %s: reason %q, want %s", o.UserID, reason, consume.ReasonDeadLettered)
		}
	}
	if st := s.orderStatus(kept.OrderID); st != "confirmed" {
		t.Errorf("committed order of the batch is %q, want confirmed (MySQL's row stands)", st)
	}
	s.checkSettled(44, []ordermsg.Order{kept, lost1, lost2})
	sale, _, err := s.res.Sale(ctx, 44)
	servicetest.Must(t, err, "sale")
	if sale.Sold != 1 || sale.Available() != 9 {
		t.Errorf("Redis sale %+v: want sold 1, the two dead-lettered units released (available 9)", sale)
	}
}
