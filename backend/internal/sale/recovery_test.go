package sale_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
	"github.com/seckill/seckill/internal/servicetest"
)

// The recovery after a Redis loss lasts until the queue has delivered what
// was queued before the loss, not for a timer: with the workers away far
// longer than reservation_ttl (the old window, reservation_ttl +
// republish_after, is 200 ms here), a keyed retry of the order still in the
// queue gets 503 — never a second order id — and nothing new is reserved,
// since Redis does not count that order's unit. The rebuild's drain marker
// is behind the order in the queue; the worker that takes it (here: the
// test, as worker/internal/consume does) writes the order first, binds its
// key back, then ends the recovery: the retry gets the order, sales go on.
func TestRecoveryLastsUntilTheQueueDrained(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, func(c *sale.Config) { c.ReservationTTL = 200 * time.Millisecond })
	ctx := context.Background()
	queued, err := r.purchase("lossy", "k")
	if err != nil || queued.Outcome != sale.Accepted {
		t.Fatalf("first purchase: %+v %v", queued, err)
	}
	keys, err := r.direct.SaleKeys(ctx, act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(ctx, keys...).Err(), "lose the sale")

	res, err := r.purchase("other", "") // rebuilds the sale, marks it recovering, sends the marker
	mustUnavailable(t, res, err)
	time.Sleep(10 * 200 * time.Millisecond) // the workers stay away, ten times the old window
	res, err = r.purchase("lossy", "k")
	mustUnavailable(t, res, err)
	res, err = r.purchase("fresh", "")
	mustUnavailable(t, res, err)
	if s := r.sale(t); s.Pending != 0 || s.Sold != 0 {
		t.Fatalf("recovering sale %+v: something was reserved", s)
	}

	// The queue holds the order, then the marker of this recovery (sent
	// PublishTimeout after the rebuild).
	token, err := r.direct.Recovery(ctx, act)
	if err != nil || token == "" {
		t.Fatalf("recovery token %q %v", token, err)
	}
	ac, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	t.Cleanup(func() { _ = ac.Close() })
	conn, err := ac.Channel()
	servicetest.Must(t, err, "channel")
	first, ok, err := conn.Get(r.topo.Queue, false)
	servicetest.Must(t, err, "get")
	if !ok || first.Type != "" || first.MessageId != queued.OrderID {
		t.Fatalf("first message %q type %q, want the queued order %s", first.MessageId, first.Type, queued.OrderID)
	}
	var second amqp.Delivery
	eventually(t, "the drain marker", func() bool {
		second, ok, err = conn.Get(r.topo.Queue, false)
		servicetest.Must(t, err, "get")
		return ok
	})
	if second.Type != ordermsg.MarkerType {
		t.Fatalf("second message %q type %q, want the drain marker", second.MessageId, second.Type)
	}
	m, err := ordermsg.DecodeMarker(second.Body)
	if err != nil || m.ActivityID != act || m.Token != token {
		t.Fatalf("marker %+v %v, want activity %d token %s", m, err, act, token)
	}

	// The worker's part, in its order: the order, its key, then (the marker
	// passed every consumer) the end of the recovery.
	o, err := ordermsg.Decode(first.Body)
	servicetest.Must(t, err, "decode order")
	_, err = r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status, idempotency_key) VALUES (?, ?, ?, 1, 'confirmed', 'k')`, o.OrderID, act, o.UserID)
	servicetest.Must(t, err, "write the order")
	_, err = r.db.Exec(`UPDATE activities SET stock = stock - 1, sold = sold + 1 WHERE id = ?`, act)
	servicetest.Must(t, err, "sell")
	n, err := r.direct.Settle(ctx, act, []reservation.Settlement{{OrderID: o.OrderID, Confirmed: true, Quantity: 1, UserID: o.UserID}})
	if err != nil || n != 1 {
		t.Fatalf("settle: %d %v", n, err)
	}
	servicetest.Must(t, r.direct.RestoreKeys(ctx, act, []reservation.Decided{{OrderID: o.OrderID, UserID: o.UserID, IdempotencyKey: "k", Quantity: 1}}), "restore key")
	if ended, err := salesdb.EndRecovery(ctx, r.db, r.direct, act, m.Token); err != nil || !ended {
		t.Fatalf("end recovery: %v %v", ended, err)
	}

	res, err = r.purchase("lossy", "k")
	if err != nil || !res.Replay || res.OrderID != queued.OrderID {
		t.Errorf("keyed retry after the drain: %+v %v, want order %s", res, err, queued.OrderID)
	}
	res, err = r.purchase("fresh", "")
	if err != nil || res.Outcome != sale.Accepted {
		t.Errorf("unkeyed purchase after the drain: %+v %v", res, err)
	}
	if s := r.sale(t); s.Sold != 1 || s.Pending != 1 {
		t.Errorf("sale after the drain %+v, want sold 1 (the queued order) and pending 1", s)
	}
}

// An admin change that finds the sale lost by Redis builds it like a
// rebuild does: recovering, with its drain marker sent. A retry of the key
// of an order still in the queue gets 503, never a second order id, and
// nothing new is reserved until the marker passes.
func TestAdminChangeAfterRedisLossRecovers(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	queued, err := r.purchase("lossy", "k")
	if err != nil || queued.Outcome != sale.Accepted {
		t.Fatalf("first purchase: %+v %v", queued, err)
	}
	keys, err := r.direct.SaleKeys(ctx, act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(ctx, keys...).Err(), "lose the sale")
	_, _, err = r.svc.PutActivity(ctx, act, sale.Spec{Stock: 20, PerUserLimit: 2,
		StartsAt: time.Now().Add(-time.Hour), EndsAt: time.Now().Add(time.Hour)})
	servicetest.Must(t, err, "raise the stock")
	res, err := r.purchase("lossy", "k")
	mustUnavailable(t, res, err)
	res, err = r.purchase("fresh", "")
	mustUnavailable(t, res, err)
	token, err := r.direct.Recovery(ctx, act)
	if err != nil || token == "" {
		t.Fatalf("recovery token %q %v after the admin change rebuilt the lost sale", token, err)
	}
	if s := r.sale(t); s.Total != 20 || s.Pending != 0 {
		t.Errorf("rebuilt sale %+v", s)
	}
}

// The first drain marker of a recovery waits PublishTimeout after the
// rebuild: a purchase whose reservation Redis lost may still be publishing
// its order, and a publish confirmed at all is confirmed within
// PublishTimeout (else its backend refuses it in MySQL). Its message is
// then ahead of the marker, so the consumers decide it before the recovery
// can end; a marker sent at once could be ahead of it, and the recovery end
// without counting its unit.
func TestDrainMarkerWaitsForPublishesInFlight(t *testing.T) {
	t.Parallel()
	const publishTimeout = 1500 * time.Millisecond
	r := newRigWith(t, func(c *sale.Config) { c.PublishTimeout = publishTimeout })
	ctx := context.Background()
	// A purchase reserves; its publish is slow and still on its way when
	// Redis loses the sale.
	slow := make(chan ordermsg.Order, 1)
	release := make(chan struct{})
	hold := func(ctx context.Context, o ordermsg.Order) error {
		slow <- o
		<-release
		return r.real.Publish(ctx, o)
	}
	r.publish.Store(&hold)
	answered := make(chan error, 1)
	go func() {
		_, err := r.purchase("slow", "k")
		answered <- err
	}()
	o := <-slow
	r.publish.Store(nil)
	keys, err := r.direct.SaleKeys(ctx, act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(ctx, keys...).Err(), "lose the sale")
	res, err := r.purchase("other", "") // rebuilds the sale, sends the marker
	mustUnavailable(t, res, err)
	rebuilt := time.Now()
	time.Sleep(publishTimeout / 2)
	close(release) // confirmed within its PublishTimeout
	if err := <-answered; err != nil {
		t.Fatalf("the slow purchase: %v", err)
	}
	var ids []string
	eventually(t, "the order and the marker queued", func() bool {
		ids = append(ids, r.queued(t)...)
		return len(ids) >= 2
	})
	if ids[0] != o.OrderID || !strings.HasPrefix(ids[1], "drain-") {
		t.Fatalf("queue %v, want the slow order %s ahead of the drain marker", ids, o.OrderID)
	}
	if d := time.Since(rebuilt); d < publishTimeout-100*time.Millisecond {
		t.Errorf("marker queued %v after the rebuild, want no sooner than PublishTimeout %v", d, publishTimeout)
	}
}

// A purchase whose publish is confirmed only after the sale's recovery
// ended (its backend stalled between the reserve and the publish for
// longer than the marker waits) finds its record lost with Redis: the
// record goes back counted, with its key, so that Redis does not sell its
// unit again and a retry of the key replays it.
func TestOrderConfirmedAfterTheRecoveryEndedIsCounted(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, func(c *sale.Config) { c.PublishTimeout = 300 * time.Millisecond })
	ctx := context.Background()
	slow := make(chan ordermsg.Order, 1)
	release := make(chan struct{})
	stall := func(_ context.Context, o ordermsg.Order) error {
		slow <- o
		<-release
		return r.real.Publish(context.Background(), o) // the stall is not the publish's: confirmed
	}
	r.publish.Store(&stall)
	answered := make(chan sale.PurchaseResult, 1)
	go func() {
		res, err := r.purchase("slow", "k")
		servicetest.Must(t, err, "the slow purchase")
		answered <- res
	}()
	o := <-slow
	r.publish.Store(nil)
	keys, err := r.direct.SaleKeys(ctx, act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(ctx, keys...).Err(), "lose the sale")
	res, err := r.purchase("other", "") // rebuilds the sale, sends the marker
	mustUnavailable(t, res, err)
	token, err := r.direct.Recovery(ctx, act)
	servicetest.Must(t, err, "recovery")
	eventually(t, "the drain marker queued", func() bool { return len(r.queued(t)) > 0 })
	// The marker passed every consumer (no order was ahead of it).
	if ended, err := salesdb.EndRecovery(ctx, r.db, r.direct, act, token); err != nil || !ended {
		t.Fatalf("end recovery: %v %v", ended, err)
	}
	close(release)
	if got := <-answered; got.Outcome != sale.Accepted || got.OrderID != o.OrderID {
		t.Fatalf("the slow purchase: %+v, want 202 for %s", got, o.OrderID)
	}
	if s := r.sale(t); s.Pending != 1 || s.Sold != 0 {
		t.Errorf("sale %+v after the late confirm, want the queued order pending (1)", s)
	}
	retry, err := r.purchase("slow", "k")
	if err != nil || !retry.Replay || retry.OrderID != o.OrderID {
		t.Errorf("keyed retry: %+v %v, want a replay of %s", retry, err, o.OrderID)
	}
}
