package reconcile

import (
	"context"
	"database/sql"
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
)

type rig struct {
	rdb   redis.UniversalClient
	store *reservation.Store
	db    *sql.DB
	sr    *saletest.Rig
	rec   *Reconciler
}

const act = 42

// newRig makes a sale of 10 units (limit 3) in MySQL and Redis, with alice's 2
// units confirmed and settled, bob's 1 unit committed but not settled, and
// carol's 1 unit reserved, not yet committed.
func newRig(t *testing.T) (*rig, map[string]string) {
	t.Helper()
	ctx := context.Background()
	sr := saletest.New(t)
	rdb, db, store := sr.Redis, sr.DB, sr.Store
	r := &rig{rdb: rdb, store: store, db: db, sr: sr,
		rec: New(db, store, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, 5*time.Second)}
	now := time.Now()
	sr.Open(t, act, 10, 3, now.Add(-time.Hour), now.Add(time.Hour))
	ids := map[string]string{}
	for _, u := range []struct {
		user string
		qty  int64
	}{{"alice", 2}, {"bob", 1}, {"carol", 1}} {
		oid := ordermsg.NewOrderID(act)
		res, err := store.Reserve(ctx, reservation.Request{ActivityID: act, UserID: u.user, Quantity: u.qty, OrderID: oid, TTL: time.Minute})
		servicetest.Must(t, err, "reserve")
		if res.Outcome != reservation.Reserved {
			t.Fatalf("reserve %s: %v", u.user, res.Outcome)
		}
		ids[u.user] = oid
	}
	r.commit(t, ids["alice"], "alice", 2)
	_, err := store.Settle(ctx, act, []reservation.Settlement{{OrderID: ids["alice"], Confirmed: true, Quantity: 2, UserID: "alice"}})
	servicetest.Must(t, err, "settle")
	r.commit(t, ids["bob"], "bob", 1)
	return r, ids
}

// commit writes what a worker's transaction writes for one confirmed order.
func (r *rig) commit(t *testing.T, oid, user string, qty int64) {
	t.Helper()
	r.sr.Commit(t, act, oid, user, "", qty)
}

func (r *rig) sale(t *testing.T) reservation.Sale {
	t.Helper()
	s, found, err := r.store.Sale(context.Background(), act)
	servicetest.Must(t, err, "sale")
	if !found {
		t.Fatal("sale missing in Redis")
	}
	return s
}

func (r *rig) pass(t *testing.T, force bool) Report {
	t.Helper()
	reps, err := r.rec.Pass(context.Background(), force)
	servicetest.Must(t, err, "pass")
	if len(reps) != 1 || reps[0].ActivityID != act {
		t.Fatalf("reports = %+v", reps)
	}
	return reps[0]
}

func TestInFlightLagIsNotDrift(t *testing.T) {
	t.Parallel()
	r, _ := newRig(t)
	before := r.sale(t)
	rep := r.pass(t, false)
	if rep.Unsafe || len(rep.Repairs) != 0 {
		t.Fatalf("healthy sale reported as drift: %s", rep)
	}
	if after := r.sale(t); after != before {
		t.Errorf("a healthy pass changed Redis: %+v → %+v", before, after)
	}
	if rep.MySQLSold != 3 || rep.RedisSold != 2 || rep.RedisPending != 2 {
		t.Errorf("report = %s", rep)
	}
}

func TestForceSettlesAndSyncsExactly(t *testing.T) {
	t.Parallel()
	r, ids := newRig(t)
	rep := r.pass(t, true)
	if !strings.Contains(strings.Join(rep.Repairs, ";"), "settled 1 orders") {
		t.Errorf("repairs = %v", rep.Repairs)
	}
	s := r.sale(t)
	if s.Total != 10 || s.Sold != 3 || s.Pending != 1 {
		t.Errorf("after force: %+v, want sold 3 pending 1 (carol)", s)
	}
	rec, _, _ := r.store.Order(context.Background(), act, ids["bob"])
	if rec.State != reservation.Confirmed {
		t.Errorf("bob's order %v, want confirmed", rec.State)
	}
	held := map[string]int64{}
	for _, u := range []string{"alice", "bob", "carol", "dave"} {
		e, err := r.store.User(context.Background(), act, u)
		servicetest.Must(t, err, "user %s", u)
		if e.Held != 0 {
			held[u] = e.Held
		}
	}
	if held["alice"] != 2 || held["bob"] != 1 || held["carol"] != 1 || len(held) != 3 {
		t.Errorf("users = %v", held)
	}
}

func TestDriftIsRepaired(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(t *testing.T, r *rig)
	}{
		{"redis sold above mysql (double settle)", func(t *testing.T, r *rig) {
			r.rdb.HIncrBy(context.Background(), r.store.Keys(act).Meta, "sold", 2)
		}},
		{"redis behind beyond pending (lost pending)", func(t *testing.T, r *rig) {
			r.rdb.HSet(context.Background(), r.store.Keys(act).Meta, "pending", 0)
		}},
		{"total differs", func(t *testing.T, r *rig) {
			r.rdb.HSet(context.Background(), r.store.Keys(act).Meta, "total", 50)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, _ := newRig(t)
			tc.corrupt(t, r)
			rep := r.pass(t, false)
			if len(rep.Repairs) == 0 {
				t.Fatalf("drift not repaired: %s", rep)
			}
			s := r.sale(t)
			if s.Total != 10 || s.Sold != 3 || s.Pending != 1 {
				t.Errorf("after repair: %+v, want total 10 sold 3 pending 1", s)
			}
			if rep := r.pass(t, false); len(rep.Repairs) != 0 || rep.Unsafe {
				t.Errorf("second pass still drifts: %s", rep)
			}
		})
	}
}

func TestLostSaleIsRebuilt(t *testing.T) {
	t.Parallel()
	r, ids := newRig(t)
	_, err := r.db.Exec(`UPDATE orders SET idempotency_key = 'key-a' WHERE order_id = ?`, ids["alice"])
	servicetest.Must(t, err, "set key")
	keys, err := r.store.SaleKeys(context.Background(), act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(context.Background(), keys...).Err(), "lose")
	rep := r.pass(t, false)
	if !strings.Contains(strings.Join(rep.Repairs, ";"), "rebuilt") {
		t.Fatalf("repairs = %v", rep.Repairs)
	}
	s := r.sale(t)
	// MySQL knows alice's 2 and bob's 1; carol's reservation was lost with Redis
	// and will settle against MySQL's guard when her message arrives.
	if s.Total != 10 || s.Sold != 3 || s.Pending != 0 || s.Limit != 3 {
		t.Errorf("rebuilt sale %+v", s)
	}
	alice, _ := r.store.User(context.Background(), act, "alice")
	bob, _ := r.store.User(context.Background(), act, "bob")
	if alice.Held != 2 || alice.Keys["key-a"] != ids["alice"] || bob.Held != 1 {
		t.Errorf("rebuilt users: alice %+v, bob %+v", alice, bob)
	}
	// Decided orders and their keys are back: alice retrying with her key gets
	// her order, not a second one.
	for user, state := range map[string]reservation.State{"alice": reservation.Confirmed, "bob": reservation.Confirmed} {
		rec, found, err := r.store.Order(context.Background(), act, ids[user])
		servicetest.Must(t, err, "order")
		if !found || rec.State != state {
			t.Errorf("%s's order after rebuild: found=%v %+v", user, found, rec)
		}
	}
	res, err := r.store.Reserve(context.Background(), reservation.Request{ActivityID: act, UserID: "alice",
		IdempotencyKey: "key-a", Quantity: 1, OrderID: ordermsg.NewOrderID(act), TTL: time.Minute})
	servicetest.Must(t, err, "replay")
	if res.Outcome != reservation.Replay || res.OrderID != ids["alice"] || res.State != reservation.Confirmed {
		t.Errorf("retry with alice's key after the rebuild: %+v, want a replay of %s", res, ids["alice"])
	}
}

// TestArchivedSaleIsNotRebuilt: an archived sale whose summary is gone (its
// TTL ended, or Redis lost it) is not brought back, and its id leaves the
// activity set.
func TestArchivedSaleIsNotRebuilt(t *testing.T) {
	t.Parallel()
	r, _ := newRig(t)
	ctx := context.Background()
	_, err := r.db.Exec(`UPDATE activities SET archived_at = UTC_TIMESTAMP(3) WHERE id = ?`, act)
	servicetest.Must(t, err, "archive in MySQL")
	keys, err := r.store.SaleKeys(ctx, act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(ctx, keys...).Err(), "lose")
	if rep := r.pass(t, false); !rep.Archived || len(rep.Repairs) != 0 {
		t.Fatalf("report %s", rep)
	}
	if n := r.rdb.Exists(ctx, keys...).Val(); n != 0 {
		t.Errorf("%d keys of the archived sale came back", n)
	}
	if ids, _ := r.store.Activities(ctx); len(ids) != 0 {
		t.Errorf("activity set = %v", ids)
	}
	// Gone from the set and archived in MySQL: not even listed any more.
	reps, err := r.rec.Pass(ctx, true)
	servicetest.Must(t, err, "forced pass")
	if len(reps) != 0 {
		t.Errorf("a forced pass looked at %v", reps)
	}
}

// TestReopenedSaleIsRebuiltFromItsSummary: an admin change reopened an
// archived sale in MySQL (a newer generation) and its Redis write failed; the
// reconciler rebuilds the sale whole, as the admin change would have.
func TestReopenedSaleIsRebuiltFromItsSummary(t *testing.T) {
	t.Parallel()
	r, ids := newRig(t)
	ctx := context.Background()
	k := r.store.Keys(act)
	// Archived at generation 0 (carol's open reservation dropped with it, as
	// if released), then reopened in MySQL at generation 1.
	keys, err := r.store.SaleKeys(ctx, act)
	servicetest.Must(t, err, "sale keys")
	r.rdb.Del(ctx, keys[1:]...) // all but meta, as archive.lua
	r.rdb.HDel(ctx, k.Meta, "buckets")
	r.rdb.HSet(ctx, k.Meta, "archived", 1, "sold", 3, "pending", 0, "gen", 0)
	_, err = r.db.Exec(`UPDATE activities SET generation = 1, archived_at = NULL WHERE id = ?`, act)
	servicetest.Must(t, err, "reopen in MySQL")
	rep := r.pass(t, false)
	if rep.Archived || !strings.Contains(strings.Join(rep.Repairs, ";"), "rebuilt") {
		t.Fatalf("report %s", rep)
	}
	s := r.sale(t)
	if s.Archived || s.Gen != 1 || s.Sold != 3 || s.Pending != 0 {
		t.Errorf("rebuilt sale %+v", s)
	}
	if rec, found, _ := r.store.Order(ctx, act, ids["alice"]); !found || rec.State != reservation.Confirmed {
		t.Errorf("alice's order after the rebuild: %+v %v", rec, found)
	}
	// Same generation in both: the archiver's unfinished archive, left alone.
	r.rdb.HSet(ctx, k.Meta, "archived", 1, "gen", 1)
	if rep := r.pass(t, false); !rep.Archived {
		t.Errorf("report %s", rep)
	}
	if ids, _ := r.store.Activities(ctx); len(ids) != 1 {
		t.Errorf("the archiver's unfinished sale left the set: %v", ids)
	}
}
