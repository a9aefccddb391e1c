package reservation_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/internal/soldout"
)

func heldKeys(t *testing.T, st *reservation.Store, id int64, most int) reservation.Held {
	t.Helper()
	h, err := st.HeldKeys(context.Background(), id, most)
	servicetest.Must(t, err, "held keys")
	slices.SortFunc(h.Pairs, func(a, b reservation.KeyPair) int {
		return cmp.Or(strings.Compare(a.User, b.User), strings.Compare(a.Key, b.Key))
	})
	return h
}

// The keys of a sold-out sale are every key that holds an order, pending,
// confirmed or failed; while units are left, none are read.
func TestHeldKeys(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	const id = 31
	if h := heldKeys(t, st, id, 100); h.Outcome != reservation.HeldNotFound {
		t.Fatalf("missing sale: %+v", h)
	}
	warm(t, st, rdb, id, sale{total: 4, limit: 2, start: -time.Hour, end: time.Hour})
	a1 := reserve(t, st, id, "alice", "k1", 1)
	reserve(t, st, id, "alice", "k2", 1)
	reserve(t, st, id, "bob", "", 1) // no key: nothing to hold
	if h := heldKeys(t, st, id, 100); h.Outcome != reservation.HeldOpen || len(h.Pairs) != 0 {
		t.Fatalf("sale with a unit left: %+v", h)
	}
	carol := reserve(t, st, id, "carol", "k1", 1)
	if carol.Outcome != reservation.Reserved {
		t.Fatalf("last unit: %+v", carol)
	}
	want := []reservation.KeyPair{{"alice", "k1"}, {"alice", "k2"}, {"carol", "k1"}}
	if h := heldKeys(t, st, id, 100); h.Outcome != reservation.HeldSoldOut || !slices.Equal(h.Pairs, want) {
		t.Fatalf("sold out: %+v, want %v", h, want)
	}
	if h := heldKeys(t, st, id, 2); h.Outcome != reservation.HeldTooMany {
		t.Errorf("3 keys, most 2: %+v", h)
	}
	// A failed order keeps its key, but its unit comes back: open again.
	out, err := st.Release(context.Background(), id, a1.OrderID, "expired")
	servicetest.Must(t, err, "release")
	if out != reservation.Released {
		t.Fatalf("release = %s", out)
	}
	if h := heldKeys(t, st, id, 100); h.Outcome != reservation.HeldOpen {
		t.Fatalf("after a release: %+v", h)
	}
	reserve(t, st, id, "dave", "d", 1)
	want = []reservation.KeyPair{{"alice", "k1"}, {"alice", "k2"}, {"carol", "k1"}, {"dave", "d"}}
	if h := heldKeys(t, st, id, 100); h.Outcome != reservation.HeldSoldOut || !slices.Equal(h.Pairs, want) {
		t.Fatalf("sold out again: %+v, want %v", h, want)
	}
	// A sale recovering from a Redis loss: keys MySQL knows may be missing.
	servicetest.Must(t, rdb.Set(context.Background(), st.Keys(id).Recovering, "tok", time.Minute).Err(), "mark recovering")
	if h := heldKeys(t, st, id, 100); h.Outcome != reservation.HeldRecovering {
		t.Errorf("recovering: %+v", h)
	}
}

// AnnounceSoldOut publishes the v2 event the proxies read keys on.
func TestAnnounceSoldOut(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	sub := rdb.Subscribe(ctx, reservation.Channel(prefix))
	defer sub.Close()
	_, err := sub.Receive(ctx) // the subscription confirmation
	servicetest.Must(t, err, "subscribe")
	servicetest.Must(t, st.AnnounceSoldOut(ctx, 77), "announce")
	msg, err := sub.ReceiveMessage(ctx)
	servicetest.Must(t, err, "receive")
	if ev, known, err := soldout.ParseEvent(msg.Payload); err != nil || !known || ev.ActivityID != 77 || ev.Kind != soldout.KindSoldOut {
		t.Errorf("event %q = %+v %v %v", msg.Payload, ev, known, err)
	}
}

// A sale of many buckets is read a page of them per call; every key comes
// back once, and the bound counts across the pages.
func TestHeldKeysPages(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	const id, n = 32, 1500 // 32 buckets: three pages
	warm(t, st, rdb, id, sale{total: n, limit: 1, start: -time.Hour, end: time.Hour})
	if b, err := st.Buckets(context.Background(), id); err != nil || b != 32 {
		t.Fatalf("buckets = %d %v, want 32", b, err)
	}
	for i := range n {
		if r := reserve(t, st, id, fmt.Sprint("user-", i), fmt.Sprint("key-", i), 1); r.Outcome != reservation.Reserved {
			t.Fatalf("reserve %d: %+v", i, r)
		}
	}
	h := heldKeys(t, st, id, n)
	seen := map[reservation.KeyPair]bool{}
	for _, p := range h.Pairs {
		seen[p] = true
	}
	if h.Outcome != reservation.HeldSoldOut || len(h.Pairs) != n || len(seen) != n || !seen[reservation.KeyPair{User: "user-1499", Key: "key-1499"}] {
		t.Fatalf("held keys: %s, %d pairs, %d distinct; want %d", h.Outcome, len(h.Pairs), len(seen), n)
	}
	if h := heldKeys(t, st, id, n-1); h.Outcome != reservation.HeldTooMany {
		t.Errorf("%d keys, most %d: %s", n, n-1, h.Outcome)
	}
}
