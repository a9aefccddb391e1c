package sale_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/lua"
)

// The first attempt's reserve ran but its reply was lost; its background
// undo is slow (held on the network). The client's keyed retry replays the
// order, publishes it (broker confirmed) and is answered 202 with that order
// id. The late undo must then leave the record alone (adopted and queued:
// "taken") and keep the key, so the 202'd order stays open for its worker and
// a later retry with the key gets the same order id.
func TestLateUndoLeavesAnAdoptedReplay(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	lost := r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("$2\r\nok\r\n"), Cut: true})
	// (since e8929d6 the backend re-runs a reserve lost on EOF once: lose that reply too)
	r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("$2\r\nok\r\n"), Cut: true})
	hold := make(chan struct{})
	firstUndo := r.fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains("reserve_failed"), Hold: hold})
	for range 10 { // every retry of the undo is held too, until hold closes
		r.fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains("reserve_failed"), Hold: hold})
	}
	res, err := r.purchase("adopt", "k")
	mustUnavailable(t, res, err)
	<-lost
	<-firstUndo

	retry, err := r.purchase("adopt", "k")
	if err != nil || retry.Outcome != sale.Accepted || !retry.Replay {
		t.Fatalf("keyed retry = %+v %v, want a 202 replay", retry, err)
	}
	a := retry.OrderID
	if q := r.queued(t); len(q) != 1 || q[0] != a {
		t.Fatalf("queued %v, want the adopted order %s", q, a)
	}
	// (r.queued drained it to look; in a real run it waits for a worker, whose
	// claim.lua reads the Redis record below.)
	undoRan := r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("*1\r\n$"), Delay: time.Nanosecond})
	close(hold)
	select {
	case <-undoRan:
	case <-time.After(10 * time.Second):
		t.Fatal("the held undo never ran")
	}
	rec, found, err := r.direct.Order(context.Background(), act, a)
	servicetest.Must(t, err, "order")
	if !found || rec.State == reservation.Failed {
		t.Errorf("order %s was answered 202 (and its message queued), but the late undo released it: %+v — a worker's claim now sees F and fails it", a, rec)
	}
	third, err := r.purchase("adopt", "k")
	if err != nil || third.OrderID != a {
		t.Errorf("a later retry with key k = %+v %v; want order %s again (the key was answered with it)", third, err, a)
	}
}

// The publish "fails" (confirm timeout) although the broker has the message
// (a stalled frame may be written after its caller gave up). The 503 must be
// backed by a refusal that survives Redis: once Redis loses the sale
// (FLUSHDB, failover to an empty replica) claim.lua answers "?" and only a
// failed row in MySQL stops a worker from confirming the queued message.
func TestPublishThatMayHaveArrivedIsRefusedInMySQL(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var oid string
	late := func(ctx context.Context, o ordermsg.Order) error {
		oid = o.OrderID
		if err := r.real.Publish(ctx, o); err != nil { // the frame reaches the broker...
			return err
		}
		return broker.ErrConfirmTimeout // ...but the backend never learns it in time
	}
	r.publish.Store(&late)
	res, err := r.purchase("lucky", "k")
	mustUnavailable(t, res, err)
	r.publish.Store(nil)
	if q := r.queued(t); len(q) != 1 || q[0] != oid {
		t.Fatalf("queued %v", q)
	}
	// Redis loses the sale (only this test's keys).
	keys, err := r.direct.SaleKeys(context.Background(), act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(context.Background(), keys...).Err(), "lose")
	states, err := r.direct.Claim(context.Background(), act, []string{oid})
	servicetest.Must(t, err, "claim")
	var status string
	err = r.db.QueryRow(`SELECT status FROM orders WHERE order_id = ?`, oid).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) && states[0] == reservation.Unknown {
		t.Errorf("503 order %s: its message is queued, Redis claim answers %q and MySQL holds no failed row: "+
			"a worker confirms it (store.Write with Claim '?' is decided by MySQL's guards alone)", oid, states[0])
	}
}

// After Redis loses a sale, a keyed retry of an order still in the queue gets
// the same order id or 503, never a second order id.
func TestKeyedRetryAfterRedisLossNeverGetsSecondOrderID(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	first, err := r.purchase("keyed", "k")
	if err != nil || first.Outcome != sale.Accepted {
		t.Fatalf("first = %+v %v", first, err)
	}
	keys, err := r.direct.SaleKeys(context.Background(), act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(context.Background(), keys...).Err(), "lose")
	again, err := r.purchase("keyed", "k")
	if err == nil && again.OrderID != first.OrderID {
		t.Errorf("retry with key k after the loss = 202 %s; the key was answered with %s (want that order, or 503)", again.OrderID, first.OrderID)
	}
	if s := r.sale(t); s.Pending+s.Sold > 0 && err == nil && again.OrderID != first.OrderID {
		t.Logf("Redis now counts %d pending for the second order while %s is still queued: Redis admits beyond what MySQL will hold", s.Pending, first.OrderID)
	}
}

// The rebuild after a loss restores the keys of decided orders before the
// sale exists again; a Restore that fails once must be retried by a later
// request, or a keyed retry of a confirmed order would get a new order id.
func TestFailedRestoreIsRetriedByTheNextRequest(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	first, err := r.purchase("paid", "k")
	if err != nil || first.Outcome != sale.Accepted {
		t.Fatalf("first = %+v %v", first, err)
	}
	// The worker's decision, in MySQL (as store.Write leaves it).
	_, err = r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status, idempotency_key) VALUES (?, ?, 'paid', 1, 'confirmed', 'k')`, first.OrderID, act)
	servicetest.Must(t, err, "order row")
	_, err = r.db.Exec(`INSERT INTO purchases (activity_id, user_id, quantity) VALUES (?, 'paid', 1)`, act)
	servicetest.Must(t, err, "purchases")
	_, err = r.db.Exec(`UPDATE activities SET stock = stock - 1, sold = sold + 1 WHERE id = ?`, act)
	servicetest.Must(t, err, "sold")
	keys, err := r.direct.SaleKeys(ctx, act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(ctx, keys...).Err(), "lose")
	cut := r.fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains(lua.Restore.Hash()), Cut: true})
	res, err := r.purchase("someone", "")
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatalf("Restore never ran (purchase = %+v %v)", res, err)
	}
	mustUnavailable(t, res, err) // the rebuild's Restore failed
	again, err := r.purchase("paid", "k")
	if err != nil || again.OrderID != first.OrderID {
		t.Errorf("keyed retry of confirmed order %s = %+v %v; want that order (the failed Restore is never retried)", first.OrderID, again, err)
	}
}

// The publish fails in a way that certainly wrote nothing (ErrNotConnected),
// the undo cannot reach Redis and MySQL is unreachable too. The answer must
// be 503 (nobody publishes the order; a 202 would name an order that lives
// only in a Redis record and vanishes with it), nothing may be queued, and
// the background undo releases the reservation once Redis answers again.
func TestUnwrittenPublishWithRedisAndMySQLDownAnswers503(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var oid string
	down := func(ctx context.Context, o ordermsg.Order) error {
		oid = o.OrderID
		r.fp.Set(faultnet.Faults{Up: faultnet.Flow{CutRate: 1}})
		r.fp.CutAll()
		_ = r.db.Close()              // MySQL unreachable for this backend
		return broker.ErrNotConnected // nothing was written to the broker
	}
	r.publish.Store(&down)
	res, err := r.purchase("ghost", "k")
	mustUnavailable(t, res, err)
	r.publish.Store(nil)
	r.fp.Set(faultnet.Faults{})
	if q := r.queued(t); len(q) != 0 {
		t.Fatalf("queued %v after a publish that wrote nothing", q)
	}
	eventually(t, "the background undo", func() bool {
		rec, found, err := r.direct.Order(context.Background(), act, oid)
		return err == nil && found && rec.State == reservation.Failed
	})
	if s := r.sale(t); s.Pending != 0 {
		t.Errorf("pending = %d after the undo, want 0", s.Pending)
	}
}
