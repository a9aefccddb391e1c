package consume_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/worker/internal/consume"
	"github.com/seckill/seckill/worker/internal/store"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

// The end of a sale's recovery after a Redis loss (docs/faults.md, "Redis
// loses the sale"): the drain marker passes every live consumer of every
// partition, and the recovery ends with Redis made exact from MySQL. Each
// test below failed on the code before that (the marker ended the recovery
// in the first channel that took it, once that channel's earlier orders
// were written).

// loseSale deletes every Redis key of activity id, rebuilds it from its
// MySQL row (as a rebuild does) and marks it recovering under token.
func (s *stack) loseSale(id, total, limit int64, token string) {
	s.t.Helper()
	ctx := context.Background()
	lost, err := s.res.SaleKeys(ctx, id)
	servicetest.Must(s.t, err, "sale keys")
	servicetest.Must(s.t, s.rdb.Del(ctx, lost...).Err(), "lose Redis")
	s.sale2(id, total, limit)
	servicetest.Must(s.t, s.res.MarkRecovering(ctx, id, token, time.Hour), "mark recovering")
}

// recovering reports whether the sale still recovers.
func (s *stack) recovering(id int64) bool {
	s.t.Helper()
	tok, err := s.res.Recovery(context.Background(), id)
	servicetest.Must(s.t, err, "recovery")
	return tok != ""
}

// staysRecovering fails the test if the sale's recovery ends within d.
func (s *stack) staysRecovering(id int64, d time.Duration, why string) {
	s.t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !s.recovering(id) {
			s.t.Errorf("the recovery ended while %s", why)
			return
		}
	}
}

// exact fails the test unless Redis counts what MySQL holds, nothing pending.
func (s *stack) exact(id int64) {
	s.t.Helper()
	sale, _, err := s.res.Sale(context.Background(), id)
	servicetest.Must(s.t, err, "read sale")
	_, sold := s.stockSold(id)
	if sale.Sold != sold || sale.Pending != 0 {
		s.t.Errorf("Redis sold %d pending %d, MySQL sold %d", sale.Sold, sale.Pending, sold)
	}
}

// refused fails the test if a new buyer (or a keyed retry) reserves a unit.
func (s *stack) refused(id int64, user, key, why string) {
	s.t.Helper()
	r, err := s.res.Reserve(context.Background(), reservation.Request{ActivityID: id, UserID: user, IdempotencyKey: key,
		Quantity: 1, OrderID: ordermsg.NewOrderID(id), TTL: time.Minute})
	servicetest.Must(s.t, err, "reserve")
	if r.Outcome == reservation.Reserved {
		s.t.Errorf("%s reserved order %s: %s", user, r.OrderID, why)
	}
}

// An order queued before the loss may be in another channel's hands (or
// another worker's, up to its prefetch) when the marker is delivered: two
// channels with prefetch 1, the order first and its write held, so the
// broker hands the marker to the other channel. The marker goes round
// until the holding channel has passed it too; meanwhile a keyed retry of
// the order gets no second order id and nothing is sold.
func TestRecoveryWaitsForTheOrdersOtherChannelsHold(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(43, 1, 1)
	o := s.reserve(43, "queued-before-loss", 1)
	o.IdempotencyKey = "k"
	s.publishOrders(o)
	s.loseSale(43, 1, 1, "tok")
	s.publishMarker(ordermsg.Marker{ActivityID: 43, Token: "tok"})

	cfg := testConfig(s.topo)
	cfg.Consumers, cfg.Prefetch = 2, 1
	gw := &gatedWriter{open: make(chan struct{}), entered: make(chan struct{}, 1)}
	s.start(cfg, func(m *workermetrics.Metrics) consume.Writer {
		gw.Writer = store.New(s.db, m, 10*time.Second)
		return gw
	})
	<-gw.entered
	s.staysRecovering(43, 2*time.Second, "another channel holds the order queued before the marker")
	s.refused(43, o.UserID, "k", "a keyed retry of the order still held by a channel")
	close(gw.open)
	waitFor(t, "the recovery ended", func() bool { return !s.recovering(43) })
	if st := s.orderStatus(o.OrderID); st != "confirmed" {
		t.Errorf("order queued before the loss is %q when the recovery ended", st)
	}
	s.exact(43)
	s.refused(43, "new-buyer", "", "the only unit is the queued order's")
}

// With [rabbitmq] partitions 2 the backend's publisher sends a copy of the
// marker to each partition, and the recovery waits for the consumers of
// both: the order queued before the loss is in partition 1, held, while
// partition 0's consumer passes its copy at once.
func TestRecoveryWaitsForEveryPartition(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, 2)
	s.sale(47, 1, 1)
	o := s.reserve(47, "queued-before-loss", 1)
	o.IdempotencyKey = "k"
	body, err := o.Encode()
	servicetest.Must(t, err, "encode")
	s.publishTo(s.topo.PartitionKey(1), o.OrderID, "", body)
	s.loseSale(47, 1, 1, "tok")

	rc := conf.Default().RabbitMQ
	rc.URL, rc.Prefix, rc.Partitions = servicetest.AMQPURL(), s.amqp, 2
	pub, err := broker.NewPublisher(context.Background(), broker.PublisherConfigFrom(rc, "recovery test"), slog.New(slog.DiscardHandler), nil)
	servicetest.Must(t, err, "publisher")
	t.Cleanup(func() { _ = pub.Close() })
	servicetest.Must(t, pub.PublishMarker(context.Background(), ordermsg.Marker{ActivityID: 47, Token: "tok"}), "publish marker")
	if d0, d1 := s.depth(s.topo.PartitionQueue(0)), s.depth(s.topo.PartitionQueue(1)); d0 != 1 || d1 != 2 {
		t.Fatalf("partition depths %d and %d, want the marker in 0 and the order and the marker in 1", d0, d1)
	}

	cfg := testConfig(s.topo)
	cfg.Consumers = 2 // one channel per partition
	gw := &gatedWriter{open: make(chan struct{}), entered: make(chan struct{}, 1)}
	s.start(cfg, func(m *workermetrics.Metrics) consume.Writer {
		gw.Writer = store.New(s.db, m, 10*time.Second)
		return gw
	})
	<-gw.entered
	waitFor(t, "partition 0's copy taken", func() bool { return s.depth(s.topo.PartitionQueue(0)) == 0 })
	s.staysRecovering(47, 2*time.Second, "partition 1's consumer holds the order queued before the loss")
	s.refused(47, o.UserID, "k", "a keyed retry of the order queued in partition 1")
	close(gw.open)
	waitFor(t, "the recovery ended", func() bool { return !s.recovering(47) })
	if st := s.orderStatus(o.OrderID); st != "confirmed" {
		t.Errorf("order queued before the loss is %q when the recovery ended", st)
	}
	s.exact(47)
}

// A consumer that stops while it holds an order queued before the loss
// gives it back to the queue, where it may be behind a copy of the marker
// that another consumer received already: its leaving the registry starts a
// new round, and only a copy sent after that counts. Worker A holds the
// order (its write held); worker B (prefetch 1) has received the backend's
// copy, its pass held; A stops, the order goes back to the queue; B's pass
// then finds the copy of an earlier round and sends it round again, behind
// the order, which B writes before the recovery ends.
func TestRecoveryAfterAConsumerLeftHoldingAnOrder(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(48, 1, 1)
	o := s.reserve(48, "queued-before-loss", 1)
	o.IdempotencyKey = "k"
	s.publishOrders(o)
	s.loseSale(48, 1, 1, "tok")
	s.publishMarker(ordermsg.Marker{ActivityID: 48, Token: "tok"})

	cfg := testConfig(s.topo)
	cfg.Consumers, cfg.Prefetch, cfg.ShutdownGrace = 1, 1, 100*time.Millisecond
	gw := &gatedWriter{open: make(chan struct{}), entered: make(chan struct{}, 1)}
	a := s.start(cfg, func(m *workermetrics.Metrics) consume.Writer {
		gw.Writer = store.New(s.db, m, 10*time.Second)
		return gw
	})
	<-gw.entered
	// The registry old enough that its entries count (half the TTL and two
	// refreshes), so that only the round keeps B's pass from ending it.
	time.Sleep(cfg.RegistryTTL/2 + 3*cfg.RegistryRefresh)
	gp := &gatedPass{Reservations: s.res, open: make(chan struct{}), entered: make(chan struct{}, 1)}
	s.startWith(cfg, gp, nil)
	<-gp.entered  // B holds the copy the broker delivered before A left
	a.shutdown(t) // its write abandoned: the order goes back to the queue
	close(gp.open)
	waitFor(t, "the recovery ended", func() bool { return !s.recovering(48) })
	if st := s.orderStatus(o.OrderID); st != "confirmed" {
		t.Errorf("order given back by the worker that left is %q when the recovery ended", st)
	}
	s.exact(48)
	s.refused(48, "new-buyer", "", "the only unit is the queued order's")
}

// gatedPass holds every PassMarker until open is closed.
type gatedPass struct {
	consume.Reservations
	open    chan struct{}
	entered chan struct{}
}

func (g *gatedPass) PassMarker(ctx context.Context, p reservation.MarkerPass) (reservation.PassResult, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
	case <-ctx.Done():
		return reservation.PassResult{}, ctx.Err()
	}
	return g.Reservations.PassMarker(ctx, p)
}

// gatedSettle holds every Settle until open is closed.
type gatedSettle struct {
	consume.Reservations
	open chan struct{}
}

func (g *gatedSettle) Settle(ctx context.Context, activityID int64, orders []reservation.Settlement) (int64, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return g.Reservations.Settle(ctx, activityID, orders)
}

// The settles of the orders queued before the loss run after their ack,
// behind up to settleBacklog batches, and the order's record is Redis's to
// write there: a recovery that ended on the marker alone would leave the
// confirmed order uncounted, and sell its unit again. Ending it with the
// counters synced from MySQL under the activity's row lock counts it
// whether or not its settle landed, and the settle that lands later finds
// the record written and moves no counter.
func TestRecoveryEndCountsOrdersNotSettledYet(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(45, 1, 1)
	o := s.reserve(45, "queued-before-loss", 1)
	o.IdempotencyKey = "k"
	s.publishOrders(o)
	s.loseSale(45, 1, 1, "tok")
	s.publishMarker(ordermsg.Marker{ActivityID: 45, Token: "tok"})

	cfg := testConfig(s.topo)
	cfg.Consumers = 1
	gs := &gatedSettle{Reservations: s.res, open: make(chan struct{})}
	m := workermetrics.New(prometheus.NewRegistry())
	c := consume.New(cfg, gs, store.New(s.db, m, 10*time.Second), s.endRecovery, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	t.Cleanup(func() {
		select {
		case <-gs.open:
		default:
			close(gs.open)
		}
		stop()
		<-done
	})
	waitFor(t, "the recovery ended", func() bool { return !s.recovering(45) })
	if st := s.orderStatus(o.OrderID); st != "confirmed" {
		t.Fatalf("order queued before the loss is %q when the recovery ended", st)
	}
	s.exact(45)
	s.refused(45, "new-buyer", "", "MySQL confirmed the only unit to the queued order")
	close(gs.open)
	waitFor(t, "the queued order settled in Redis", func() bool {
		rec, found, err := s.res.Order(context.Background(), 45, o.OrderID)
		return err == nil && found && rec.State.Public() == "confirmed"
	})
	s.exact(45) // the late settle counted nothing twice
}

// A rebuild reads the sale's row (sold) first and warms Redis with it after
// salesdb.Restore; an order queued before the loss that a worker commits in
// between is missed by that sold (its settle finds no meta, or Restore's K
// record makes it skip the counters). The end of the recovery syncs the
// counters from MySQL: Redis counts it. The rebuild's steps are run here in
// the order Service.rebuild runs them, the worker's commit forced between.
func TestRecoveryEndCountsOrdersCommittedDuringTheRebuild(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	s.sale(46, 1, 1)
	o := s.reserve(46, "queued-before-loss", 1)
	s.publishOrders(o)
	lost, err := s.res.SaleKeys(ctx, 46)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, s.rdb.Del(ctx, lost...).Err(), "lose Redis")

	// rebuild, step 1: loadActivity reads the row.
	var sold int64
	var start, end time.Time
	servicetest.Must(t, s.db.QueryRow(`SELECT sold, starts_at, ends_at FROM activities WHERE id = ?`, 46).Scan(&sold, &start, &end), "row")

	// Meanwhile a worker writes and settles the order queued before the loss.
	cfg := testConfig(s.topo)
	cfg.Consumers = 1
	s.start(cfg, nil)
	waitFor(t, "the queued order settled", func() bool {
		rec, found, err := s.res.Order(ctx, 46, o.OrderID)
		return err == nil && found && rec.State.Public() == "confirmed"
	})

	// rebuild, step 2: Restore (marks recovering, MySQL's decided orders
	// back), then the create-only warm with the row of step 1.
	token, err := salesdb.Restore(ctx, s.db, s.res, 46, 1, time.Hour)
	servicetest.Must(t, err, "restore")
	out, _, err := s.res.Warm(ctx, 46, reservation.WarmArgs{Total: 1, Limit: 1, Start: start, End: end, Sold: sold,
		Users: map[string]int64{}, CreateOnly: true})
	servicetest.Must(t, err, "warm")
	if out != reservation.WarmCreated {
		t.Fatalf("warm: %s", out)
	}
	s.publishMarker(ordermsg.Marker{ActivityID: 46, Token: token})
	waitFor(t, "the recovery ended", func() bool { return !s.recovering(46) })
	s.exact(46)
	s.refused(46, "new-buyer", "", "MySQL sold the only unit")
}

// publishTo publishes one message with routing key key, confirmed.
func (s *stack) publishTo(key, msgID, typ string, body []byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := s.pubCh.PublishWithDeferredConfirmWithContext(ctx, s.topo.Exchange, key, true, false,
		amqp.Publishing{ContentType: ordermsg.ContentType, DeliveryMode: amqp.Persistent, MessageId: msgID, Type: typ, Body: body})
	servicetest.Must(s.t, err, "publish")
	if ok, err := c.WaitContext(ctx); err != nil || !ok {
		s.t.Fatalf("publish not confirmed: %v", err)
	}
}

// failingRegistry fails every RegisterConsumers while failing is set.
type failingRegistry struct {
	consume.Reservations
	failing atomic.Bool
}

func (f *failingRegistry) RegisterConsumers(ctx context.Context, ttl time.Duration, cs []reservation.Consumer) ([]string, error) {
	if f.failing.Load() {
		return nil, errors.New("registry unreachable (test)")
	}
	return f.Reservations.RegisterConsumers(ctx, ttl, cs)
}

// A consumer that cannot refresh its registry entry ends its AMQP session
// well before the entry expires, so that what it holds is back in the queue
// before the others may take it as gone (and start a round without it):
// its write held, it gives the order back once the refreshes fail for half
// the entry's TTL, and writes it once the registry is back.
func TestConsumerGivesBackWhatItHoldsWhenItsEntryLapses(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(49, 1, 1)
	o := s.reserve(49, "held", 1)
	s.publishOrders(o)
	cfg := testConfig(s.topo)
	cfg.Consumers = 1
	gw := &gatedWriter{open: make(chan struct{}), entered: make(chan struct{}, 1)}
	fr := &failingRegistry{Reservations: s.res}
	s.startWith(cfg, fr, func(m *workermetrics.Metrics) consume.Writer {
		gw.Writer = store.New(s.db, m, 10*time.Second)
		return gw
	})
	<-gw.entered
	fr.failing.Store(true)
	waitFor(t, "the held order back in the queue", func() bool { return s.depth(s.topo.Queue) == 1 })
	fr.failing.Store(false)
	close(gw.open)
	waitFor(t, "the order written", func() bool { return s.orderStatus(o.OrderID) == "confirmed" })
}

// Redis loses the consumer registry (it goes with the sale) while worker X
// holds an order queued before the loss and cannot reach Redis: worker Y's
// refresh writes a registry without X. The registry counts only once it is
// old enough that X, unable to refresh, has ended its session and given the
// order back: Y writes it before the recovery ends.
func TestRecoveryWaitsForARegistryLostWithRedis(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.sale(50, 1, 1)
	o := s.reserve(50, "queued-before-loss", 1)
	o.IdempotencyKey = "k"
	s.publishOrders(o)
	s.loseSale(50, 1, 1, "tok")
	s.publishMarker(ordermsg.Marker{ActivityID: 50, Token: "tok"})

	cfg := testConfig(s.topo)
	cfg.Consumers, cfg.Prefetch = 1, 1
	gw := &gatedWriter{open: make(chan struct{}), entered: make(chan struct{}, 1)}
	x := &failingRegistry{Reservations: s.res}
	s.startWith(cfg, x, func(m *workermetrics.Metrics) consume.Writer {
		gw.Writer = store.New(s.db, m, 10*time.Second)
		return gw
	})
	<-gw.entered
	x.failing.Store(true)
	servicetest.Must(t, s.rdb.Del(context.Background(), s.res.RegistryKey(s.topo.Queue)).Err(), "lose the registry")
	s.start(cfg, nil) // Y
	waitFor(t, "the recovery ended", func() bool { return !s.recovering(50) })
	if st := s.orderStatus(o.OrderID); st != "confirmed" {
		t.Errorf("order held by the worker missing from the registry is %q when the recovery ended", st)
	}
	s.exact(50)
	close(gw.open)
}
