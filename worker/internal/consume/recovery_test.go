package consume_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/worker/internal/consume"
	"github.com/seckill/seckill/worker/internal/store"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

// gatedWriter holds every MySQL write until open is closed.
type gatedWriter struct {
	consume.Writer
	open    chan struct{}
	entered chan struct{}
}

func (w *gatedWriter) Write(ctx context.Context, activityID int64, orders []store.Order) ([]store.Outcome, error) {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	select {
	case <-w.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return w.Writer.Write(ctx, activityID, orders)
}

// The drain marker a backend publishes after rebuilding a sale Redis lost
// ends the sale's recovery only once the orders queued before it are
// decided in MySQL and their keys are back in Redis; a marker of an earlier
// recovery ends nothing. The MySQL write is held so that the marker is in
// the consumer's hands while the order before it is not yet decided.
func TestConsumeDrainMarkerEndsRecoveryAfterTheOrdersBeforeIt(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	rdb, prefix := servicetest.Redis(t)
	s.res = reservation.New(rdb, prefix)
	ctx := context.Background()
	s.sale(42, 10, 1)
	o := s.reserve(42, "queued-before-loss", 1)
	o.IdempotencyKey = "k"
	s.publishOrders(o)
	// Redis loses the sale; a backend rebuilds it and marks it recovering.
	keys, err := s.res.SaleKeys(ctx, 42)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, rdb.Del(ctx, keys...).Err(), "lose Redis")
	s.sale2(42, 10, 1)
	servicetest.Must(t, s.res.MarkRecovering(ctx, 42, "new", time.Hour), "mark recovering")
	s.publishMarker(ordermsg.Marker{ActivityID: 42, Token: "old"}) // a marker of an earlier recovery
	s.publishMarker(ordermsg.Marker{ActivityID: 42, Token: "new"})

	cfg := testConfig(s.topo)
	cfg.Consumers = 1
	gw := &gatedWriter{open: make(chan struct{}), entered: make(chan struct{}, 1)}
	s.start(cfg, func(m *workermetrics.Metrics) consume.Writer {
		gw.Writer = store.New(s.db, m, 10*time.Second)
		return gw
	})
	<-gw.entered
	waitFor(t, "every message delivered", func() bool { return s.depth(s.topo.Queue) == 0 })
	if tok, err := s.res.Recovery(ctx, 42); err != nil || tok != "new" {
		t.Fatalf("recovery %q (%v) while the order queued before the marker is undecided, want still \"new\"", tok, err)
	}
	close(gw.open)
	waitFor(t, "the recovery ended", func() bool {
		tok, err := s.res.Recovery(ctx, 42)
		return err == nil && tok == ""
	})
	if st := s.orderStatus(o.OrderID); st != "confirmed" {
		t.Errorf("order queued before the loss is %q when the recovery ended, want confirmed", st)
	}
	res, err := s.res.Reserve(ctx, reservation.Request{ActivityID: 42, UserID: o.UserID, IdempotencyKey: "k",
		Quantity: 1, OrderID: ordermsg.NewOrderID(42), TTL: time.Minute})
	servicetest.Must(t, err, "keyed retry")
	if res.Outcome != reservation.Replay || res.OrderID != o.OrderID {
		t.Errorf("keyed retry after the recovery: %s %s, want a replay of %s", res.Outcome, res.OrderID, o.OrderID)
	}

	// A marker of a recovery that is not the current one changes nothing.
	after := s.reserve(42, "after", 1)
	servicetest.Must(t, s.res.MarkRecovering(ctx, 42, "newer", time.Hour), "mark recovering again")
	s.publishMarker(ordermsg.Marker{ActivityID: 42, Token: "new"})
	s.publishOrders(after)
	waitFor(t, "the order after the stale marker", func() bool { return s.orderStatus(after.OrderID) == "confirmed" })
	if tok, _ := s.res.Recovery(ctx, 42); tok != "newer" {
		t.Errorf("a stale marker ended the recovery: %q", tok)
	}
}

// publishMarker publishes a drain marker as broker.Publisher.PublishMarker does.
func (s *stack) publishMarker(m ordermsg.Marker) {
	s.t.Helper()
	b, err := m.Encode()
	servicetest.Must(s.t, err, "encode marker")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := s.pubCh.PublishWithDeferredConfirmWithContext(ctx, s.topo.Exchange, s.topo.RoutingKey, true, false,
		amqp.Publishing{ContentType: ordermsg.ContentType, DeliveryMode: amqp.Persistent, MessageId: m.MessageID(),
			Type: ordermsg.MarkerType, Body: b})
	servicetest.Must(s.t, err, "publish marker")
	if ok, err := c.WaitContext(ctx); err != nil || !ok {
		s.t.Fatalf("marker not confirmed: %v", err)
	}
}

// sale2 rebuilds a sale Redis lost, from its MySQL row.
func (s *stack) sale2(id, total, limit int64) {
	s.t.Helper()
	var sold int64
	var start, end time.Time
	servicetest.Must(s.t, s.db.QueryRow(`SELECT sold, starts_at, ends_at FROM activities WHERE id = ?`, id).Scan(&sold, &start, &end), "row")
	out, _, err := s.res.Warm(context.Background(), id, reservation.WarmArgs{Total: total, Limit: limit, Start: start, End: end,
		Sold: sold, Users: map[string]int64{}, CreateOnly: true})
	servicetest.Must(s.t, err, "rebuild")
	if out != reservation.WarmCreated {
		s.t.Fatalf("rebuild: %s", out)
	}
}
