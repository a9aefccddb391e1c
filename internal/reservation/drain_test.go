package reservation_test

import (
	"context"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// The rules of lua/pass.lua, one by one: a pass needs a live entry; a copy
// of another round is stale; the marker is done only once every live
// consumer of every partition passed in its partition's current round and
// every registry is old enough; a consumer that leaves (dropped, or
// expired) starts a new round, in which the earlier passes do not count.
func TestPassMarkerRounds(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	queues := []string{"q0", "q1"}
	a, b, c := reservation.Consumer{Queue: "q0", ID: "a"}, reservation.Consumer{Queue: "q0", ID: "b"}, reservation.Consumer{Queue: "q1", ID: "c"}
	rounds, err := st.RegisterConsumers(ctx, time.Minute, []reservation.Consumer{a, b, c})
	servicetest.Must(t, err, "register")
	copyOf := func(who reservation.Consumer, partition int, round, copy string, minAge time.Duration) reservation.PassResult {
		t.Helper()
		r, err := st.PassMarker(ctx, reservation.MarkerPass{ActivityID: 7, Token: "tok", Queues: queues, Partition: partition,
			Consumer: who.ID, Round: round, Copy: copy, NewCopy: copy, MinAge: minAge, TTL: time.Minute, Takeover: time.Minute})
		servicetest.Must(t, err, "pass")
		return r
	}
	// pass passes the copy "c" of each partition, the one elected.
	pass := func(who reservation.Consumer, partition int, round string, minAge time.Duration) reservation.PassResult {
		t.Helper()
		return copyOf(who, partition, round, "c", minAge)
	}
	want := func(got reservation.PassResult, outcome reservation.PassOutcome, again bool) {
		t.Helper()
		if got.Outcome != outcome || got.Again != again {
			t.Errorf("pass = %+v, want %s again=%v", got, outcome, again)
		}
	}
	if _, err := st.PassMarker(ctx, reservation.MarkerPass{ActivityID: 7, Token: "tok", Queues: queues, Partition: 2,
		Consumer: "a", NewCopy: "c", TTL: time.Minute}); err == nil {
		t.Error("a pass for partition 2 of 2 was accepted")
	}
	if _, err := st.PassMarker(ctx, reservation.MarkerPass{ActivityID: 7, Token: "tok", Queues: queues, Partition: 0}); err == nil {
		t.Error("a pass without a consumer id was accepted")
	}
	if r := pass(reservation.Consumer{ID: "nobody"}, 0, rounds[0], 0); r.Outcome != reservation.PassUnregistered {
		t.Errorf("pass of an unregistered consumer = %+v", r)
	}
	r := pass(a, 0, "", 0) // the backend's copy
	if r.Outcome != reservation.PassStale || r.Round != rounds[0] {
		t.Fatalf("pass of the backend's copy = %+v, want stale with round %q", r, rounds[0])
	}
	want(pass(a, 0, rounds[0], 0), reservation.PassWaiting, false)
	want(pass(a, 0, rounds[0], 0), reservation.PassWaiting, true)
	// A second copy of the marker in partition 0 goes no further.
	if r := copyOf(a, 0, rounds[0], "other", 0); r.Outcome != reservation.PassDrop {
		t.Errorf("pass of a second copy = %+v, want drop", r)
	}
	want(pass(b, 0, rounds[0], 0), reservation.PassWaiting, false)         // partition 1 has not passed
	want(pass(c, 1, rounds[2], time.Hour), reservation.PassWaiting, false) // registries too young
	want(pass(c, 1, rounds[2], 0), reservation.PassDone, false)

	// b leaves: partition 0 starts a new round, with a the only one left to
	// pass it; a's copy of the old round no longer counts.
	now, err := st.RegisterConsumers(ctx, 0, []reservation.Consumer{b})
	servicetest.Must(t, err, "drop b")
	if now[0] == rounds[0] {
		t.Fatalf("round %q unchanged after a consumer left", now[0])
	}
	if r := pass(c, 1, rounds[2], 0); r.Outcome != reservation.PassWaiting {
		t.Errorf("pass after partition 0 lost a consumer = %+v, want waiting for partition 0's new round", r)
	}
	if r := pass(a, 0, rounds[0], 0); r.Outcome != reservation.PassStale || r.Round != now[0] {
		t.Errorf("pass of a copy of the old round = %+v, want stale with %q", r, now[0])
	}
	want(pass(a, 0, now[0], 0), reservation.PassDone, false)

	// c's entry expires: partition 1 starts a new round, with nobody left
	// to pass it.
	_, err = st.RegisterConsumers(ctx, time.Millisecond, []reservation.Consumer{c})
	servicetest.Must(t, err, "short entry")
	time.Sleep(20 * time.Millisecond)
	want(pass(a, 0, now[0], 0), reservation.PassWaiting, true)

	// The elected copy ("c") unseen for the takeover time gives way to
	// another, which goes on from then.
	time.Sleep(5 * time.Millisecond)
	r, err = st.PassMarker(ctx, reservation.MarkerPass{ActivityID: 7, Token: "tok", Queues: queues, Partition: 0,
		Consumer: "a", Round: now[0], Copy: "", NewCopy: "late", TTL: time.Minute, Takeover: time.Millisecond})
	servicetest.Must(t, err, "pass")
	if r.Outcome != reservation.PassWaiting || r.Copy != "late" {
		t.Errorf("pass of a copy after the takeover time = %+v, want it elected as \"late\"", r)
	}
	if r := pass(a, 0, now[0], 0); r.Outcome != reservation.PassDrop {
		t.Errorf("pass of the copy it took over from = %+v, want drop", r)
	}
}

// Requeue writes a lost record back counted (queued, pending, the user's
// units, its key) and changes nothing when Redis knows the order, has no
// sale, or the arguments are bad; a settle then moves it as any other.
func TestRequeue(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	lost := reservation.Decided{OrderID: ordermsg.NewOrderID(8), UserID: "u", IdempotencyKey: "k", Quantity: 2}
	if ok, err := st.Requeue(ctx, 8, lost, deadline); err != nil || ok {
		t.Fatalf("requeue without a sale = %v %v, want nothing written", ok, err)
	}
	warm(t, st, rdb, 8, open)
	if _, err := st.Requeue(ctx, 8, reservation.Decided{OrderID: lost.OrderID, UserID: "u"}, deadline); err == nil {
		t.Error("requeue of quantity 0 accepted")
	}
	if ok, err := st.Requeue(ctx, 8, lost, deadline); err != nil || !ok {
		t.Fatalf("requeue = %v %v", ok, err)
	}
	if ok, err := st.Requeue(ctx, 8, lost, deadline); err != nil || ok {
		t.Errorf("second requeue = %v %v, want nothing written", ok, err)
	}
	if s := meta(t, st, 8); s.Pending != 2 {
		t.Errorf("pending %d after the requeue, want 2", s.Pending)
	}
	if r := reserve(t, st, 8, "u", "k", 2); r.Outcome != reservation.Replay || r.OrderID != lost.OrderID {
		t.Errorf("keyed retry = %s %s, want a replay of %s", r.Outcome, r.OrderID, lost.OrderID)
	}
	n, err := st.Settle(ctx, 8, []reservation.Settlement{{OrderID: lost.OrderID, Confirmed: true, Quantity: 2, UserID: "u"}})
	if err != nil || n != 1 {
		t.Fatalf("settle = %d %v", n, err)
	}
	if s := meta(t, st, 8); s.Pending != 0 || s.Sold != 2 {
		t.Errorf("sale %+v after the settle, want sold 2, pending 0", s)
	}
}

// In a sale of stock shards a requeued record goes to the shard its order id
// names (the user's home shard): that shard counts it, and a keyed retry on
// it replays the order.
func TestRequeueShard(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id, shards = 9, 4
	warmShards(t, st, rdb, id, 40, 2, shards)
	u := usersOn(3, shards, 1, "rq")[0]
	lost := reservation.Decided{OrderID: ordermsg.NewShardOrderID(id, 3, shards), UserID: u, IdempotencyKey: "k", Quantity: 2}
	if ok, err := st.Requeue(ctx, id, lost, time.Now().Add(time.Minute)); err != nil || !ok {
		t.Fatalf("requeue = %v %v", ok, err)
	}
	for k := 0; k < shards; k++ {
		p, err := rdb.HGet(ctx, st.ShardKeys(id, k, shards).Meta, "pending").Int64()
		servicetest.Must(t, err, "pending of shard %d", k)
		if want := map[bool]int64{true: 2, false: 0}[k == 3]; p != want {
			t.Errorf("shard %d pending %d, want %d", k, p, want)
		}
	}
	if r, err := buy(ctx, st, id, u, "k", 2); err != nil || r.Outcome != reservation.Replay || r.OrderID != lost.OrderID {
		t.Errorf("keyed retry = %+v %v, want a replay of %s", r, err, lost.OrderID)
	}
}
