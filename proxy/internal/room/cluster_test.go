package room

import (
	"context"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// The room's scripts and calls on a Redis Cluster of the test's own: every
// key of a room shares one hash tag, so arrivals, steps, the admission
// check and the finish (one MULTI) run there unchanged (no CROSSSLOT), for
// two rooms whose keys hash to different nodes.
func TestRoomOnCluster(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.RedisAt(t, servicetest.Cluster(t, 27300))
	key := writeKey(t, t.TempDir(), "k", keyA)
	rs := []conf.Rule{{Name: "buy", PathPrefix: "/api/v1/activities/",
		WaitingRoom: &conf.WaitingRoom{KeyFile: key, AdmitPerSecond: 1000, MaxActive: 100, Session: conf.D(time.Minute),
			PollInterval: conf.D(time.Second), PlaceTTL: conf.D(10 * time.Second), OnRedisError: "closed"}}}
	store := reservation.New(rdb, prefix)
	m, err := New(rs, Options{Redis: rdb, KeyPrefix: prefix, Stock: store})
	servicetest.Must(t, err, "rooms")
	ctx := context.Background()
	for _, act := range []int64{1, 2} {
		now := time.Now().UnixMilli()
		servicetest.Must(t, rdb.HSet(ctx, reservation.KeysFor(prefix, act).Meta, "total", 10, "sold", 0, "pending", 0,
			"start", now-1000, "end", now+3_600_000).Err(), "sale")
	}
	path := func(act int64) []byte { return []byte("/api/v1/activities/" + string(rune('0'+act)) + "/purchase") }
	enter := func(act int64, id string, ticket string) Result {
		return m.Enter(Request{Method: []byte("POST"), Path: path(act), Identity: id, Ticket: []byte(ticket), Purchase: true, Now: time.Now()})
	}
	for _, act := range []int64{1, 2} {
		a := enter(act, "a:1", "")
		b := enter(act, "a:2", "")
		if a.Answer != Waiting || a.Place != 1 || b.Place != 2 {
			t.Fatalf("room %d: arrivals %+v %+v", act, a, b)
		}
		m.Step(ctx)
		time.Sleep(20 * time.Millisecond)
		m.Step(ctx)
		got := enter(act, "a:1", a.Ticket)
		if got.Answer != Admitted || got.Ticket == "" {
			t.Fatalf("room %d: after two steps a is %+v, want admitted", act, got)
		}
		// Its admission ticket on a purchase: checked in Redis, then spent.
		if r := enter(act, "a:1", got.Ticket); r.Answer != Admitted {
			t.Fatalf("room %d: purchase with the admission: %+v", act, r)
		}
		m.Finish(got.Room, "a:1", true)
		if r := enter(act, "a:1", got.Ticket); r.Answer != Waiting || r.Place != 3 {
			t.Errorf("room %d: a spent admission: %+v, want a new place (3) at the back", act, r)
		}
		bought, err := rdb.HGet(ctx, got.Room.keys[0], "bought").Int()
		if err != nil || bought != 1 {
			t.Errorf("room %d: bought %d %v", act, bought, err)
		}
		if got.Room.degraded.Load() {
			t.Errorf("room %d degraded on the cluster", act)
		}
	}
	if reservation.Slot(prefix+"{room:buy:1}:meta") == reservation.Slot(prefix+"{room:buy:2}:meta") {
		t.Log("both rooms hash to one slot with this prefix")
	}
}
