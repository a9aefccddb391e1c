package sweep

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// TestSweepShardedSale: the overdue reservations of a sale in 4 stock shards
// sit in four deadline indexes; one sweep expires every one of them, each
// released on its own shard, and every unit is sellable again.
func TestSweepShardedSale(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const act, shards = 17, 4
	now := time.Now()
	r.sr.OpenSharded(t, act, 8, 1, shards, now.Add(-time.Hour), now.Add(time.Hour))
	seen := map[int]bool{}
	for i := 0; i < 8; i++ {
		u := fmt.Sprintf("u%d", i)
		home, err := r.store.Home(ctx, act, u)
		servicetest.Must(t, err, "home")
		res, err := r.store.Reserve(ctx, reservation.Request{ActivityID: act, UserID: u, Quantity: 1,
			OrderID: ordermsg.NewShardOrderID(act, home.Shard, home.Shards), TTL: time.Millisecond, Keys: home})
		servicetest.Must(t, err, "reserve")
		if res.Outcome != reservation.Reserved {
			t.Fatalf("reserve %s: %+v", u, res)
		}
		seen[home.Shard] = true
	}
	if len(seen) < 3 {
		t.Fatalf("buyers on %d shards only", len(seen))
	}
	time.Sleep(5 * time.Millisecond)
	st, err := r.sweeper(time.Millisecond).Sweep(ctx)
	servicetest.Must(t, err, "sweep")
	if st.Expired != 8 {
		t.Errorf("sweep stats = %+v, want 8 expired", st)
	}
	s, _, err := r.store.Sale(ctx, act)
	servicetest.Must(t, err, "sale")
	if s.Pending != 0 || s.Available() != 8 {
		t.Errorf("after the sweep: %+v", s)
	}
	if open, err := r.store.Open(ctx, act, 100); err != nil || len(open) != 0 {
		t.Errorf("open after the sweep: %d %v", len(open), err)
	}
}
