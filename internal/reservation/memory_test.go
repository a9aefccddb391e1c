package reservation_test

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// memOrders is the size of the measured sale; memUser and memKey the id
// lengths it is measured with (9-character user ids, 12-character keys).
const memOrders = 20_000

func memUser(i int) string { return fmt.Sprintf("u%08d", i) }
func memKey(i int) string  { return fmt.Sprintf("k-%010d", i) }

// usedBound is the aim of issue 16: the bytes of Redis used_memory a live
// sale holds per settled order (used_memory counts what MEMORY USAGE does
// not: allocator rounding, the key space's own entries). memBound bounds the
// same as MEMORY USAGE counts it.
const (
	usedBound = 200
	memBound  = 150
)

// TestLiveOrderMemory measures what a live sale holds in Redis per order, on
// a Redis of its own (INFO memory counts nothing else): 20,000 keyed orders,
// one per user, reserved, claimed and confirmed through the scripts. Each of
// the sale's keys is measured whole (MEMORY USAGE ... SAMPLES 0) while the
// orders are pending and once they are settled, beside used_memory; the
// buckets (lua/record.lua) are reported summed per kind. A settled order must
// cost at most usedBound bytes of used_memory and memBound in the sale's
// keys, and every bucket must still be a listpack under Redis's default
// hash-max-listpack-entries (128), whatever this Redis is configured with.
// `go test -run TestLiveOrderMemory -v ./internal/reservation` prints the figures.
func TestLiveOrderMemory(t *testing.T) {
	t.Parallel()
	srv := servicetest.PrivateRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	st := reservation.New(rdb, "mem:")
	const id = 7
	now, err := rdb.Time(ctx).Result()
	servicetest.Must(t, err, "time")
	_, _, err = st.Warm(ctx, id, reservation.WarmArgs{Total: memOrders, Limit: 1, Start: now.Add(-time.Minute), End: now.Add(time.Hour)})
	servicetest.Must(t, err, "warm")
	base := usedMemory(t, rdb)

	oids := make([]string, memOrders)
	for i := range oids {
		res, err := st.Reserve(ctx, reservation.Request{ActivityID: id, UserID: memUser(i), IdempotencyKey: memKey(i),
			Quantity: 1, OrderID: ordermsg.NewOrderID(id), TTL: time.Hour})
		servicetest.Must(t, err, "reserve %d", i)
		if res.Outcome != reservation.Reserved {
			t.Fatalf("reserve %d = %+v", i, res)
		}
		oids[i] = res.OrderID
	}
	pending := keyBytes(t, rdb, "mem:")
	pendingUsed := usedMemory(t, rdb) - base

	for from := 0; from < memOrders; from += 500 {
		batch := oids[from:min(from+500, memOrders)]
		_, err := st.Claim(ctx, id, batch)
		servicetest.Must(t, err, "claim")
		set := make([]reservation.Settlement, len(batch))
		for j, oid := range batch {
			set[j] = reservation.Settlement{OrderID: oid, Confirmed: true, Quantity: 1, UserID: memUser(from + j)}
		}
		_, err = st.Settle(ctx, id, set)
		servicetest.Must(t, err, "settle")
	}
	settled := keyBytes(t, rdb, "mem:")
	settledUsed := usedMemory(t, rdb) - base

	report := func(phase string, keys map[string]int64, used int64) (perOrder float64) {
		kinds, count := map[string]int64{}, map[string]int{}
		var sum int64
		for k, n := range keys {
			kind := bucketKind.ReplaceAllString(strings.TrimPrefix(k, "mem:"), ":$1:*")
			kinds[kind] += n
			count[kind]++
			sum += n
		}
		var names []string
		for k := range kinds {
			names = append(names, k)
		}
		sort.Strings(names)
		var b strings.Builder
		for _, k := range names {
			fmt.Fprintf(&b, " %s %.1f B", k, float64(kinds[k])/memOrders)
			if count[k] > 1 {
				fmt.Fprintf(&b, " (%d keys)", count[k])
			}
		}
		perOrder = float64(sum) / memOrders
		t.Logf("%s, per order:%s; sale keys %.1f B; used_memory %.1f B", phase, b.String(), perOrder, float64(used)/memOrders)
		return perOrder
	}
	report("pending", pending, pendingUsed)
	if per := report("settled", settled, settledUsed); per > memBound {
		t.Errorf("a settled order holds %.1f bytes in the sale's keys, want at most %d", per, memBound)
	}
	if per := float64(settledUsed) / memOrders; per > usedBound {
		t.Errorf("a settled order holds %.1f bytes of used_memory, want at most %d", per, usedBound)
	}
	// The buckets stay small: under the default listpack bound, so a Redis
	// configured as shipped keeps them compact too.
	n, err := st.Buckets(ctx, id)
	servicetest.Must(t, err, "buckets")
	for _, kind := range []byte{reservation.OrderBuckets, reservation.UserBuckets} {
		hashes := st.Keys(id).Hashes(kind, n)[1:]
		var most int64
		for _, h := range hashes {
			l, err := rdb.HLen(ctx, h).Result()
			servicetest.Must(t, err, "hlen %s", h)
			most = max(most, l)
			if enc := rdb.ObjectEncoding(ctx, h).Val(); enc != "listpack" {
				t.Errorf("%s is %s, want listpack", h, enc)
			}
		}
		if most > 128 {
			t.Errorf("a %c bucket holds %d entries, more than the default hash-max-listpack-entries", kind, most)
		}
		t.Logf("%d %c buckets, the fullest holds %d entries", len(hashes), kind, most)
	}

	// The layout still answers: a keyed replay finds its order, settled.
	res, err := st.Reserve(ctx, reservation.Request{ActivityID: id, UserID: memUser(42), IdempotencyKey: memKey(42),
		Quantity: 1, OrderID: ordermsg.NewOrderID(id), TTL: time.Hour})
	servicetest.Must(t, err, "replay")
	if res.Outcome != reservation.Replay || res.OrderID != oids[42] || res.State != reservation.Confirmed {
		t.Errorf("replay of order 42 = %+v, want %s confirmed", res, oids[42])
	}
}

// bucketKind matches a bucket's number in its key name.
var bucketKind = regexp.MustCompile(`:([ou]):[0-9]+$`)

func usedMemory(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	servicetest.Must(t, err, "info memory")
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			servicetest.Must(t, err, "used_memory %q", v)
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}

// keyBytes is MEMORY USAGE (every element counted) of each key under prefix.
func keyBytes(t *testing.T, rdb *redis.Client, prefix string) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	servicetest.Must(t, err, "keys")
	out := map[string]int64{}
	for _, k := range keys {
		n, err := rdb.MemoryUsage(ctx, k, 0).Result()
		servicetest.Must(t, err, "memory usage %s", k)
		out[k] = n
	}
	return out
}
