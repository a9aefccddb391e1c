package chaos

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
	"github.com/seckill/seckill/internal/servicetest"
)

// Redis (a redis-server of the test's own) loses a sale while its 202
// orders wait in the queue and the workers are away five times longer than
// the old recovery timer (reservation_ttl + republish_after: 4 s in the fast
// config). Until the workers have drained the orders queued before the
// loss, a retry of each key gets 503 — never a second order id — and
// nothing new is sold (unkeyed purchases get 503); once they did, every key
// gets its own order again, the sale goes on, and the verdict (I1–I5, the
// ledger) holds.
func TestRedisLossWhileWorkersAway(t *testing.T) {
	local(t)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 2, NoStartWorkers: true,
		RedisURL: servicetest.StartRedis(t, 23400), Config: stack.Fast("")})
	s.RedisLost = true
	sale := s.CreateSale(t, saleID(), 100, 1)
	c := stack.NewCrowd(sale, 40, 1, "lossaway")
	c.Resend = 0
	c.Run(s, s.Backends)
	first := map[string]string{}
	for _, a := range c.Attempts {
		if a.Status != http.StatusAccepted {
			t.Fatalf("%s before the loss: %v", a.User, a.Answers)
		}
		first[a.User+":"+a.Key] = a.OrderID
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	servicetest.Must(t, s.Redis.FlushDB(ctx).Err(), "FLUSHDB")
	cancel()

	retry := func(tag string) []*stack.Attempt {
		var out []*stack.Attempt
		for _, a := range c.Attempts[:40] {
			out = append(out, &stack.Attempt{User: a.User, Key: a.Key, Qty: a.Qty})
		}
		for i := range 10 {
			out = append(out, &stack.Attempt{User: "lossaway-new-" + tag + string(rune('a'+i)), Qty: 1})
		}
		rc := &stack.Crowd{Sale: sale, Attempts: out, Workers: 8}
		rc.Run(s, s.Backends)
		c.Attempts = append(c.Attempts, rc.Attempts...)
		return rc.Attempts
	}
	deadline := time.Now().Add(20 * time.Second) // 5× the old window
	for round := 0; time.Now().Before(deadline); round++ {
		for _, a := range retry("r" + string(rune('0'+round%10))) {
			switch {
			case a.Status == http.StatusServiceUnavailable:
			case a.Key != "" && a.Status == http.StatusAccepted && a.OrderID == first[a.User+":"+a.Key]:
				// its own order: never wrong (MySQL cannot know it yet, though)
			default:
				t.Errorf("%s key %q while the sale recovers and the workers are away: %v (order %s, first %s)",
					a.User, a.Key, a.Answers, a.OrderID, first[a.User+":"+a.Key])
			}
		}
		time.Sleep(2 * time.Second)
	}
	s.StartWorkers(t)
	// A key whose order MySQL holds is answered while the sale still
	// recovers: the end is the recovering mark's (the drain marker passed
	// every consumer of every partition, the counters synced from MySQL).
	recovering := reservation.KeysFor(s.Prefix, sale.ID).Recovering
	stack.WaitFor(t, "the recovery to end", time.Minute, func() bool {
		probe := &stack.Attempt{User: c.Attempts[0].User, Key: c.Attempts[0].Key, Qty: 1}
		(&stack.Crowd{Sale: sale, Attempts: []*stack.Attempt{probe}}).Run(s, s.Backends)
		c.Attempts = append(c.Attempts, probe)
		n, err := s.Redis.Exists(context.Background(), recovering).Result()
		return probe.Status == http.StatusAccepted && err == nil && n == 0
	})
	for _, a := range retry("after") {
		if a.Key != "" && (a.Status != http.StatusAccepted || a.OrderID != first[a.User+":"+a.Key]) {
			t.Errorf("%s after the drain: %v order %s, want its first order %s", a.User, a.Answers, a.OrderID, first[a.User+":"+a.Key])
		}
		if a.Key == "" && a.Status != http.StatusAccepted {
			t.Errorf("%s (new) after the drain: %v", a.User, a.Answers)
		}
	}
	s.Finish(t, "redis loss with the workers away", sale, c)
}

// A sale in 3 stock shards loses Redis (FLUSHDB of a redis-server of the
// test's own) while the 202 orders of buyers homed on every shard wait in
// the queue. While the workers are away every shard stays recovering (a
// keyed retry gets 503 or its own order, an unkeyed purchase 503); once
// they drained the queue the recovery ends on every shard, shard 0 last,
// with each shard's sold, pending and users equal to MySQL's (its users'
// confirmed units by home shard) and the shard totals adding up to the
// stock; then every key gets its own order and the verdict holds.
func TestRedisLossShardedSaleRecovers(t *testing.T) {
	local(t)
	const shards, perShard = 3, 8
	cfg := strings.Replace(stack.Fast(""), "[backend]\n", fmt.Sprintf("[backend]\nstock_shards = %d\n", shards), 1)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 2, NoStartWorkers: true,
		RedisURL: servicetest.StartRedis(t, 23420), Config: cfg})
	s.RedisLost = true
	sale := s.CreateSale(t, saleID(), 90, 1)
	c := &stack.Crowd{Sale: sale, Workers: 8}
	homed := make([]int, shards)
	for i := 0; len(c.Attempts) < shards*perShard; i++ {
		u := fmt.Sprintf("lossshard-%d", i)
		if k := reservation.HomeShard(u, shards); homed[k] < perShard {
			homed[k]++
			c.Attempts = append(c.Attempts, &stack.Attempt{User: u, Key: u + "-k", Qty: 1})
		}
	}
	c.Run(s, s.Backends)
	first := map[string]string{}
	for _, a := range c.Attempts {
		if a.Status != http.StatusAccepted {
			t.Fatalf("%s before the loss: %v", a.User, a.Answers)
		}
		first[a.User] = a.OrderID
	}
	ctx := context.Background()
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	servicetest.Must(t, s.Redis.FlushDB(fctx).Err(), "FLUSHDB")
	cancel()

	retry := func(tag string) []*stack.Attempt {
		var out []*stack.Attempt
		for _, a := range c.Attempts[:shards*perShard] {
			out = append(out, &stack.Attempt{User: a.User, Key: a.Key, Qty: a.Qty})
		}
		for i := range 6 {
			out = append(out, &stack.Attempt{User: fmt.Sprintf("lossshard-new-%s%d", tag, i), Qty: 1})
		}
		rc := &stack.Crowd{Sale: sale, Attempts: out, Workers: 8}
		rc.Run(s, s.Backends)
		c.Attempts = append(c.Attempts, rc.Attempts...)
		return rc.Attempts
	}
	marks := func() []bool {
		out := make([]bool, shards)
		for k := range out {
			n, err := s.Redis.Exists(ctx, reservation.ShardKeys(s.Prefix, sale.ID, k, shards).Recovering).Result()
			servicetest.Must(t, err, "recovering mark of shard %d", k)
			out[k] = n == 1
		}
		return out
	}
	// Workers away longer than reservation_ttl + republish_after.
	for round := range 3 {
		for _, a := range retry(fmt.Sprintf("r%d", round)) {
			if a.Status != http.StatusServiceUnavailable && (a.Key == "" || a.Status != http.StatusAccepted || a.OrderID != first[a.User]) {
				t.Errorf("%s key %q while the sale recovers: %v (order %s, first %s)", a.User, a.Key, a.Answers, a.OrderID, first[a.User])
			}
		}
		time.Sleep(2 * time.Second)
	}
	for k, m := range marks() {
		if !m {
			t.Fatalf("shard %d not recovering with its orders still queued", k)
		}
	}
	s.StartWorkers(t)
	stack.WaitFor(t, "every shard's recovery to end", time.Minute, func() bool {
		m := marks()
		for k := 1; k < shards; k++ {
			if !m[0] && m[k] {
				t.Fatalf("shard 0 recovered before shard %d", k)
			}
		}
		return !m[0]
	})
	// Every order queued before the loss is in MySQL: the recovery ended
	// only after the queue drained them.
	var decided int
	servicetest.Must(t, s.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders WHERE activity_id = ? AND status = 'confirmed'`,
		sale.ID).Scan(&decided), "count orders")
	if decided != shards*perShard {
		t.Errorf("recovery ended with %d of the %d queued orders confirmed in MySQL", decided, shards*perShard)
	}
	users, err := salesdb.Users(ctx, s.DB, sale.ID)
	servicetest.Must(t, err, "users")
	per := reservation.SplitUsers(users, shards)
	for k := range shards {
		var want int64
		for _, n := range per[k] {
			want += n
		}
		sk := reservation.ShardKeys(s.Prefix, sale.ID, k, shards)
		got, err := s.Redis.HMGet(ctx, sk.Meta, "sold", "pending").Result()
		servicetest.Must(t, err, "meta of shard %d", k)
		if fmt.Sprint(got[0]) != fmt.Sprint(want) || fmt.Sprint(got[1]) != "0" {
			t.Errorf("shard %d after the recovery: sold=%v pending=%v, want sold=%d (MySQL) pending=0", k, got[0], got[1], want)
		}
	}
	if sum, ok, err := s.Res.Allotted(ctx, sale.ID); err != nil || !ok || sum != sale.Stock {
		t.Errorf("shard totals add up to %d (%v %v), want %d", sum, ok, err, sale.Stock)
	}
	for _, a := range retry("after") {
		if a.Key != "" && (a.Status != http.StatusAccepted || a.OrderID != first[a.User]) {
			t.Errorf("%s after the drain: %v order %s, want its first order %s", a.User, a.Answers, a.OrderID, first[a.User])
		}
		if a.Key == "" && a.Status != http.StatusAccepted {
			t.Errorf("%s (new) after the drain: %v", a.User, a.Answers)
		}
	}
	s.Finish(t, "redis loss of a sale in stock shards", sale, c)
}
