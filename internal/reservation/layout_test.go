package reservation_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// A user's entry holds its count and its keys (lua/record.lua). Each script
// that changes the count keeps the keys: a key leaves the entry only when the
// backend's undo released its order; the recounts (sync, a warm after the
// meta hash was lost) and a restore of MySQL's orders keep every key, and a
// restore never points a key Redis knows at another order.
func TestUserEntryKeepsItsKeys(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 40
	warm(t, st, rdb, id, sale{total: 10, limit: 3, start: -time.Hour, end: time.Hour})
	k1 := reserve(t, st, id, "u", "k1", 1)
	k2 := reserve(t, st, id, "u", "k2", 1)
	k3 := reserve(t, st, id, "u", "k|3", 1) // any printable key, "|" too
	_, err := st.Settle(ctx, id, []reservation.Settlement{{OrderID: k1.OrderID, Confirmed: true, Quantity: 1, UserID: "u"}})
	servicetest.Must(t, err, "settle")
	out, err := st.Undo(ctx, id, k2.OrderID, "publish_failed", "u", "k2")
	servicetest.Must(t, err, "undo")
	if out != reservation.Released {
		t.Fatalf("undo = %s", out)
	}
	out, err = st.Release(ctx, id, k3.OrderID, "expired")
	servicetest.Must(t, err, "expire")
	if out != reservation.Released {
		t.Fatalf("expire = %s", out)
	}
	want := func(step string, held int64, keys map[string]string) {
		t.Helper()
		u, err := st.User(ctx, id, "u")
		servicetest.Must(t, err, "user")
		if u.Held != held || len(u.Keys) != len(keys) {
			t.Fatalf("%s: entry %+v, want %d held and keys %v", step, u, held, keys)
		}
		for k, oid := range keys {
			if u.Keys[k] != oid {
				t.Fatalf("%s: entry %+v, want keys %v", step, u, keys)
			}
		}
	}
	keys := map[string]string{"k1": k1.OrderID, "k|3": k3.OrderID}
	want("after settle, undo and expiry", 1, keys)

	// The reconciler's sync sets the count from MySQL; the keys stay.
	_, err = st.Sync(ctx, id, 10, 1, map[string]int64{"u": 1})
	servicetest.Must(t, err, "sync")
	want("after sync", 1, keys)
	// A warm after the meta hash was lost recounts too.
	servicetest.Must(t, rdb.Del(ctx, st.Keys(id).Meta).Err(), "lose meta")
	now := redisNow(t, rdb)
	_, _, err = st.Warm(ctx, id, reservation.WarmArgs{Total: 10, Limit: 3, Start: now.Add(-time.Hour), End: now.Add(time.Hour),
		Sold: 1, Users: map[string]int64{"u": 1}})
	servicetest.Must(t, err, "warm")
	want("after a rebuild of meta", 1, keys)

	// A restore adds the keys Redis does not know, also for a user without an
	// entry, and leaves the ones it knows alone.
	other, mysqlOnly := ordermsg.NewOrderID(id), ordermsg.NewOrderID(id)
	servicetest.Must(t, st.Restore(ctx, id, 10, []reservation.Decided{
		{OrderID: other, UserID: "u", IdempotencyKey: "k1", Quantity: 1, Confirmed: true},
		{OrderID: mysqlOnly, UserID: "v", IdempotencyKey: "kv", Quantity: 2, Reason: "sold_out"},
	}), "restore")
	want("after a restore", 1, keys)
	v, err := st.User(ctx, id, "v")
	servicetest.Must(t, err, "user v")
	if v.Held != 0 || v.Keys["kv"] != mysqlOnly {
		t.Errorf("v after the restore: %+v, want its key and nothing held", v)
	}
	if rec, found, _ := st.Order(ctx, id, mysqlOnly); !found || rec.State != reservation.Failed || rec.Reason != "sold_out" || rec.Quantity != 2 {
		t.Errorf("restored record %+v found=%v", rec, found)
	}
	for user, c := range map[string]struct {
		key, oid string
		state    reservation.State
	}{"u": {"k|3", k3.OrderID, reservation.Failed}, "v": {"kv", mysqlOnly, reservation.Failed}} {
		res := reserve(t, st, id, user, c.key, 1)
		if res.Outcome != reservation.Replay || res.OrderID != c.oid || res.State != c.state {
			t.Errorf("replay of %s's %s = %+v, want %s", user, c.key, res, c.oid)
		}
	}
	// The undone key is free again.
	again := reserve(t, st, id, "u", "k2", 1)
	if again.Outcome != reservation.Reserved || again.OrderID == k2.OrderID {
		t.Fatalf("k2 after its undo = %+v, want a new reservation", again)
	}
	want("after k2 reserved anew", 2, map[string]string{"k1": k1.OrderID, "k|3": k3.OrderID, "k2": again.OrderID})
}

func TestParseRecordAndUser(t *testing.T) {
	for raw, want := range map[string]reservation.Record{
		"P2|u|1700000000000|":  {State: reservation.Pending, Quantity: 2, UserID: "u", Deadline: time.UnixMilli(1700000000000).UTC()},
		"C1|u|1700000000000|q": {State: reservation.Claimed, Quantity: 1, UserID: "u", Deadline: time.UnixMilli(1700000000000).UTC(), Queued: true},
		"P1|u|1700000000000|a": {State: reservation.Pending, Quantity: 1, UserID: "u", Deadline: time.UnixMilli(1700000000000).UTC(), Adopted: true},
		"K3|user.1":            {State: reservation.Confirmed, Quantity: 3, UserID: "user.1"},
		"F0|u|publish_failed":  {State: reservation.Failed, Quantity: 0, UserID: "u", Reason: "publish_failed"},
	} {
		got, err := reservation.ParseRecord("o", raw)
		want.OrderID = "o"
		if err != nil || got != want {
			t.Errorf("ParseRecord(%q) = %+v %v, want %+v", raw, got, err, want)
		}
	}
	for _, raw := range []string{"", "K", "K|1|u||", "Kx|u", "X1|u", "P1|u", "P1|u|soon|", "K1|u|extra", "K-1|u"} {
		if rec, err := reservation.ParseRecord("o", raw); err == nil {
			t.Errorf("ParseRecord(%q) = %+v, want an error", raw, rec)
		}
	}
	u, err := reservation.ParseUser("2\nk1\t7-a\nk 2\t7-b")
	if err != nil || u.Held != 2 || len(u.Keys) != 2 || u.Keys["k1"] != "7-a" || u.Keys["k 2"] != "7-b" {
		t.Errorf("ParseUser = %+v %v", u, err)
	}
	for _, raw := range []string{"", "x", "1\nno-tab"} {
		if u, err := reservation.ParseUser(raw); err == nil || !strings.Contains(err.Error(), "user entry") {
			t.Errorf("ParseUser(%q) = %+v %v, want an error", raw, u, err)
		}
	}
}
