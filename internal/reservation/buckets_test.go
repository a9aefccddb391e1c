package reservation_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// The bucket count follows the stock at warm (a power of two, 64 units per
// bucket) and stays for the sale's life, whatever its stock becomes; Go's
// Keys.Order and Keys.User name the hash every script wrote to.
func TestBucketsSpreadAndAgreeWithTheScripts(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	for total, want := range map[int64]int64{1: 1, 64: 1, 65: 2, 1000: 16, 20000: 512, 65536: 1024, 65537: 1024, 5_000_000: 1024} {
		id := 100 + total
		warm(t, st, rdb, id, sale{total: total, limit: 3, start: -time.Hour, end: time.Hour})
		n, err := st.Buckets(ctx, id)
		servicetest.Must(t, err, "buckets")
		if n != want {
			t.Errorf("stock %d: %d buckets, want %d", total, n, want)
		}
	}
	const id = 2000 // 16 buckets
	warm(t, st, rdb, id, sale{total: 1000, limit: 3, start: -time.Hour, end: time.Hour})
	k := st.Keys(id)
	used := map[string]bool{}
	for i := range 200 {
		user := fmt.Sprintf("user-%d", i)
		r := reserve(t, st, id, user, fmt.Sprintf("key-%d", i), 1)
		if rec := rdb.HGet(ctx, k.Order(16, r.OrderID), r.OrderID).Val(); rec == "" {
			t.Fatalf("order %s is not in %s", r.OrderID, k.Order(16, r.OrderID))
		}
		if e := rdb.HGet(ctx, k.User(16, user), user).Val(); e == "" {
			t.Fatalf("user %s is not in %s", user, k.User(16, user))
		}
		used[k.Order(16, r.OrderID)], used[k.User(16, user)] = true, true
	}
	if len(used) != 32 {
		t.Errorf("200 orders used %d of the 32 hashes", len(used))
	}
	// More stock later: the count stays (records are where they were).
	_, _, err := st.Warm(ctx, id, reservation.WarmArgs{Total: 100000, Limit: 3, Start: time.Now().Add(-time.Hour), End: time.Now().Add(time.Hour)})
	servicetest.Must(t, err, "raise")
	if n, _ := st.Buckets(ctx, id); n != 16 {
		t.Errorf("%d buckets after the stock was raised, want 16 still", n)
	}
	// Go's hash is the scripts' (the first 8 hex digits of SHA-1: "" is
	// da39a3ee..., "a" 86f7e437...).
	for id, want := range map[string]int64{"": 0xda39a3ee % 1024, "a": 0x86f7e437 % 1024} {
		if got := reservation.Bucket(1024, id); got != want {
			t.Errorf("Bucket(1024, %q) = %d, want %d", id, got, want)
		}
	}
}

// A sale warmed before buckets (meta without "buckets", records in the
// single orders and users hashes) keeps working there while it runs; once
// its meta is lost the rebuild moves what survived into buckets.
func TestUnbucketedSaleRunsAndMovesIntoBucketsOnRebuild(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 41
	k := st.Keys(id)
	warm(t, st, rdb, id, sale{total: 1000, limit: 3, start: -time.Hour, end: time.Hour})
	servicetest.Must(t, rdb.HDel(ctx, k.Meta, "buckets").Err(), "as warmed before buckets")
	a := reserve(t, st, id, "alice", "ka", 1)
	b := reserve(t, st, id, "bob", "kb", 2)
	_, err := st.Settle(ctx, id, []reservation.Settlement{{OrderID: a.OrderID, Confirmed: true, Quantity: 1, UserID: "alice"}})
	servicetest.Must(t, err, "settle")
	if n := rdb.HLen(ctx, k.Base+"orders").Val(); n != 2 {
		t.Fatalf("the unbucketed sale's orders hash holds %d records, want 2", n)
	}
	if r := reserve(t, st, id, "alice", "ka", 1); r.Outcome != reservation.Replay || r.OrderID != a.OrderID || r.State != reservation.Confirmed {
		t.Errorf("replay on the unbucketed sale = %+v", r)
	}

	// The meta is lost; the rebuild (MySQL: alice holds 1) chooses buckets
	// and moves the records and the entries into them.
	servicetest.Must(t, rdb.Del(ctx, k.Meta).Err(), "lose meta")
	now := redisNow(t, rdb)
	out, _, err := st.Warm(ctx, id, reservation.WarmArgs{Total: 1000, Limit: 3, Start: now.Add(-time.Hour), End: now.Add(time.Hour),
		Sold: 1, Users: map[string]int64{"alice": 1}})
	servicetest.Must(t, err, "rebuild")
	if out != reservation.WarmCreated {
		t.Fatalf("rebuild = %s", out)
	}
	if n := rdb.Exists(ctx, k.Base+"orders", k.Base+"users").Val(); n != 0 {
		t.Errorf("%d unbucketed hashes left after the rebuild", n)
	}
	if s := meta(t, st, id); s.Pending != 2 || s.Sold != 1 {
		t.Errorf("rebuilt sale = %+v, want bob's 2 pending and alice's 1 sold", s)
	}
	for _, c := range []struct {
		user, key string
		r         reservation.Result
		state     reservation.State
	}{{"alice", "ka", a, reservation.Confirmed}, {"bob", "kb", b, reservation.Pending}} {
		if r := reserve(t, st, id, c.user, c.key, 1); r.Outcome != reservation.Replay || r.OrderID != c.r.OrderID || r.State != c.state {
			t.Errorf("replay of %s after the rebuild = %+v", c.user, r)
		}
	}
	if e, _ := st.User(ctx, id, "bob"); e.Held != 2 {
		t.Errorf("bob's entry after the rebuild = %+v", e)
	}
	if out, err := st.Release(ctx, id, b.OrderID, "expired"); err != nil || out != reservation.Released {
		t.Errorf("release of bob's order after the rebuild = %s %v", out, err)
	}
	if s := meta(t, st, id); s.Pending != 0 {
		t.Errorf("pending %d after the release", s.Pending)
	}
}

// The backend's undo of an order while the sale is not in Redis leaves its
// tombstone in the unbucketed hash; the rebuild moves it into its bucket, so
// the late reserve of that order id is still refused.
func TestTombstoneSurvivesTheRebuildOfALostSale(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 42
	warm(t, st, rdb, id, sale{total: 1000, limit: 3, start: -time.Hour, end: time.Hour})
	lose(t, st, rdb, id)
	oid := ordermsg.NewOrderID(id)
	out, err := st.Undo(ctx, id, oid, "publish_failed", "u", "k")
	servicetest.Must(t, err, "undo")
	if out != reservation.Released {
		t.Fatalf("undo with no sale = %s", out)
	}
	servicetest.Must(t, st.Restore(ctx, id, 1000, nil), "restore")
	warm(t, st, rdb, id, sale{total: 1000, limit: 3, start: -time.Hour, end: time.Hour})
	if n, _ := st.Buckets(ctx, id); n != 16 {
		t.Fatalf("rebuilt sale has %d buckets", n)
	}
	res, err := st.Reserve(ctx, reservation.Request{ActivityID: id, UserID: "u", IdempotencyKey: "k", Quantity: 1, OrderID: oid, TTL: ttl})
	servicetest.Must(t, err, "late reserve")
	if res.Outcome != reservation.Undone {
		t.Errorf("late reserve after the rebuild = %+v, want undone", res)
	}
	if s := meta(t, st, id); s.Pending != 0 {
		t.Errorf("pending %d", s.Pending)
	}
}

// A restore before the sale is built chooses the bucket count from MySQL's
// stock and the warm keeps it; a reopen after an archive (all buckets gone)
// chooses anew from the new stock.
func TestRestoreChoosesTheBucketsTheWarmKeeps(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 43
	oid := ordermsg.NewOrderID(id)
	servicetest.Must(t, st.Restore(ctx, id, 5000, []reservation.Decided{
		{OrderID: oid, UserID: "u", IdempotencyKey: "k", Quantity: 1, Confirmed: true}}), "restore")
	if n, _ := st.Buckets(ctx, id); n != 128 {
		t.Fatalf("restore chose %d buckets for 5000 units, want 128", n)
	}
	if _, found, _ := st.Sale(ctx, id); found {
		t.Fatal("a restore made the sale visible")
	}
	now := redisNow(t, rdb)
	a := reservation.WarmArgs{Total: 5000, Limit: 3, Start: now.Add(-time.Hour), End: now.Add(2 * time.Second), Sold: 1,
		Users: map[string]int64{"u": 1}}
	out, _, err := st.Warm(ctx, id, a)
	servicetest.Must(t, err, "warm")
	if n, _ := st.Buckets(ctx, id); out != reservation.WarmCreated || n != 128 {
		t.Fatalf("warm = %s with %d buckets", out, n)
	}
	if r := reserve(t, st, id, "u", "k", 1); r.Outcome != reservation.Replay || r.OrderID != oid || r.State != reservation.Confirmed {
		t.Errorf("replay of the restored order = %+v", r)
	}
	// Archive, then reopen with 100 units: 2 buckets.
	time.Sleep(time.Until(a.End.Add(100 * time.Millisecond)))
	arch, _, err := st.Archive(ctx, id, reservation.ArchiveArgs{Total: 5000, Sold: 1, Grace: time.Millisecond, SummaryTTL: time.Hour})
	servicetest.Must(t, err, "archive")
	if arch != reservation.ArchiveDone {
		t.Fatalf("archive = %s", arch)
	}
	k := st.Keys(id)
	left := append(k.Hashes(reservation.OrderBuckets, 128), k.Hashes(reservation.UserBuckets, 128)...)
	if n := rdb.Exists(ctx, append(left, k.Deadlines)...).Val(); n != 0 || rdb.Exists(ctx, k.Meta).Val() != 1 {
		t.Fatalf("after the archive %d of the sale's hashes are left (want 0, and the summary)", n)
	}
	servicetest.Must(t, st.Restore(ctx, id, 100, []reservation.Decided{
		{OrderID: oid, UserID: "u", IdempotencyKey: "k", Quantity: 1, Confirmed: true}}), "restore before the reopen")
	now = redisNow(t, rdb)
	a = reservation.WarmArgs{Total: 100, Limit: 3, Start: now.Add(-time.Hour), End: now.Add(time.Hour), Sold: 1,
		Users: map[string]int64{"u": 1}, Gen: 1}
	out, _, err = st.Warm(ctx, id, a)
	servicetest.Must(t, err, "reopen")
	if n, _ := st.Buckets(ctx, id); out != reservation.WarmCreated || n != 2 {
		t.Fatalf("reopen = %s with %d buckets, want 2", out, n)
	}
	if r := reserve(t, st, id, "u", "k", 1); r.Outcome != reservation.Replay || r.OrderID != oid {
		t.Errorf("replay after the reopen = %+v", r)
	}
}

// Reserve names its buckets from a cached count; a sale built anew with
// another count is answered "buckets" by reserve.lua, and the store calls
// again with the new count: nothing lands in a bucket of the old count.
func TestReserveFollowsANewBucketCount(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 44
	warm(t, st, rdb, id, sale{total: 1000, limit: 3, start: -time.Hour, end: time.Hour})
	reserve(t, st, id, "u", "", 1) // caches 16
	lose(t, st, rdb, id)
	warm(t, st, rdb, id, sale{total: 50000, limit: 3, start: -time.Hour, end: time.Hour})
	k := st.Keys(id)
	for i := range 50 {
		user := fmt.Sprintf("v%d", i)
		r := reserve(t, st, id, user, "", 1)
		if rdb.HGet(ctx, k.Order(1024, r.OrderID), r.OrderID).Val() == "" || rdb.HGet(ctx, k.User(1024, user), user).Val() != "1" {
			t.Fatalf("order %d of the rebuilt sale is not in its buckets of 1024", i)
		}
	}
	if s := meta(t, st, id); s.Pending != 50 {
		t.Errorf("pending %d, want 50", s.Pending)
	}
}
