package archive

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// TestArchiveShardedSale: an ended sale of 4 shards, sold on every shard
// (units moved between them), is archived shard by shard: each leaves its
// summary only, the view still sums them, and teardown finds nothing else.
func TestArchiveShardedSale(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const id, shards = 5, 4
	end := r.redisNow().Add(1500 * time.Millisecond)
	r.sr.OpenSharded(t, id, 12, 1, shards, time.Now().Add(-time.Hour), end)
	sold := 0
	for i := 0; sold < 12; i++ {
		u := fmt.Sprintf("u%d", i)
		home, err := r.store.Home(ctx, id, u)
		servicetest.Must(t, err, "home")
		// Buyers of shards 0 and 1 only: the others' units move to them.
		if home.Shard > 1 {
			continue
		}
		res, err := r.store.Reserve(ctx, reservation.Request{ActivityID: id, UserID: u, Quantity: 1,
			OrderID: ordermsg.NewShardOrderID(id, home.Shard, home.Shards), TTL: time.Minute, Keys: home})
		servicetest.Must(t, err, "reserve")
		if res.Outcome != reservation.Reserved {
			t.Fatalf("reserve %s: %+v", u, res)
		}
		r.confirm(id, res.OrderID, u, "")
		sold++
	}
	r.waitPast(end)
	if got := r.pass(); got[id] != Archived {
		t.Fatalf("pass: %v", got)
	}
	want := []string{"{act:5}:meta"}
	for k := 1; k < shards; k++ {
		want = append(want, "{"+reservation.ShardTag(id, k, shards)+"}:meta")
	}
	sort.Strings(want)
	if got := r.keys(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("keys after archiving:\n got %v\nwant %v", got, want)
	}
	s, found, err := r.store.Sale(ctx, id)
	servicetest.Must(t, err, "sale")
	if !found || !s.Archived || s.Total != 12 || s.Sold != 12 {
		t.Errorf("summary = %+v found=%v", s, found)
	}
	if !r.archivedInMySQL(id) {
		t.Error("not archived in MySQL")
	}
}
