package sweep

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/saletest"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/lua"
)

type rig struct {
	rdb   redis.UniversalClient
	store *reservation.Store
	db    *sql.DB
	sr    *saletest.Rig
}

func newRig(t *testing.T) *rig {
	t.Helper()
	sr := saletest.New(t)
	return &rig{rdb: sr.Redis, store: sr.Store, db: sr.DB, sr: sr}
}

func (r *rig) sweeper(grace time.Duration) *Sweeper {
	return New(Config{Interval: 50 * time.Millisecond, Grace: grace, QueryTimeout: 30 * time.Second, Instance: "t"},
		r.rdb, r.store, r.db, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func (r *rig) reserve(t testing.TB, act int64, user string, qty int64) string {
	t.Helper()
	return r.reserveKey(t, act, user, "", qty)
}

func (r *rig) reserveKey(t testing.TB, act int64, user, key string, qty int64) string {
	t.Helper()
	res, err := r.store.Reserve(context.Background(), reservation.Request{
		ActivityID: act, UserID: user, IdempotencyKey: key, Quantity: qty, OrderID: ordermsg.NewOrderID(act), TTL: time.Millisecond,
	})
	servicetest.Must(t, err, "reserve")
	if res.Outcome != reservation.Reserved {
		t.Fatalf("reserve: %v", res.Outcome)
	}
	return res.OrderID
}

func (r *rig) sale(t testing.TB, act, stock, limit int64) {
	t.Helper()
	now := time.Now()
	r.sr.Open(t, act, stock, limit, now.Add(-time.Hour), now.Add(time.Hour))
}

func (r *rig) overdueAll(t testing.TB, act int64, ids ...string) {
	t.Helper()
	for _, oid := range ids {
		servicetest.Must(t, r.rdb.ZAdd(context.Background(), r.store.Keys(act).Deadlines, redis.Z{Score: 0, Member: oid}).Err(), "zadd")
	}
}

func TestSweepResolvesOverdueReservations(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const act = 7
	r.sale(t, act, 10, 5)
	committed := r.reserve(t, act, "alice", 1)        // the worker committed, then died before settling
	lost := r.reserveKey(t, act, "bob", "bob-key", 2) // the backend died before its publish (or answered 503)
	claimed := r.reserve(t, act, "carol", 1)          // a worker claimed it, then died before its commit
	queued := r.reserve(t, act, "dan", 1)             // confirmed by the broker; the workers are away
	_, err := r.store.Claim(ctx, act, []string{claimed})
	servicetest.Must(t, err, "claim")
	marked, err := r.store.MarkQueued(ctx, act, queued)
	servicetest.Must(t, err, "mark queued")
	if !marked {
		t.Fatal("queued order not marked")
	}
	_, err = r.db.Exec(`UPDATE activities SET stock = stock - 1, sold = sold + 1 WHERE id = ?`, act)
	servicetest.Must(t, err, "sell")
	_, err = r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?, ?, 'alice', 1, 'confirmed')`, committed, act)
	servicetest.Must(t, err, "insert order")
	time.Sleep(5 * time.Millisecond) // past the 1 ms deadlines

	// Within the grace: settle what MySQL has, wait for the rest. Nothing is
	// published: a reservation the broker never confirmed may belong to a 503.
	st, err := r.sweeper(time.Hour).Sweep(ctx)
	servicetest.Must(t, err, "sweep 1")
	if st != (Stats{Settled: 1, Waiting: 1}) {
		t.Fatalf("sweep 1 stats = %+v", st)
	}
	rec, _, _ := r.store.Order(ctx, act, committed)
	if rec.State != reservation.Confirmed {
		t.Errorf("committed order state %v, want confirmed", rec.State)
	}
	// Postponed: an immediate second sweep does nothing.
	st, err = r.sweeper(time.Hour).Sweep(ctx)
	servicetest.Must(t, err, "sweep 2")
	if st != (Stats{}) {
		t.Errorf("sweep 2 stats = %+v, want nothing done", st)
	}

	// Past the grace: MySQL records the unconfirmed ones as failed and Redis
	// gives their units back; the queued one keeps waiting for its message.
	r.overdueAll(t, act, lost, claimed, queued)
	st, err = r.sweeper(time.Millisecond).Sweep(ctx)
	servicetest.Must(t, err, "sweep 3")
	if st != (Stats{Expired: 2, Waiting: 1}) {
		t.Fatalf("sweep 3 stats = %+v", st)
	}
	for _, oid := range []string{lost, claimed} {
		var status, reason string
		servicetest.Must(t, r.db.QueryRow(`SELECT status, reason FROM orders WHERE order_id = ?`, oid).Scan(&status, &reason), "read %s", oid)
		if status != "failed" || reason != "expired" {
			t.Errorf("order %s: %s/%s, want failed/expired", oid, status, reason)
		}
		rec, _, _ := r.store.Order(ctx, act, oid)
		if rec.State != reservation.Failed || rec.Reason != "expired" {
			t.Errorf("order %s in Redis: %+v", oid, rec)
		}
	}
	if rec, _, _ := r.store.Order(ctx, act, queued); rec.State != reservation.Pending || !rec.Queued {
		t.Errorf("queued order after the grace: %+v, want still pending and queued", rec)
	}
	// The worker is back and writes it: the next look settles it.
	_, err = r.db.Exec(`UPDATE activities SET stock = stock - 1, sold = sold + 1 WHERE id = ?`, act)
	servicetest.Must(t, err, "sell")
	_, err = r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?, ?, 'dan', 1, 'confirmed')`, queued, act)
	servicetest.Must(t, err, "insert order")
	r.overdueAll(t, act, queued)
	st, err = r.sweeper(time.Millisecond).Sweep(ctx)
	servicetest.Must(t, err, "sweep 4")
	if st != (Stats{Settled: 1}) {
		t.Fatalf("sweep 4 stats = %+v", st)
	}
	sale, _, err := r.store.Sale(ctx, act)
	servicetest.Must(t, err, "sale")
	if sale.Pending != 0 || sale.Sold != 2 {
		t.Errorf("sale after sweeps: %+v, want pending 0 sold 2", sale)
	}
	if n, _ := r.rdb.ZCard(ctx, r.store.Keys(act).Deadlines).Result(); n != 0 {
		t.Errorf("%d orders still indexed", n)
	}
	if u, _ := r.store.User(ctx, act, "bob"); u.Held != 0 {
		t.Errorf("bob still holds %d units", u.Held)
	}
}

func TestSweepDefersToACommitThatWon(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const act = 8
	r.sale(t, act, 5, 1)
	oid := r.reserve(t, act, "dave", 1)
	time.Sleep(5 * time.Millisecond)
	// The worker's commit lands between the sweeper's look-up and its insert:
	// INSERT IGNORE keeps the worker's row, and Redis follows it.
	_, err := r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?, ?, 'dave', 1, 'confirmed')`, oid, act)
	servicetest.Must(t, err, "insert")
	s := r.sweeper(time.Millisecond)
	recs, err := r.store.Records(ctx, act, []string{oid})
	servicetest.Must(t, err, "records")
	servicetest.Must(t, s.expire(ctx, act, recs), "expire")
	rows, err := s.lookup(ctx, recs)
	servicetest.Must(t, err, "lookup")
	if !rows[oid].Confirmed {
		t.Errorf("row %+v, want the worker's confirmed row", rows[oid])
	}
	st, err := s.Sweep(ctx)
	servicetest.Must(t, err, "sweep")
	rec, _, _ := r.store.Order(ctx, act, oid)
	if rec.State != reservation.Confirmed || st != (Stats{Settled: 1}) {
		t.Errorf("state %v stats %+v, want confirmed (MySQL's row wins)", rec.State, st)
	}
}

// TestSweepKeepsUpWithBacklog: 10,000 overdue reservations (a third each
// committed, queued, never confirmed) are all resolved by one sweep pass,
// in chunks, not 500 per tick.
func TestSweepKeepsUpWithBacklog(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const act, n = 9, 10_000
	r.sale(t, act, n, 1)
	ids := make([]string, n)
	buckets, err := r.store.Buckets(ctx, act)
	servicetest.Must(t, err, "buckets")
	// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT (other tests
	// flush the script cache of the shared Redis). In pipelines of 500: the
	// script's text is ~19 KB, and all 10,000 in one write (~190 MB) outlasted
	// the client's 3 s write timeout on a loaded machine.
	for lo := 0; lo < n; lo += 500 {
		_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := lo; i < min(lo+500, n); i++ {
				ids[i] = ordermsg.NewOrderID(act)
				k, user := r.store.Keys(act), fmt.Sprintf("u%05d", i)
				lua.Reserve.Eval(ctx, p, k.ReserveKeys(buckets, user, ids[i]), user, "", 1, ids[i], 1, buckets)
			}
			return nil
		})
		servicetest.Must(t, err, "reserve orders %d-%d", lo, min(lo+500, n)-1)
	}
	var committed []any
	_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, oid := range ids {
			switch i % 3 {
			case 0:
				committed = append(committed, oid, act, fmt.Sprintf("u%05d", i))
			case 1:
				lua.Queued.Eval(ctx, p, []string{r.store.Keys(act).Meta}, oid)
			}
		}
		return nil
	})
	servicetest.Must(t, err, "mark queued")
	for start := 0; start < len(committed); start += 3000 {
		chunk := committed[start:min(start+3000, len(committed))]
		_, err = r.db.Exec("INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?, ?, ?, 1, 'confirmed'), ", len(chunk)/3), ", "), chunk...)
		servicetest.Must(t, err, "insert rows")
	}
	_, err = r.db.Exec(`UPDATE activities SET stock = stock - ?, sold = sold + ? WHERE id = ?`, len(committed)/3, len(committed)/3, act)
	servicetest.Must(t, err, "sell")
	time.Sleep(5 * time.Millisecond)
	start := time.Now()
	st, err := r.sweeper(time.Millisecond).Sweep(ctx)
	servicetest.Must(t, err, "sweep")
	t.Logf("one pass over %d overdue reservations: %v, %+v", n, time.Since(start), st)
	if st.Settled != 3334 || st.Expired != 3333 || st.Waiting != 3333 {
		t.Fatalf("stats %+v, want 3334 settled, 3333 expired, 3333 waiting", st)
	}
	sale, _, err := r.store.Sale(ctx, act)
	servicetest.Must(t, err, "sale")
	if sale.Sold != 3334 || sale.Pending != 3333 {
		t.Errorf("sale %+v, want sold 3334 and the 3333 queued still pending", sale)
	}
}

// TestLongSweepKeepsItsLease: a sweep longer than the lease renews it
// between chunks, so no second sweeper starts meanwhile; one whose lease
// was taken over stops at the next chunk.
func TestLongSweepKeepsItsLease(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const act = 10
	r.sale(t, act, 200, 200)
	for range 60 {
		r.reserve(t, act, "u", 1)
	}
	time.Sleep(5 * time.Millisecond)
	a, b := r.sweeper(time.Hour), r.sweeper(time.Hour)
	a.cfg.Instance, b.cfg.Instance = "a", "b"
	a.cfg.Batch = 10 // 6 chunks
	a.cfg.Interval = 50 * time.Millisecond
	ok, err := a.acquire(ctx) // lease of 150 ms
	servicetest.Must(t, err, "acquire")
	if !ok {
		t.Fatal("a has no lease")
	}
	chunks := 0
	a.afterChunk = func() {
		chunks++
		time.Sleep(30 * time.Millisecond) // 6 chunks: past the lease
		if held, err := b.acquire(ctx); err != nil || held {
			t.Errorf("b took the lease during a's sweep (chunk %d, err %v)", chunks, err)
		}
	}
	_, err = a.Sweep(ctx)
	servicetest.Must(t, err, "sweep")
	if chunks < 5 {
		t.Fatalf("%d chunks, want 5 or more", chunks)
	}
	// Taken over: b holds the lease now, a stops at its next chunk.
	for range 60 {
		r.reserve(t, act, "v", 1)
	}
	time.Sleep(5 * time.Millisecond)
	a.afterChunk = func() {
		servicetest.Must(t, r.rdb.Del(ctx, a.leaseKey()).Err(), "drop lease")
		if held, err := b.acquire(ctx); err != nil || !held {
			t.Fatalf("b could not take the dropped lease: %v", err)
		}
	}
	_, err = a.Sweep(ctx)
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("sweep after takeover: %v, want ErrLeaseLost", err)
	}
}

func TestLeaseIsHeldByOne(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	a, b := r.sweeper(time.Hour), r.sweeper(time.Hour)
	a.cfg.Instance, b.cfg.Instance = "a", "b"
	okA, err := a.acquire(ctx)
	servicetest.Must(t, err, "acquire a")
	okB, err := b.acquire(ctx)
	servicetest.Must(t, err, "acquire b")
	if !okA || okB {
		t.Fatalf("a=%v b=%v, want only a", okA, okB)
	}
	if ok, _ := a.acquire(ctx); !ok {
		t.Error("a lost its own lease on renewal")
	}
	a.releaseLease()
	if ok, _ := b.acquire(ctx); !ok {
		t.Error("b could not take the released lease")
	}
	if b.lease.Token() <= 1 {
		t.Errorf("fencing token %d did not grow", b.lease.Token())
	}
}
