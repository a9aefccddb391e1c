package reservation_test

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// TestReserveMultiAnswersEachAsAlone: a group of requests reserved in one
// ReserveMulti gets, request by request, the answer Reserve gives the same
// requests one at a time, and leaves Redis as they do (a twin sale, the same
// order ids): every check per request — key replay within the group, the
// per-user limit reached by an earlier request of the group, bad quantity,
// an order id of another user, the stock running out at the tail.
func TestReserveMultiAnswersEachAsAlone(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	const one, many = 301, 302
	s := sale{total: 4, limit: 2, start: -time.Hour, end: time.Hour}
	warm(t, st, rdb, one, s)
	warm(t, st, rdb, many, s)
	type req struct {
		user, key string
		qty       int64
		sameAs    int // >= 0: the order id of request sameAs (another user's: conflict)
	}
	group := []req{
		{"a", "k1", 1, -1},
		{"a", "k1", 1, -1}, // the key again: a replay of request 0
		{"a", "", 2, -1},   // a holds 1: limit_exceeded
		{"b", "", 3, -1},   // bad_quantity
		{"c", "", 1, 0},    // request 0's order id: conflict
		{"b", "", 2, -1},
		{"d", "kd", 2, -1}, // 1 left: insufficient
		{"d", "", 1, -1},   // the last unit
		{"e", "", 1, -1},   // sold_out
		{"f", "kf", 1, -1}, // sold_out, keyed
	}
	oids := make([]string, len(group))
	for i, g := range group {
		oids[i] = ordermsg.NewOrderID(one)
		if g.sameAs >= 0 {
			oids[i] = oids[g.sameAs]
		}
	}
	for_ := func(id int64, i int) reservation.Request {
		g := group[i]
		// The same random part in both sales: the records compare.
		return reservation.Request{ActivityID: id, UserID: g.user, IdempotencyKey: g.key, Quantity: g.qty,
			OrderID: strconv.FormatInt(id, 10) + oids[i][len("301"):], TTL: time.Hour}
	}
	var alone []reservation.Result
	for i := range group {
		res, err := st.Reserve(context.Background(), for_(one, i))
		servicetest.Must(t, err, "reserve %d", i)
		alone = append(alone, res)
	}
	rs := make([]reservation.Request, len(group))
	for i := range group {
		rs[i] = for_(many, i)
	}
	got, errs, err := st.ReserveMulti(context.Background(), rs)
	servicetest.Must(t, err, "reserve multi")
	want := []reservation.Outcome{reservation.Reserved, reservation.Replay, reservation.LimitExceeded, reservation.BadQuantity,
		reservation.IDConflict, reservation.Reserved, reservation.Insufficient, reservation.Reserved, reservation.SoldOut, reservation.SoldOut}
	for i := range group {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		a, m := alone[i], got[i]
		if a.Outcome != want[i] {
			t.Errorf("request %d alone = %+v, want %s", i, a, want[i])
		}
		// Order ids and deadlines differ by sale and by clock: compare the rest.
		if m.OrderID != "" {
			m.OrderID = strconv.Itoa(one) + m.OrderID[len("302"):]
		}
		if !m.Deadline.IsZero() && !a.Deadline.IsZero() {
			if d := m.Deadline.Sub(a.Deadline); d < 0 || d > 10*time.Second {
				t.Errorf("request %d: deadline %v in the group, %v alone", i, m.Deadline, a.Deadline)
			}
			m.Deadline = a.Deadline
		}
		if m != a {
			t.Errorf("request %d: in the group %+v, alone %+v", i, m, a)
		}
	}
	if a, m := meta(t, st, one), meta(t, st, many); a.Pending != m.Pending || m.Pending != 4 {
		t.Errorf("pending %d alone, %d in the group; want 4", a.Pending, m.Pending)
	}
	// The user entries agree, order ids of the other sale translated.
	ua, um := userEntries(t, st, rdb, one), userEntries(t, st, rdb, many)
	if len(ua) != len(um) {
		t.Errorf("users %v in the group, %v alone", um, ua)
	}
	for u, e := range ua {
		a, m := parseUser(t, e), parseUser(t, um[u])
		for k, oid := range m.Keys {
			m.Keys[k] = strconv.Itoa(one) + oid[len("302"):]
		}
		if !reflect.DeepEqual(a, m) {
			t.Errorf("user %s: %+v in the group, %+v alone", u, m, a)
		}
	}
	// Idempotent on the group: the same call again finds every request's own
	// record and reserves nothing more.
	again, errs, err := st.ReserveMulti(context.Background(), rs)
	servicetest.Must(t, err, "reserve multi again")
	for _, i := range []int{0, 5, 7} {
		if errs[i] != nil || again[i].Outcome != reservation.Reserved || again[i].OrderID != got[i].OrderID {
			t.Errorf("request %d repeated: %+v %v, want its own order again", i, again[i], errs[i])
		}
	}
	if m := meta(t, st, many); m.Pending != 4 {
		t.Errorf("pending %d after the repeat, want 4", m.Pending)
	}
}

func parseUser(t *testing.T, raw string) reservation.UserEntry {
	t.Helper()
	u, err := reservation.ParseUser(raw)
	servicetest.Must(t, err, "user entry %q", raw)
	return u
}

// TestReserveMultiRefusesMixedShards: requests of two sales are never sent
// as one call (their keys are in different slots), nothing is reserved.
func TestReserveMultiRefusesMixedShards(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	warm(t, st, rdb, 311, open)
	warm(t, st, rdb, 312, open)
	_, _, err := st.ReserveMulti(context.Background(), []reservation.Request{
		{ActivityID: 311, UserID: "a", Quantity: 1, OrderID: ordermsg.NewOrderID(311), TTL: ttl},
		{ActivityID: 312, UserID: "a", Quantity: 1, OrderID: ordermsg.NewOrderID(312), TTL: ttl},
	})
	if err == nil {
		t.Fatal("a group of two sales was reserved")
	}
	if a, b := meta(t, st, 311), meta(t, st, 312); a.Pending != 0 || b.Pending != 0 {
		t.Errorf("pending %d, %d after a refused group", a.Pending, b.Pending)
	}
}

// TestReserveMultiFirstUseReadsBuckets: the first group of a sale in this
// process names the buckets of the sale's count: every record lands where
// Order (and the other scripts) look for it.
func TestReserveMultiFirstUseReadsBuckets(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	warm(t, st, rdb, 321, sale{total: 1000, limit: 1, start: -time.Hour, end: time.Hour})
	rs := make([]reservation.Request, 20)
	for i := range rs {
		rs[i] = reservation.Request{ActivityID: 321, UserID: "u" + strconv.Itoa(i), Quantity: 1, OrderID: ordermsg.NewOrderID(321), TTL: ttl}
	}
	got, errs, err := st.ReserveMulti(context.Background(), rs)
	servicetest.Must(t, err, "reserve multi")
	for i := range rs {
		if errs[i] != nil || got[i].Outcome != reservation.Reserved {
			t.Fatalf("request %d: %+v %v", i, got[i], errs[i])
		}
		rec, found, err := st.Order(context.Background(), 321, rs[i].OrderID)
		if err != nil || !found || rec.UserID != rs[i].UserID {
			t.Fatalf("request %d: record %+v %v %v", i, rec, found, err)
		}
	}
}

// BenchmarkReserveGroup reserves b.N requests of one sale, each a fresh user,
// on a redis-server of its own: "one" by Reserve one request a call (the
// baseline), "multi-N" by ReserveMulti in groups of N. ns/op and allocs/op
// are per request; redis-cpu-us/op is the server's CPU per request (INFO
// cpu), which other processes on the box do not move.
func BenchmarkReserveGroup(b *testing.B) {
	for _, size := range []int{1, 8, 64} {
		name := "one"
		if size > 1 {
			name = "multi-" + strconv.Itoa(size)
		}
		b.Run(name, func(b *testing.B) {
			own := servicetest.PrivateRedis(b)
			rdb := redis.NewClient(&redis.Options{Addr: own.Addr})
			b.Cleanup(func() { _ = rdb.Close() })
			st := reservation.New(rdb, "bench:")
			const id = 1
			warm(b, st, rdb, id, sale{total: 1 << 40, limit: 1, start: -time.Hour, end: time.Hour})
			rs := make([]reservation.Request, b.N)
			for i := range rs {
				rs[i] = reservation.Request{ActivityID: id, UserID: "u" + strconv.Itoa(i), Quantity: 1,
					OrderID: ordermsg.NewOrderID(id), TTL: ttl}
			}
			ctx := context.Background()
			cpu0 := redisCPU(b, rdb)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += size {
				g := rs[i:min(i+size, b.N)]
				if size == 1 {
					if res, err := st.Reserve(ctx, g[0]); err != nil || res.Outcome != reservation.Reserved {
						b.Fatalf("%+v %v", res, err)
					}
					continue
				}
				got, errs, err := st.ReserveMulti(ctx, g)
				if err != nil {
					b.Fatal(err)
				}
				for j := range g {
					if errs[j] != nil || got[j].Outcome != reservation.Reserved {
						b.Fatalf("%+v %v", got[j], errs[j])
					}
				}
			}
			b.StopTimer()
			b.ReportMetric((redisCPU(b, rdb)-cpu0)*1e6/float64(b.N), "redis-cpu-us/op")
		})
	}
}

// redisCPU is the CPU time (user + sys, seconds) the server has used.
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	servicetest.Must(b, err, "info cpu")
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			x, err := strconv.ParseFloat(v, 64)
			servicetest.Must(b, err, "%s", line)
			total += x
		}
	}
	return total
}

// TestMarkQueuedMany marks the open orders of one message in one round
// trip, each as MarkQueued would: a pending order marked, a settled or
// missing one not; also after a SCRIPT FLUSH on a node of the test's own.
func TestMarkQueuedMany(t *testing.T) {
	t.Parallel()
	own := servicetest.PrivateRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: own.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	st := reservation.New(rdb, "mq:")
	warm(t, st, rdb, 331, open)
	a, b := reserve(t, st, 331, "a", "", 1), reserve(t, st, 331, "b", "", 1)
	_, err := st.Release(context.Background(), 331, b.OrderID, "test")
	servicetest.Must(t, err, "release")
	servicetest.Must(t, rdb.ScriptFlush(context.Background()).Err(), "script flush")
	ids := []string{a.OrderID, b.OrderID, ordermsg.NewOrderID(331)}
	marked, errs := st.MarkQueuedMany(context.Background(), 331, ids)
	for i, err := range errs {
		servicetest.Must(t, err, "mark %d", i)
	}
	if !marked[0] || marked[1] || marked[2] {
		t.Errorf("marked %v, want [true false false]", marked)
	}
	if rec, _, _ := st.Order(context.Background(), 331, a.OrderID); !rec.Queued {
		t.Errorf("record %+v not queued", rec)
	}
	// One script call for the message's orders of one shard, not one each.
	c, d := reserve(t, st, 331, "c", "", 1), reserve(t, st, 331, "d", "", 1)
	servicetest.Must(t, rdb.ConfigResetStat(context.Background()).Err(), "reset stats")
	marked, errs = st.MarkQueuedMany(context.Background(), 331, []string{c.OrderID, d.OrderID, a.OrderID})
	if errs[0] != nil || errs[1] != nil || errs[2] != nil || !marked[0] || !marked[1] || !marked[2] {
		t.Errorf("marked %v %v, want all three (a again: already queued, marked anew)", marked, errs)
	}
	stats, err := rdb.Info(context.Background(), "commandstats").Result()
	servicetest.Must(t, err, "commandstats")
	if !strings.Contains(stats, "cmdstat_evalsha:calls=1,") || strings.Contains(stats, "cmdstat_eval:") {
		t.Errorf("commandstats after marking 3 orders:\n%s\nwant one EVALSHA", stats)
	}
}

// TestReserveMultiOnAShardOfASplitSale: groups on one shard of a sale split
// over 4 shards, whose home shard runs empty while the others have units.
// A request the shard answers sold_out or insufficient goes again alone
// through Reserve, which moves units in first: the first group (more than
// the shard holds, its last request asking 2 of the 1 left) is reserved
// whole; then concurrent groups sell the rest, every request ends reserved
// or truly sold out (none reserved after the first sold-out answer, exactly
// the stock reserved). A group chosen for another shard count is refused
// with ErrShards, nothing reserved.
func TestReserveMultiOnAShardOfASplitSale(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	const id, shards, stock = 341, 4, 40
	warmShards(t, st, rdb, id, stock, 2, shards)
	ctx := context.Background()
	users := usersOn(2, shards, 60, "g")
	request := func(u string, qty int64) reservation.Request {
		home, err := st.Home(ctx, id, u)
		servicetest.Must(t, err, "home of %s", u)
		if home.Shard != 2 {
			t.Fatalf("user %s homed on shard %d, want 2", u, home.Shard)
		}
		return reservation.Request{ActivityID: id, UserID: u, Quantity: qty,
			OrderID: ordermsg.NewShardOrderID(id, home.Shard, home.Shards), TTL: ttl, Keys: home}
	}

	// Stale shard count: the whole group refused.
	stale := request(users[0], 1)
	stale.Keys = st.ShardKeys(id, 0, 1)
	stale.OrderID = ordermsg.NewOrderID(id)
	if _, _, err := st.ReserveMulti(ctx, []reservation.Request{stale, stale}); !errors.Is(err, reservation.ErrShards) {
		t.Fatalf("group for 1 shard on a sale of %d: %v, want ErrShards", shards, err)
	}

	// Shard 2 holds 10: 9 of 1, then 2 of the 1 left (insufficient on the
	// shard), then 2 more of 1 (sold out on the shard).
	first := make([]reservation.Request, 12)
	for i := range first {
		qty := int64(1)
		if i == 9 {
			qty = 2
		}
		first[i] = request(users[i], qty)
	}
	got, errs, err := st.ReserveMulti(ctx, first)
	servicetest.Must(t, err, "first group")
	held := int64(0)
	for i := range first {
		if errs[i] != nil || got[i].Outcome != reservation.Reserved {
			t.Fatalf("first group, request %d (qty %d): %+v %v, want reserved", i, first[i].Quantity, got[i], errs[i])
		}
		held += first[i].Quantity
	}

	// The rest in groups of 6, 4 groups at once, every user once.
	var (
		mu        sync.Mutex
		reserved  = held
		soldOut   int
		firstSold time.Time
		okStarts  []time.Time
		work      = make(chan []string)
		wg        sync.WaitGroup
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for us := range work {
				rs := make([]reservation.Request, len(us))
				for i, u := range us {
					rs[i] = request(u, 1)
				}
				start := time.Now()
				got, errs, err := st.ReserveMulti(ctx, rs)
				done := time.Now()
				mu.Lock()
				for i := range rs {
					switch {
					case err != nil:
						t.Errorf("group: %v", err)
					case errs[i] != nil:
						t.Errorf("request of %s: %v", us[i], errs[i])
					case got[i].Outcome == reservation.Reserved:
						reserved++
						okStarts = append(okStarts, start)
					case got[i].Outcome == reservation.SoldOut:
						soldOut++
						if firstSold.IsZero() || done.Before(firstSold) {
							firstSold = done
						}
					default:
						t.Errorf("request of %s: %+v", us[i], got[i])
					}
				}
				mu.Unlock()
			}
		}()
	}
	rest := users[len(first):]
	for i := 0; i < len(rest); i += 6 {
		work <- rest[i:min(i+6, len(rest))]
	}
	close(work)
	wg.Wait()
	if reserved != stock {
		t.Errorf("reserved %d units, want exactly %d", reserved, stock)
	}
	if want := len(rest) - (stock - int(held)); soldOut != want {
		t.Errorf("%d sold out, want %d", soldOut, want)
	}
	for _, s := range okStarts {
		if !firstSold.IsZero() && s.After(firstSold) {
			t.Errorf("false sold out: a group started at %v after the first sold out (%v) reserved", s, firstSold)
		}
	}
	if s := meta(t, st, id); s.Pending != stock || s.Available() != 0 {
		t.Errorf("view = %+v, want %d pending, none available", s, stock)
	}
	if got, ok, err := st.Allotted(ctx, id); err != nil || !ok || got != stock {
		t.Errorf("Allotted = %d %v %v, want %d", got, ok, err, stock)
	}
}
