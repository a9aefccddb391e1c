package consume_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/worker/internal/consume"
	"github.com/seckill/seckill/worker/internal/store"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

// Known gaps of issue 9's recovery after a Redis loss, found by an
// adversarial review and not fixed yet (docs/faults.md, "Left open"). Each
// test below fails on the current code; they run only with
// SECKILL_KNOWN_GAPS=1, so that `make test` stays a gate while the fix is
// built. The fix removes this gate.
func knownGap(t *testing.T) {
	t.Helper()
	if os.Getenv("SECKILL_KNOWN_GAPS") != "1" {
		t.Skip("known gap of the recovery after a Redis loss (docs/faults.md); SECKILL_KNOWN_GAPS=1 runs it")
	}
}

// Review finding (issue 9): the drain marker ends the recovery once the
// orders before it *in the marker's own channel* are written, but a worker
// runs several channels (testConfig: 2; production runs several worker
// processes with prefetch 400 each), and an order queued before the marker
// may be in another channel's hands, not yet written. That is not only the
// "goes back to the queue" case docs/faults.md leaves open: an order merely
// being written by another consumer when the marker passes is enough. The
// recovery then ends while the queued order is neither in MySQL nor in
// Redis: a keyed retry of it reserves a second order id, selling again the
// unit the queued order holds (Redis admits more than MySQL will hold:
// total 1, sold 1 + pending 1 once the queued order is written).
//
// Forced deterministically: two channels with prefetch 1; the order comes
// first and its write is held, so the broker must hand the marker to the
// other channel.
func TestReviewMarkerOnAnotherChannelEndsRecoveryEarly(t *testing.T) {
	knownGap(t)
	t.Parallel()
	s := newStack(t)
	rdb, prefix := servicetest.Redis(t)
	s.res = reservation.New(rdb, prefix)
	ctx := context.Background()
	s.sale(43, 1, 1)
	o := s.reserve(43, "queued-before-loss", 1)
	o.IdempotencyKey = "k"
	s.publishOrders(o)
	lost, err := s.res.SaleKeys(ctx, 43)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, rdb.Del(ctx, lost...).Err(), "lose Redis")
	s.sale2(43, 1, 1)
	servicetest.Must(t, s.res.MarkRecovering(ctx, 43, "tok", time.Hour), "mark recovering")
	s.publishMarker(ordermsg.Marker{ActivityID: 43, Token: "tok"})

	cfg := testConfig(s.topo)
	cfg.Consumers, cfg.Prefetch = 2, 1
	gw := &gatedWriter{open: make(chan struct{}), entered: make(chan struct{}, 1)}
	s.start(cfg, func(m *workermetrics.Metrics) consume.Writer {
		gw.Writer = store.New(s.db, m, 10*time.Second)
		return gw
	})
	<-gw.entered
	waitFor(t, "the marker delivered", func() bool { return s.depth(s.topo.Queue) == 0 })
	// Give the marker's channel time to act on it; a correct consumer keeps
	// the recovery on for as long as the order before the marker is held.
	ended := false
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if tok, err := s.res.Recovery(ctx, 43); err == nil && tok == "" {
			ended = true
			break
		}
	}
	if ended {
		t.Errorf("the recovery ended while the order queued before its marker (%s) is not written (MySQL %q)",
			o.OrderID, s.orderStatus(o.OrderID))
	}
	retry, err := s.res.Reserve(ctx, reservation.Request{ActivityID: 43, UserID: o.UserID, IdempotencyKey: "k",
		Quantity: 1, OrderID: ordermsg.NewOrderID(43), TTL: time.Minute})
	servicetest.Must(t, err, "keyed retry")
	if retry.Outcome == reservation.Reserved {
		t.Errorf("keyed retry of queued order %s reserved a second order %s", o.OrderID, retry.OrderID)
	}
	close(gw.open)
	waitFor(t, "the queued order written", func() bool { return s.orderStatus(o.OrderID) == "confirmed" })
	waitFor(t, "the queued order settled in Redis", func() bool {
		rec, found, err := s.res.Order(ctx, 43, o.OrderID)
		return err == nil && found && rec.State.Public() == "confirmed"
	})
	sale, _, err := s.res.Sale(ctx, 43)
	servicetest.Must(t, err, "read sale")
	if sale.Sold+sale.Pending > sale.Total {
		t.Errorf("Redis admits sold %d + pending %d of total %d after the rebuild", sale.Sold, sale.Pending, sale.Total)
	}
}

// Review finding (issue 9): an order whose publish the broker confirms only
// after the Redis loss can be queued behind the rebuild's drain marker
// (backend B1's publish was slow, B2 rebuilt the sale and its marker went
// first and was taken). The recovery has ended, yet that order is neither
// in MySQL nor counted in Redis; the backend's markQueued binds its key back
// (RestoreKeys, done here as it does) but not its units, so Redis sells the
// unit the queued order holds to a new buyer: total 1, two 202s, and MySQL
// fails one of them sold_out once both are written.
func TestReviewOrderQueuedBehindTheMarkerIsNotCounted(t *testing.T) {
	knownGap(t)
	t.Parallel()
	s := newStack(t)
	rdb, prefix := servicetest.Redis(t)
	s.res = reservation.New(rdb, prefix)
	ctx := context.Background()
	s.sale(44, 1, 1)
	o := s.reserve(44, "slow-publish", 1) // its publish is on its way
	o.IdempotencyKey = "k"
	lost, err := s.res.SaleKeys(ctx, 44)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, rdb.Del(ctx, lost...).Err(), "lose Redis")
	s.sale2(44, 1, 1)
	servicetest.Must(t, s.res.MarkRecovering(ctx, 44, "tok", time.Hour), "mark recovering")
	s.publishMarker(ordermsg.Marker{ActivityID: 44, Token: "tok"})
	cfg := testConfig(s.topo)
	cfg.Consumers = 1
	s.start(cfg, nil)
	waitFor(t, "the marker ended the recovery", func() bool {
		tok, err := s.res.Recovery(ctx, 44)
		return err == nil && tok == ""
	})
	s.publishOrders(o) // the slow publish is confirmed now
	// markQueued finds no record (lost with Redis): it binds the key back.
	servicetest.Must(t, s.res.RestoreKeys(ctx, 44, []reservation.Decided{{OrderID: o.OrderID, UserID: o.UserID,
		IdempotencyKey: "k", Quantity: 1}}), "bind the key back as markQueued does")
	other, err := s.res.Reserve(ctx, reservation.Request{ActivityID: 44, UserID: "new-buyer",
		Quantity: 1, OrderID: ordermsg.NewOrderID(44), TTL: time.Minute})
	servicetest.Must(t, err, "new buyer")
	if other.Outcome == reservation.Reserved {
		t.Errorf("a new buyer reserved the only unit (total 1), which queued order %s holds", o.OrderID)
	}
	waitFor(t, "the queued order settled in Redis", func() bool {
		rec, found, err := s.res.Order(ctx, 44, o.OrderID)
		return err == nil && found && rec.State.Public() == "confirmed"
	})
	sale, _, err := s.res.Sale(ctx, 44)
	servicetest.Must(t, err, "read sale")
	if sale.Sold+sale.Pending > sale.Total {
		t.Errorf("Redis admits sold %d + pending %d of total %d after the rebuild", sale.Sold, sale.Pending, sale.Total)
	}
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

// Review finding (issue 9): even on one channel, the drain marker ends the
// recovery before the orders before it are counted in Redis. handle ends
// the recovery (markers last) and only then hands the written groups to the
// settler goroutine, which is also behind up to settleBacklog earlier
// batches; restoreKeys binds an order's key only ("the record is settle's").
// Until that settle lands, Redis counts neither the record nor the units of
// an order queued before the loss, yet the recovery is over: a new buyer is
// sold the unit MySQL has just confirmed to the queued order (total 1).
// A Redis that fails during the settle widens it until the sweeper or the
// reconciler acts (a lost record has no deadline for the sweeper to find).
func TestReviewRecoveryEndsBeforeTheQueuedOrdersAreSettled(t *testing.T) {
	knownGap(t)
	t.Parallel()
	s := newStack(t)
	rdb, prefix := servicetest.Redis(t)
	s.res = reservation.New(rdb, prefix)
	ctx := context.Background()
	s.sale(45, 1, 1)
	o := s.reserve(45, "queued-before-loss", 1)
	o.IdempotencyKey = "k"
	s.publishOrders(o)
	lost, err := s.res.SaleKeys(ctx, 45)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, rdb.Del(ctx, lost...).Err(), "lose Redis")
	s.sale2(45, 1, 1)
	servicetest.Must(t, s.res.MarkRecovering(ctx, 45, "tok", time.Hour), "mark recovering")
	s.publishMarker(ordermsg.Marker{ActivityID: 45, Token: "tok"})

	cfg := testConfig(s.topo)
	cfg.Consumers = 1
	gs := &gatedSettle{Reservations: s.res, open: make(chan struct{})}
	m := workermetrics.New(prometheus.NewRegistry())
	c := consume.New(cfg, gs, store.New(s.db, m, 10*time.Second), m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	rctx, stop := context.WithCancel(ctx)
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
	waitFor(t, "the queued order written", func() bool { return s.orderStatus(o.OrderID) == "confirmed" })
	ended := false
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if tok, err := s.res.Recovery(ctx, 45); err == nil && tok == "" {
			ended = true
			break
		}
	}
	if ended {
		sale, _, err := s.res.Sale(ctx, 45)
		servicetest.Must(t, err, "read sale")
		t.Errorf("the recovery ended while order %s, confirmed in MySQL, is not counted in Redis (sold %d pending %d of %d)",
			o.OrderID, sale.Sold, sale.Pending, sale.Total)
	}
	other, err := s.res.Reserve(ctx, reservation.Request{ActivityID: 45, UserID: "new-buyer",
		Quantity: 1, OrderID: ordermsg.NewOrderID(45), TTL: time.Minute})
	servicetest.Must(t, err, "new buyer")
	if other.Outcome == reservation.Reserved {
		t.Errorf("a new buyer reserved the only unit (total 1), which MySQL confirmed to order %s", o.OrderID)
	}
	close(gs.open)
	waitFor(t, "the queued order settled in Redis", func() bool {
		rec, found, err := s.res.Order(ctx, 45, o.OrderID)
		return err == nil && found && rec.State.Public() == "confirmed"
	})
	sale, _, err := s.res.Sale(ctx, 45)
	servicetest.Must(t, err, "read sale")
	if sale.Sold+sale.Pending > sale.Total {
		t.Errorf("Redis admits sold %d + pending %d of total %d after the rebuild", sale.Sold, sale.Pending, sale.Total)
	}
}

// Review finding (issue 9): a rebuild reads the sale's row (loadActivity:
// sold) first and warms Redis with that sold much later, after
// salesdb.Restore; nothing ties the two reads together. An order queued
// before the loss that a worker commits in between is missed by the stale
// sold, and its settle (meta missing: the record is written, the counters
// skipped — settle.lua) or Restore's Decided read (a K record) leaves a K
// record the later settle skips. Redis's sold then stays one order short of
// MySQL's for good (until a reconciler pass, if it repairs sold upwards):
// Redis sells a unit MySQL does not have. The rebuild's steps are run here
// in the order Service.rebuild runs them (loadActivity, Restore, warm
// create-only with the row read first), the worker's commit forced between.
func TestReviewRebuildWarmsWithSoldReadBeforeTheRestore(t *testing.T) {
	knownGap(t)
	t.Parallel()
	s := newStack(t)
	rdb, prefix := servicetest.Redis(t)
	s.res = reservation.New(rdb, prefix)
	ctx := context.Background()
	s.sale(46, 1, 1)
	o := s.reserve(46, "queued-before-loss", 1)
	s.publishOrders(o)
	lost, err := s.res.SaleKeys(ctx, 46)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, rdb.Del(ctx, lost...).Err(), "lose Redis")

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
	waitFor(t, "the recovery ended", func() bool {
		tok, err := s.res.Recovery(ctx, 46)
		return err == nil && tok == ""
	})

	_, mysqlSold := s.stockSold(46)
	sale, _, err := s.res.Sale(ctx, 46)
	servicetest.Must(t, err, "read sale")
	if sale.Sold != mysqlSold {
		t.Errorf("after the rebuild Redis sold %d, MySQL sold %d", sale.Sold, mysqlSold)
	}
	other, err := s.res.Reserve(ctx, reservation.Request{ActivityID: 46, UserID: "new-buyer",
		Quantity: 1, OrderID: ordermsg.NewOrderID(46), TTL: time.Minute})
	servicetest.Must(t, err, "new buyer")
	if other.Outcome == reservation.Reserved {
		t.Errorf("a new buyer reserved a unit of a sale MySQL sold out (%d of 1 sold)", mysqlSold)
	}
}
