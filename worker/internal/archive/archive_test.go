package archive

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/saletest"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/internal/teardown"
)

type rig struct {
	t      *testing.T
	rdb    redis.UniversalClient
	prefix string
	store  *reservation.Store
	db     *sql.DB
	sr     *saletest.Rig
	arc    *Archiver
}

func newRig(t *testing.T) *rig {
	t.Helper()
	sr := saletest.New(t)
	rdb, prefix := sr.Redis, sr.Prefix
	r := &rig{t: t, rdb: rdb, prefix: prefix, store: sr.Store, db: sr.DB, sr: sr}
	r.arc = New(Config{Interval: time.Second, Grace: time.Millisecond, SummaryTTL: time.Hour,
		QueryTimeout: 5 * time.Second, Instance: "test"}, rdb, r.store, r.db, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	return r
}

func (r *rig) redisNow() time.Time {
	now, err := r.rdb.Time(context.Background()).Result()
	servicetest.Must(r.t, err, "time")
	return now
}

// open creates a sale in MySQL and Redis (generation 0), open from an hour
// ago until end.
func (r *rig) open(id, stock, limit int64, end time.Time) {
	r.t.Helper()
	r.sr.Open(r.t, id, stock, limit, time.Now().Add(-time.Hour), end)
}

func (r *rig) reserve(id int64, user, key string) reservation.Result {
	r.t.Helper()
	res, err := r.store.Reserve(context.Background(), reservation.Request{ActivityID: id, UserID: user, IdempotencyKey: key,
		Quantity: 1, OrderID: ordermsg.NewOrderID(id), TTL: time.Minute})
	servicetest.Must(r.t, err, "reserve")
	return res
}

// confirm writes what a worker's transaction writes for one confirmed order,
// then settles it in Redis.
func (r *rig) confirm(id int64, oid, user, key string) {
	r.t.Helper()
	r.sr.Commit(r.t, id, oid, user, key, 1)
	_, err := r.store.Settle(context.Background(), id, []reservation.Settlement{{OrderID: oid, Confirmed: true, Quantity: 1, UserID: user}})
	servicetest.Must(r.t, err, "settle")
}

// sell reserves and confirms one unit for each user.
func (r *rig) sell(id int64, users ...string) map[string]string {
	r.t.Helper()
	ids := map[string]string{}
	for _, u := range users {
		res := r.reserve(id, u, "key-"+u)
		if res.Outcome != reservation.Reserved {
			r.t.Fatalf("reserve %s: %s", u, res.Outcome)
		}
		r.confirm(id, res.OrderID, u, "key-"+u)
		ids[u] = res.OrderID
	}
	return ids
}

// waitPast waits until Redis's clock is past t (the sale's end).
func (r *rig) waitPast(t time.Time) {
	r.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); r.redisNow().Before(t.Add(5 * time.Millisecond)); {
		if time.Now().After(deadline) {
			r.t.Fatal("Redis's clock did not pass the sale's end")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *rig) pass() map[int64]Outcome {
	r.t.Helper()
	out, err := r.arc.Pass(context.Background())
	servicetest.Must(r.t, err, "pass")
	return out
}

// keys lists the sale keys under the rig's prefix (without the prefix),
// leaving out the archiver's lease.
func (r *rig) keys() []string {
	r.t.Helper()
	all, err := teardown.RedisKeys(context.Background(), r.rdb, r.prefix)
	servicetest.Must(r.t, err, "scan")
	var out []string
	for _, k := range all {
		k = strings.TrimPrefix(k, r.prefix)
		if !strings.HasPrefix(k, "seckill:archiver") {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func (r *rig) archivedInMySQL(id int64) bool {
	r.t.Helper()
	var archived bool
	servicetest.Must(r.t, r.db.QueryRow(`SELECT archived_at IS NOT NULL FROM activities WHERE id = ?`, id).Scan(&archived), "read row")
	return archived
}

func TestArchiveLeavesOnlyTheSummary(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	end := r.redisNow().Add(1500 * time.Millisecond)
	r.open(1, 1000, 2, end)                 // ends soon; 16 buckets (lua/record.lua)
	r.open(2, 10, 2, end.Add(24*time.Hour)) // stays live
	ended := r.sell(1, "alice", "bob", "carol")
	// A released reservation (a failed publish) leaves a failed record.
	rel := r.reserve(1, "dave", "key-dave")
	if out, err := r.store.Release(ctx, 1, rel.OrderID, "publish_failed"); err != nil || out != reservation.Released {
		t.Fatalf("release: %v %v", out, err)
	}
	r.sell(2, "erin")
	if got := r.pass(); got[1] != NotDue || got[2] != NotDue {
		t.Fatalf("before the end: %v", got)
	}
	var buckets int
	for _, k := range r.keys() {
		if strings.HasPrefix(k, "{act:1}:o:") || strings.HasPrefix(k, "{act:1}:u:") {
			buckets++
		}
	}
	if buckets < 4 {
		t.Fatalf("sale 1 holds %d buckets before the archive (%v), want its orders and users spread", buckets, r.keys())
	}
	r.waitPast(end)

	if got := r.pass(); got[1] != Archived || got[2] != NotDue {
		t.Fatalf("after the end: %v", got)
	}
	want := []string{"seckill:activities", "{act:1}:meta",
		"{act:2}:meta", "{act:2}:o:0", "{act:2}:u:0"}
	if got := r.keys(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("keys after archiving:\n got %v\nwant %v", got, want)
	}
	ids, err := r.store.Activities(ctx)
	servicetest.Must(t, err, "activities")
	if len(ids) != 1 || ids[0] != 2 {
		t.Errorf("activity set = %v, want only the live sale", ids)
	}
	if !r.archivedInMySQL(1) || r.archivedInMySQL(2) {
		t.Error("MySQL's archived mark is wrong")
	}
	sale, found, err := r.store.Sale(ctx, 1)
	servicetest.Must(t, err, "sale")
	if !found || !sale.Archived || sale.Total != 1000 || sale.Sold != 3 || sale.Pending != 0 {
		t.Errorf("summary = %+v (found %v)", sale, found)
	}
	if ttl := r.rdb.PTTL(ctx, r.store.Keys(1).Meta).Val(); ttl <= 0 || ttl > time.Hour {
		t.Errorf("summary TTL = %v, want (0, 1h]", ttl)
	}

	// After the archive: a purchase ends, a settle of a redelivered batch
	// changes nothing, and a second pass and a repeat are no-ops.
	if res := r.reserve(1, "frank", ""); res.Outcome != reservation.Ended {
		t.Errorf("purchase of an archived sale: %s", res.Outcome)
	}
	if n, err := r.store.Settle(ctx, 1, []reservation.Settlement{{OrderID: ended["alice"], Confirmed: true, Quantity: 1, UserID: "alice"}}); err != nil || n != 0 {
		t.Errorf("settle after archive: %d %v", n, err)
	}
	if got := r.pass(); len(got) != 1 || got[2] != NotDue {
		t.Errorf("second pass: %v", got)
	}
	if out, err := r.arc.Activity(ctx, 1, r.redisNow()); err != nil || out != Repaired {
		t.Errorf("archiving again: %v %v", out, err)
	}
	sale2, _, _ := r.store.Sale(ctx, 1)
	if sale2 != sale || len(r.keys()) != len(want) {
		t.Errorf("a repeat changed Redis: %+v → %+v, keys %v", sale, sale2, r.keys())
	}
}

func TestArchiveWaitsForPendingOrders(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	end := r.redisNow().Add(1500 * time.Millisecond)
	r.open(1, 5, 1, end)
	r.sell(1, "alice")
	// Reserved at the end of the window; its message is still queued when
	// the sale ends.
	late := r.reserve(1, "bob", "key-bob")
	if late.Outcome != reservation.Reserved {
		t.Fatalf("reserve: %s", late.Outcome)
	}
	r.waitPast(end)
	for range 2 {
		if got := r.pass(); got[1] != Pending {
			t.Fatalf("with an order pending: %v", got)
		}
	}
	if rec, found, _ := r.store.Order(context.Background(), 1, late.OrderID); !found || rec.State != reservation.Pending {
		t.Fatalf("the pending order's record is gone: %+v %v", rec, found)
	}
	// The script checks on its own too, not only the archiver before it.
	out, _, err := r.store.Archive(context.Background(), 1, reservation.ArchiveArgs{Gen: 0, Total: 5, Sold: 1, Grace: time.Millisecond, SummaryTTL: time.Hour})
	if err != nil || out != reservation.ArchivePending {
		t.Fatalf("script with an order pending: %v %v", out, err)
	}
	r.confirm(1, late.OrderID, "bob", "key-bob")
	if got := r.pass(); got[1] != Archived {
		t.Fatalf("once settled: %v", got)
	}
	var sold int64
	servicetest.Must(t, r.db.QueryRow(`SELECT sold FROM activities WHERE id = 1`).Scan(&sold), "sold")
	if sold != 2 {
		t.Errorf("MySQL sold %d, want 2", sold)
	}
}

func TestArchiveRefusesAnotherGeneration(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	end := r.redisNow().Add(1500 * time.Millisecond)
	r.open(1, 5, 1, end)
	r.sell(1, "alice")
	r.waitPast(end)

	// An admin change committed in MySQL whose Redis write has not happened
	// yet: the archiver must not archive what MySQL no longer describes.
	_, err := r.db.Exec(`UPDATE activities SET total_stock = 6, stock = 6 - sold, generation = generation + 1 WHERE id = 1`)
	servicetest.Must(t, err, "admin change in MySQL")
	if got := r.pass(); got[1] != Stale {
		t.Fatalf("MySQL ahead of Redis: %v", got)
	}
	// While the archiver holds the row lock, Redis moves to yet another
	// generation (a writer that did not wait for the lock): the script,
	// not the Go check before it, refuses.
	r.arc.cfg.Locked = func(id int64) {
		_, _, err := r.store.Warm(ctx, id, reservation.WarmArgs{Total: 6, Limit: 1, Start: end.Add(-time.Hour), End: end, Sold: 1, Gen: 2})
		servicetest.Must(t, err, "warm in the hook")
	}
	_, _, err = r.store.Warm(ctx, 1, reservation.WarmArgs{Total: 6, Limit: 1, Start: end.Add(-time.Hour), End: end, Sold: 1, Gen: 1})
	servicetest.Must(t, err, "warm")
	if got := r.pass(); got[1] != Stale {
		t.Fatalf("Redis moved under the lock: %v", got)
	}
	if r.archivedInMySQL(1) {
		t.Fatal("archived in MySQL although refused")
	}
	// Redis and MySQL agree again: archived, with the new total.
	r.arc.cfg.Locked = nil
	_, err = r.db.Exec(`UPDATE activities SET generation = 2 WHERE id = 1`)
	servicetest.Must(t, err, "catch up")
	if got := r.pass(); got[1] != Archived {
		t.Fatalf("in agreement: %v", got)
	}
	if s, _, _ := r.store.Sale(ctx, 1); s.Total != 6 || s.Gen != 2 {
		t.Errorf("summary %+v, want total 6 of generation 2", s)
	}
}

func TestArchiveRefusesDisagreement(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	end := r.redisNow().Add(1500 * time.Millisecond)
	r.open(1, 5, 1, end)
	r.sell(1, "alice")
	// MySQL sold one more than Redis knows (a commit whose settle is lost, and
	// its record with it).
	_, err := r.db.Exec(`UPDATE activities SET stock = stock - 1, sold = sold + 1 WHERE id = 1`)
	servicetest.Must(t, err, "drift")
	r.waitPast(end)
	if got := r.pass(); got[1] != Disagree {
		t.Fatalf("drifted sale: %v", got)
	}
	if r.archivedInMySQL(1) || len(r.keys()) < 3 {
		t.Error("a drifted sale was archived")
	}
}

// TestArchiveRacesAPurchase: a purchase attempt made while the archiver holds
// the row lock (the moment between its checks and its script) reserves
// nothing, as does one after; one made before the end keeps the sale live
// (TestArchiveWaitsForPendingOrders).
func TestArchiveRacesAPurchase(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	end := r.redisNow().Add(1500 * time.Millisecond)
	r.open(1, 5, 2, end)
	r.sell(1, "alice")
	r.waitPast(end)
	var during reservation.Outcome
	r.arc.cfg.Locked = func(id int64) { during = r.reserve(id, "bob", "key-bob").Outcome }
	if got := r.pass(); got[1] != Archived {
		t.Fatalf("pass: %v", got)
	}
	if during != reservation.Ended {
		t.Errorf("purchase during the archive: %s", during)
	}
	if got := r.keys(); len(got) != 1 || got[0] != "{act:1}:meta" {
		t.Errorf("keys: %v", got)
	}
}

// TestArchiveConcurrentArchivers: archivers that run at once (a lease handed
// over while the old holder still works) archive each sale exactly once and
// agree on the result; the row lock serialises them.
func TestArchiveConcurrentArchivers(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	end := r.redisNow().Add(1500 * time.Millisecond)
	const sales = 6
	for id := int64(1); id <= sales; id++ {
		r.open(id, 5, 1, end)
		r.sell(id, "alice", "bob")
	}
	r.waitPast(end)
	arcs := []*Archiver{r.arc,
		New(r.arc.cfg, r.rdb, r.store, r.db, slog.New(slog.NewTextHandler(io.Discard, nil)), nil),
		New(r.arc.cfg, r.rdb, r.store, r.db, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)}
	results := make([]map[int64]Outcome, len(arcs))
	errs := make([]error, len(arcs))
	var wg sync.WaitGroup
	for i, a := range arcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = a.Pass(context.Background())
		}()
	}
	wg.Wait()
	for id := int64(1); id <= sales; id++ {
		done := 0
		for i := range arcs {
			servicetest.Must(t, errs[i], "pass %d", i)
			switch results[i][id] {
			case Archived:
				done++
			case Repaired, "":
			default:
				t.Errorf("archiver %d, sale %d: %s", i, id, results[i][id])
			}
		}
		if done != 1 {
			t.Errorf("sale %d archived %d times", id, done)
		}
		if !r.archivedInMySQL(id) {
			t.Errorf("sale %d not archived in MySQL", id)
		}
	}
	if got := r.keys(); len(got) != sales {
		t.Errorf("keys left: %v", got)
	}
}
