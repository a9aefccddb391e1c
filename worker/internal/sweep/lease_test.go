package sweep

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// An order marked queued whose message is no longer in the queue (the
// quorum queue's x-delivery-limit dead-lettered it, the queue was lost) must
// not be postponed forever: past deadline + QueuedGrace with no MySQL row it
// is expired, so its 202 ends and its unit is sellable again. Before that
// bound it waits (a worker outage).
func TestSweepExpiresAQueuedOrderPastTheQueuedBound(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const act = 31
	r.sale(t, act, 1, 1)
	oid := r.reserve(t, act, "dlq", 1)
	marked, err := r.store.MarkQueued(ctx, act, oid)
	servicetest.Must(t, err, "mark")
	if !marked {
		t.Fatal("not marked")
	}
	time.Sleep(5 * time.Millisecond)
	s := r.sweeper(time.Millisecond)
	s.cfg.QueuedGrace = time.Hour
	r.overdueAll(t, act, oid)
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if rec, _, _ := r.store.Order(ctx, act, oid); rec.State != reservation.Pending || !rec.Queued {
		t.Fatalf("queued order within the bound: %+v, want still pending and queued", rec)
	}
	s.cfg.QueuedGrace = 2 * time.Millisecond
	time.Sleep(5 * time.Millisecond)
	for range 20 {
		r.overdueAll(t, act, oid) // as if every postponement had passed
		_, err := s.Sweep(ctx)
		servicetest.Must(t, err, "sweep")
	}
	rec, _, err := r.store.Order(ctx, act, oid)
	servicetest.Must(t, err, "order")
	var status, reason string
	servicetest.Must(t, r.db.QueryRow(`SELECT status, reason FROM orders WHERE order_id = ?`, oid).Scan(&status, &reason), "row")
	if status != "failed" || reason != "expired" {
		t.Errorf("MySQL holds %s %s, want failed expired", status, reason)
	}
	if rec.State == reservation.Pending || rec.State == reservation.Claimed {
		sale, _, _ := r.store.Sale(ctx, act)
		t.Errorf("queued order still %v after 20 sweeps far past deadline+grace (sale %+v: the last unit is held, 'sold_out' for everyone)", rec.State, sale)
	}
}

// Once another sweeper holds the lease (this one's chunk outlived it: a slow
// MySQL, a GC pause), this one must not resolve another chunk: it renews
// before each chunk and stops when the renewal fails.
func TestSweepStopsAtTheChunkAfterLosingItsLease(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const act = 32
	r.sale(t, act, 100, 100)
	for range 20 {
		oid := r.reserve(t, act, "u", 1)
		_, err := r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?, ?, 'u', 1, 'confirmed')`, oid, act)
		servicetest.Must(t, err, "row")
	}
	time.Sleep(5 * time.Millisecond)
	a, b := r.sweeper(time.Hour), r.sweeper(time.Hour)
	a.cfg.Instance, b.cfg.Instance = "a", "b"
	a.cfg.Batch = 10
	if ok, err := a.acquire(ctx); err != nil || !ok {
		t.Fatalf("a: %v %v", ok, err)
	}
	taken := false
	a.afterChunk = func() {
		// a's chunk took longer than its lease (a slow MySQL, a GC pause):
		servicetest.Must(t, r.rdb.Del(ctx, a.leaseKey()).Err(), "expire")
		ok, err := b.acquire(ctx)
		taken = ok && err == nil
	}
	st, err := a.Sweep(ctx)
	if !taken {
		t.Fatal("b never took the lease (the hook did not run)")
	}
	if !errors.Is(err, ErrLeaseLost) {
		t.Errorf("sweep err = %v, want ErrLeaseLost", err)
	}
	if st.Settled > 10 {
		t.Errorf("a settled %d orders, %d of them while b held the lease", st.Settled, st.Settled-10)
	}
}
