package reconcile

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/redisnodes"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/saletest"
	"github.com/seckill/seckill/internal/servicetest"
)

// TestShardedSaleLostShardsRebuiltAndSynced: a sale of 40 units in 8
// shards loses two shards (a master died unsynced) with confirmed orders on
// them; a reconcile pass rebuilds them from MySQL (their users' units by
// home shard), a forced one makes the counters exact and the shard totals
// add up to the stock, and what is left sells to the last unit.
func TestShardedSaleLostShardsRebuiltAndSynced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sr := saletest.New(t)
	rec := New(sr.DB, sr.Store, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, 5*time.Second)
	const id, shards, stock = 43, 8, 40
	now := time.Now()
	sr.OpenSharded(t, id, stock, 1, shards, now.Add(-time.Hour), now.Add(time.Hour))
	buy := func(user string) reservation.Result {
		t.Helper()
		home, err := sr.Store.Home(ctx, id, user)
		servicetest.Must(t, err, "home")
		r, err := sr.Store.Reserve(ctx, reservation.Request{ActivityID: id, UserID: user, Quantity: 1,
			OrderID: ordermsg.NewShardOrderID(id, home.Shard, home.Shards), TTL: time.Minute, Keys: home})
		servicetest.Must(t, err, "reserve")
		return r
	}
	// 16 confirmed and settled, over the shards.
	for i := 0; i < 16; i++ {
		u := fmt.Sprintf("early%d", i)
		r := buy(u)
		if r.Outcome != reservation.Reserved {
			t.Fatalf("buy %s: %+v", u, r)
		}
		sr.Commit(t, id, r.OrderID, u, "", 1)
		_, err := sr.Store.Settle(ctx, id, []reservation.Settlement{{OrderID: r.OrderID, Confirmed: true, Quantity: 1, UserID: u}})
		servicetest.Must(t, err, "settle")
	}
	for _, k := range []int{2, 5} {
		keys, err := redisnodes.Scan(ctx, sr.Redis, sr.Store.ShardKeys(id, k, shards).Base+"*")
		servicetest.Must(t, err, "scan shard %d", k)
		servicetest.Must(t, sr.Redis.Del(ctx, keys...).Err(), "lose shard %d", k)
	}
	reps, err := rec.Pass(ctx, false)
	servicetest.Must(t, err, "pass")
	if len(reps) != 1 || !reps[0].RedisFound {
		t.Fatalf("reports = %+v", reps)
	}
	if _, err := rec.Pass(ctx, true); err != nil {
		t.Fatal(err)
	}
	s, found, err := sr.Store.Sale(ctx, id)
	servicetest.Must(t, err, "sale")
	if !found || s.Total != stock || s.Sold != 16 || s.Pending != 0 {
		t.Errorf("after the passes: %+v found=%v, want 16 of 40 sold", s, found)
	}
	if sum, ok, err := sr.Store.Allotted(ctx, id); err != nil || !ok || sum != stock {
		t.Errorf("shard totals add up to %d (%v %v), want %d", sum, ok, err, stock)
	}
	// Each user's units are on the user's home shard: the limit still holds.
	if r := buy("early3"); r.Outcome != reservation.LimitExceeded {
		t.Errorf("early3 again = %+v, want limit_exceeded", r)
	}
	// The recovery the rebuild began (orders of the lost shards may be in
	// the queue) ends with its marker; then the rest sells, no false sold out.
	if tok, _ := sr.Store.Recovery(ctx, id); tok != "" {
		if _, err := sr.Store.EndRecovery(ctx, id, tok); err != nil {
			t.Fatal(err)
		}
	}
	sold := 0
	for i := 0; ; i++ {
		r := buy(fmt.Sprintf("late%d", i))
		if r.Outcome == reservation.SoldOut {
			break
		}
		if r.Outcome != reservation.Reserved {
			t.Fatalf("late buy: %+v", r)
		}
		sold++
	}
	if sold != stock-16 {
		t.Errorf("sold %d after the repair, want %d", sold, stock-16)
	}
}
