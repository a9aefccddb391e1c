package reservation_test

import (
	"context"
	"maps"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/redisnodes"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/lua"
)

const ttl = 30 * time.Second

func redisNow(t testing.TB, rdb redis.UniversalClient) time.Time {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	servicetest.Must(t, err, "redis TIME")
	return now
}

// userHash names the hash holding user uid's entry in sale id.
func userHash(t testing.TB, st *reservation.Store, id int64, uid string) string {
	t.Helper()
	h, err := st.UserHash(context.Background(), id, uid)
	servicetest.Must(t, err, "user hash")
	return h
}

// userEntries is every user entry of sale id, from all its hashes.
func userEntries(t testing.TB, st *reservation.Store, rdb redis.UniversalClient, id int64) map[string]string {
	t.Helper()
	ctx := context.Background()
	n, err := st.Buckets(ctx, id)
	servicetest.Must(t, err, "buckets")
	out := map[string]string{}
	for _, h := range st.Keys(id).Hashes(reservation.UserBuckets, n) {
		m, err := rdb.HGetAll(ctx, h).Result()
		servicetest.Must(t, err, "hgetall %s", h)
		maps.Copy(out, m)
	}
	return out
}

// lose deletes every key of sale id, as a Redis that lost the sale.
func lose(t testing.TB, st *reservation.Store, rdb redis.UniversalClient, id int64) {
	t.Helper()
	keys, err := st.SaleKeys(context.Background(), id)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, rdb.Del(context.Background(), keys...).Err(), "lose the sale")
}

// snapshot is every key under a prefix with its full content.
func snapshot(t testing.TB, rdb redis.UniversalClient, prefix string) map[string]any {
	t.Helper()
	ctx := context.Background()
	out := map[string]any{}
	keys, err := redisnodes.Scan(ctx, rdb, prefix+"*")
	servicetest.Must(t, err, "keys")
	for _, k := range keys {
		typ, err := rdb.Type(ctx, k).Result()
		servicetest.Must(t, err, "type %s", k)
		switch typ {
		case "hash":
			out[k], err = rdb.HGetAll(ctx, k).Result()
		case "zset":
			out[k], err = rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "set":
			out[k], err = rdb.SMembers(ctx, k).Result()
		default:
			out[k], err = rdb.Get(ctx, k).Result()
		}
		servicetest.Must(t, err, "read %s", k)
	}
	return out
}

type sale struct {
	total, limit int64
	start, end   time.Duration // relative to Redis's clock now
}

func warm(t testing.TB, st *reservation.Store, rdb redis.UniversalClient, id int64, s sale) {
	t.Helper()
	now := redisNow(t, rdb)
	out, _, err := st.Warm(context.Background(), id, reservation.WarmArgs{
		Total: s.total, Limit: s.limit, Start: now.Add(s.start), End: now.Add(s.end),
	})
	servicetest.Must(t, err, "warm")
	if out != reservation.WarmCreated {
		t.Fatalf("warm = %s, want created", out)
	}
}

func reserve(t testing.TB, st *reservation.Store, id int64, user, key string, qty int64) reservation.Result {
	t.Helper()
	res, err := st.Reserve(context.Background(), reservation.Request{
		ActivityID: id, UserID: user, IdempotencyKey: key, Quantity: qty,
		OrderID: ordermsg.NewOrderID(id), TTL: ttl,
	})
	servicetest.Must(t, err, "reserve")
	return res
}

func meta(t testing.TB, st *reservation.Store, id int64) reservation.Sale {
	t.Helper()
	s, found, err := st.Sale(context.Background(), id)
	servicetest.Must(t, err, "sale")
	if !found {
		t.Fatal("sale missing")
	}
	return s
}

var open = sale{total: 10, limit: 3, start: -time.Hour, end: time.Hour}

// TestReserveRefusals: every refusal answers its code and writes nothing.
func TestReserveRefusals(t *testing.T) {
	t.Parallel()
	type step struct {
		user string
		qty  int64
	}
	cases := []struct {
		name  string
		sale  *sale // nil: no sale in Redis
		prior []step
		user  string
		qty   int64
		want  reservation.Result
	}{
		{name: "not found", user: "a", qty: 1, want: reservation.Result{Outcome: reservation.NotFound}},
		{name: "quantity 0", sale: &open, user: "a", qty: 0, want: reservation.Result{Outcome: reservation.BadQuantity, Limit: 3}},
		{name: "quantity -1", sale: &open, user: "a", qty: -1, want: reservation.Result{Outcome: reservation.BadQuantity, Limit: 3}},
		{name: "quantity over limit", sale: &open, user: "a", qty: 4, want: reservation.Result{Outcome: reservation.BadQuantity, Limit: 3}},
		{name: "not started", sale: &sale{total: 10, limit: 1, start: time.Hour, end: 2 * time.Hour}, user: "a", qty: 1,
			want: reservation.Result{Outcome: reservation.NotStarted}},
		{name: "ended", sale: &sale{total: 10, limit: 1, start: -2 * time.Hour, end: -time.Hour}, user: "a", qty: 1,
			want: reservation.Result{Outcome: reservation.Ended}},
		{name: "end is exclusive", sale: &sale{total: 10, limit: 1, start: -time.Hour, end: 0}, user: "a", qty: 1,
			want: reservation.Result{Outcome: reservation.Ended}},
		{name: "limit exceeded", sale: &open, prior: []step{{"a", 2}}, user: "a", qty: 2,
			want: reservation.Result{Outcome: reservation.LimitExceeded, Held: 2, Limit: 3}},
		{name: "limit exceeded at the limit", sale: &open, prior: []step{{"a", 2}, {"a", 1}}, user: "a", qty: 1,
			want: reservation.Result{Outcome: reservation.LimitExceeded, Held: 3, Limit: 3}},
		{name: "sold out", sale: &sale{total: 3, limit: 3, start: -time.Hour, end: time.Hour}, prior: []step{{"a", 3}}, user: "b", qty: 1,
			want: reservation.Result{Outcome: reservation.SoldOut}},
		{name: "insufficient", sale: &sale{total: 3, limit: 2, start: -time.Hour, end: time.Hour}, prior: []step{{"a", 2}}, user: "b", qty: 2,
			want: reservation.Result{Outcome: reservation.Insufficient, Available: 1}},
		{name: "empty sale is sold out", sale: &sale{total: 0, limit: 1, start: -time.Hour, end: time.Hour}, user: "a", qty: 1,
			want: reservation.Result{Outcome: reservation.SoldOut}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rdb, prefix := servicetest.Redis(t)
			st := reservation.New(rdb, prefix)
			id := int64(100 + i)
			if c.sale != nil {
				warm(t, st, rdb, id, *c.sale)
			}
			for _, p := range c.prior {
				if r := reserve(t, st, id, p.user, "", p.qty); r.Outcome != reservation.Reserved {
					t.Fatalf("prior reserve: %+v", r)
				}
			}
			before := snapshot(t, rdb, prefix)
			got := reserve(t, st, id, c.user, "k1", c.qty)
			if got != c.want {
				t.Errorf("reserve = %+v, want %+v", got, c.want)
			}
			if after := snapshot(t, rdb, prefix); !reflect.DeepEqual(before, after) {
				t.Errorf("a refused reservation wrote to Redis:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

func TestReserveWritesEverything(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	const id = 7
	// The start is inclusive: a sale starting exactly at a moment Redis has
	// reached is open.
	warm(t, st, rdb, id, sale{total: 10, limit: 3, start: 0, end: time.Hour})
	now := redisNow(t, rdb)
	oid := ordermsg.NewOrderID(id)
	res, err := st.Reserve(context.Background(), reservation.Request{
		ActivityID: id, UserID: "alice", IdempotencyKey: "k-1", Quantity: 2, OrderID: oid, TTL: ttl,
	})
	servicetest.Must(t, err, "reserve")
	if res.Outcome != reservation.Reserved || res.OrderID != oid {
		t.Fatalf("reserve = %+v", res)
	}
	if d := res.Deadline.Sub(now); d < ttl-time.Second || d > ttl+time.Second {
		t.Errorf("deadline %v is %v after Redis's now, want about %v", res.Deadline, d, ttl)
	}
	k := st.Keys(id)
	if s := meta(t, st, id); s.Pending != 2 || s.Sold != 0 || s.Available() != 8 {
		t.Errorf("sale after reserve = %+v", s)
	}
	if u, err := st.User(context.Background(), id, "alice"); err != nil || u.Held != 2 || u.Keys["k-1"] != oid || len(u.Keys) != 1 {
		t.Errorf("users[alice] = %+v %v, want 2 held and k-1 -> %s", u, err, oid)
	}
	rec, found, err := st.Order(context.Background(), id, oid)
	servicetest.Must(t, err, "order")
	if !found || rec.State != reservation.Pending || rec.Quantity != 2 || rec.UserID != "alice" ||
		rec.Deadline.UnixMilli() != res.Deadline.UnixMilli() {
		t.Errorf("record = %+v", rec)
	}
	if sc := rdb.ZScore(context.Background(), k.Deadlines, oid).Val(); int64(sc) != res.Deadline.UnixMilli() {
		t.Errorf("deadline score = %v", sc)
	}
	// Per-user limit above 1: a second purchase up to the limit passes.
	if r := reserve(t, st, id, "alice", "k-2", 1); r.Outcome != reservation.Reserved {
		t.Fatalf("second purchase within the limit: %+v", r)
	}
	if r := reserve(t, st, id, "alice", "k-3", 1); r.Outcome != reservation.LimitExceeded || r.Held != 3 {
		t.Fatalf("purchase past the limit: %+v", r)
	}
	// Another order id collision is refused without a write.
	before := snapshot(t, rdb, prefix)
	res, err = st.Reserve(context.Background(), reservation.Request{
		ActivityID: id, UserID: "bob", Quantity: 1, OrderID: oid, TTL: ttl,
	})
	servicetest.Must(t, err, "reserve")
	if res.Outcome != reservation.IDConflict {
		t.Errorf("reused order id: %+v", res)
	}
	if after := snapshot(t, rdb, prefix); !reflect.DeepEqual(before, after) {
		t.Error("an id conflict wrote to Redis")
	}
}

func TestReserveIdempotentReplay(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	const id = 8
	warm(t, st, rdb, id, sale{total: 5, limit: 2, start: -time.Hour, end: time.Hour})
	first := reserve(t, st, id, "u", "key", 2)
	if first.Outcome != reservation.Reserved {
		t.Fatalf("first = %+v", first)
	}
	before := snapshot(t, rdb, prefix)
	// Same key, other quantity (even an invalid one): the key is checked first.
	for _, qty := range []int64{2, 1, 0, 99} {
		r := reserve(t, st, id, "u", "key", qty)
		want := reservation.Result{Outcome: reservation.Replay, OrderID: first.OrderID, State: reservation.Pending, Quantity: 2,
			Deadline: first.Deadline}
		if r != want {
			t.Errorf("replay qty %d = %+v, want %+v", qty, r, want)
		}
	}
	// The one write of a replay: the pending record is marked adopted (the
	// replay publishes it; the first attempt's undo may no longer release it).
	h, err := st.OrderHash(context.Background(), id, first.OrderID)
	servicetest.Must(t, err, "order hash")
	orders := before[h].(map[string]string)
	orders[first.OrderID] += "a"
	if after := snapshot(t, rdb, prefix); !reflect.DeepEqual(before, after) {
		t.Errorf("a replay wrote more than the adopted mark to Redis:\n%v\n%v", before, after)
	}
	if rec, _, err := st.Order(context.Background(), id, first.OrderID); err != nil || !rec.Adopted || rec.Queued || rec.Reason != "" {
		t.Errorf("replayed record = %+v %v, want adopted", rec, err)
	}
	if out, err := st.Undo(context.Background(), id, first.OrderID, "reserve_failed", "u", "key"); err != nil || out != reservation.Taken {
		t.Errorf("undo of an adopted record = %s %v, want taken", out, err)
	}
	// The key is per user: another user's same key is a new purchase.
	if r := reserve(t, st, id, "v", "key", 1); r.Outcome != reservation.Reserved || r.OrderID == first.OrderID {
		t.Errorf("other user, same key = %+v", r)
	}
	// A replay of a failed order still answers it, also once the sale ended.
	out, err := st.Release(context.Background(), id, first.OrderID, "released")
	servicetest.Must(t, err, "release")
	if out != reservation.Released {
		t.Fatalf("release = %s", out)
	}
	now := redisNow(t, rdb)
	if _, _, err := st.Warm(context.Background(), id, reservation.WarmArgs{
		Total: 5, Limit: 2, Start: now.Add(-time.Hour), End: now.Add(-time.Minute),
	}); err != nil {
		t.Fatal(err)
	}
	r := reserve(t, st, id, "u", "key", 1)
	if r.Outcome != reservation.Replay || r.OrderID != first.OrderID || r.State != reservation.Failed {
		t.Errorf("replay after failure = %+v", r)
	}
	// Without a key the ended sale answers ended.
	if r := reserve(t, st, id, "u", "", 1); r.Outcome != reservation.Ended {
		t.Errorf("no key after the end = %+v", r)
	}
}

func TestReserveRejectsNonIntegerQuantity(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	const id = 9
	warm(t, st, rdb, id, open)
	k := st.Keys(id)
	n, err := st.Buckets(context.Background(), id)
	servicetest.Must(t, err, "buckets")
	for _, q := range []string{"1.5", "abc", "", "1e0x"} {
		oid := ordermsg.NewOrderID(id)
		v, err := lua.Reserve.Run(context.Background(), rdb, k.ReserveKeys(n, "u", oid),
			"u", "", q, oid, ttl.Milliseconds(), n).Slice()
		servicetest.Must(t, err, "reserve %q", q)
		if len(v) < 1 || v[0] != "bad_quantity" {
			t.Errorf("quantity %q: %v, want bad_quantity", q, v)
		}
	}
	if s := meta(t, st, id); s.Pending != 0 {
		t.Errorf("pending = %d after bad quantities", s.Pending)
	}
}

// The release-versus-claim race, both orders forced: exactly one side wins,
// and an order is never both released and confirmable.
func TestReleaseVersusClaim(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 11
	warm(t, st, rdb, id, sale{total: 4, limit: 2, start: -time.Hour, end: time.Hour})

	t.Run("claim first", func(t *testing.T) {
		r := reserve(t, st, id, "a", "ka", 2)
		states, err := st.Claim(ctx, id, []string{r.OrderID})
		servicetest.Must(t, err, "claim")
		if states[0] != reservation.Claimed {
			t.Fatalf("claim = %s", states[0])
		}
		out, err := st.Undo(ctx, id, r.OrderID, "publish_failed", "a", "ka")
		servicetest.Must(t, err, "release")
		if out != reservation.AlreadyClaimed {
			t.Fatalf("release after claim = %s, want claimed", out)
		}
		rec, _, _ := st.Order(ctx, id, r.OrderID)
		if rec.State != reservation.Claimed {
			t.Errorf("state = %s, want C", rec.State)
		}
		if s := meta(t, st, id); s.Pending != 2 {
			t.Errorf("pending = %d, want 2 (the worker still holds it)", s.Pending)
		}
		if u, _ := st.User(ctx, id, "a"); u.Keys["ka"] != r.OrderID {
			t.Error("the key of a claimed order was forgotten")
		}
		// The worker settles it confirmed; a late release still changes nothing.
		_, err = st.Settle(ctx, id, []reservation.Settlement{{OrderID: r.OrderID, Confirmed: true, Quantity: 2, UserID: "a"}})
		servicetest.Must(t, err, "settle")
		out, _ = st.Release(ctx, id, r.OrderID, "expired")
		if out != reservation.AlreadyConfirmed {
			t.Errorf("release after confirm = %s", out)
		}
	})
	t.Run("release first", func(t *testing.T) {
		r := reserve(t, st, id, "b", "kb", 1)
		before := meta(t, st, id)
		out, err := st.Undo(ctx, id, r.OrderID, "publish_failed", "b", "kb")
		servicetest.Must(t, err, "release")
		if out != reservation.Released {
			t.Fatalf("release = %s", out)
		}
		states, err := st.Claim(ctx, id, []string{r.OrderID})
		servicetest.Must(t, err, "claim")
		if states[0] != reservation.Failed {
			t.Fatalf("claim after release = %s, want F", states[0])
		}
		after := meta(t, st, id)
		if after.Pending != before.Pending-1 {
			t.Errorf("pending %d -> %d, want one unit back", before.Pending, after.Pending)
		}
		if n, _ := rdb.HExists(ctx, userHash(t, st, id, "b"), "b").Result(); n {
			t.Error("the user still holds the released unit")
		}
		// Nothing kept: the same key reserves anew.
		again := reserve(t, st, id, "b", "kb", 1)
		if again.Outcome != reservation.Reserved || again.OrderID == r.OrderID {
			t.Errorf("retry with the key after release = %+v", again)
		}
	})
	t.Run("sweeper release keeps the key", func(t *testing.T) {
		r := reserve(t, st, id, "c", "kc", 1)
		out, err := st.Release(ctx, id, r.OrderID, "expired")
		servicetest.Must(t, err, "release")
		if out != reservation.Released {
			t.Fatalf("release = %s", out)
		}
		if again := reserve(t, st, id, "c", "kc", 1); again.Outcome != reservation.Replay || again.State != reservation.Failed {
			t.Errorf("replay after a sweeper release = %+v", again)
		}
	})
}

// A backend whose release reply was lost retries it: the repeat answers
// "released" again and gives nothing back twice; a release for another reason
// of an order already failed changes nothing.
func TestReleaseRetryIsIdempotent(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 12
	warm(t, st, rdb, id, sale{total: 5, limit: 3, start: -time.Hour, end: time.Hour})
	r := reserve(t, st, id, "c", "kc", 2)
	for i := range 2 {
		out, err := st.Undo(ctx, id, r.OrderID, "publish_failed", "c", "kc")
		servicetest.Must(t, err, "release %d", i)
		if out != reservation.Released {
			t.Fatalf("release %d = %s, want released", i, out)
		}
		if s := meta(t, st, id); s.Pending != 0 {
			t.Fatalf("after release %d pending = %d, want 0", i, s.Pending)
		}
		if held := rdb.HGet(ctx, userHash(t, st, id, "c"), "c").Val(); held != "" {
			t.Fatalf("after release %d user holds %q", i, held)
		}
	}
	if out, _ := st.Release(ctx, id, r.OrderID, "expired"); out != reservation.AlreadyFailed {
		t.Errorf("release for another reason = %s, want failed", out)
	}
}

func TestReleasePublishesStockEvent(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 12
	warm(t, st, rdb, id, sale{total: 1, limit: 1, start: -time.Hour, end: time.Hour})
	r := reserve(t, st, id, "a", "", 1)
	if got := reserve(t, st, id, "b", "", 1); got.Outcome != reservation.SoldOut {
		t.Fatalf("second = %+v", got)
	}
	sub := rdb.Subscribe(ctx, reservation.Channel(prefix))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription confirmation
		t.Fatal(err)
	}
	if _, err := st.Release(ctx, id, r.OrderID, "expired"); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.ReceiveMessage(ctx)
	servicetest.Must(t, err, "receive")
	if msg.Payload != strconv.Itoa(id) {
		t.Errorf("event payload = %q", msg.Payload)
	}
	if got := reserve(t, st, id, "b", "", 1); got.Outcome != reservation.Reserved {
		t.Errorf("after release = %+v", got)
	}
}

func TestWarmKeepsLiveCounters(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 13
	warm(t, st, rdb, id, sale{total: 5, limit: 2, start: -time.Hour, end: time.Hour})
	reserve(t, st, id, "a", "", 2)
	now := redisNow(t, rdb)
	args := reservation.WarmArgs{Total: 1, Limit: 2, Start: now.Add(-time.Hour), End: now.Add(time.Hour)}
	out, s, err := st.Warm(ctx, id, args)
	servicetest.Must(t, err, "warm")
	if out != reservation.WarmConflict || s.Pending != 2 {
		t.Fatalf("lowering below pending = %s %+v", out, s)
	}
	args.Total = 8
	if out, _, _ = st.Warm(ctx, id, args); out != reservation.WarmUpdated {
		t.Fatalf("raise = %s", out)
	}
	if got := meta(t, st, id); got.Total != 8 || got.Pending != 2 {
		t.Errorf("after raise = %+v", got)
	}
	// Rebuild after a loss of the whole sale needs MySQL's user totals when
	// units were sold (a partial loss: TestWarmAfterMetaLossCountsSurvivingReservations).
	lose(t, st, rdb, id)
	args.Sold = 3
	if out, _, _ = st.Warm(ctx, id, args); out != reservation.WarmNeedUsers {
		t.Fatalf("rebuild without users = %s", out)
	}
	args.Users = map[string]int64{"a": 2, "b": 1}
	if out, _, _ = st.Warm(ctx, id, args); out != reservation.WarmCreated {
		t.Fatalf("rebuild = %s", out)
	}
	users := userEntries(t, st, rdb, id)
	if !maps.Equal(users, map[string]string{"a": "2", "b": "1"}) {
		t.Errorf("users after rebuild = %v", users)
	}
	if r := reserve(t, st, id, "a", "", 1); r.Outcome != reservation.LimitExceeded {
		t.Errorf("user at the limit after rebuild = %+v", r)
	}
}

// BenchmarkReserve is one reservation through the typed wrapper, every call
// a fresh user so that each one reserves.
func BenchmarkReserve(b *testing.B) { benchReserve(b, 1<<40) }

// BenchmarkReserveSale is BenchmarkReserve in a sale of 131,072 units (2,048
// buckets, lua/record.lua), whose buckets fill as it sells; BenchmarkReserve's
// sale has the most buckets (16,384).
func BenchmarkReserveSale(b *testing.B) { benchReserve(b, 1<<17) }

func benchReserve(b *testing.B, total int64) {
	rdb, prefix := servicetest.Redis(b)
	st := reservation.New(rdb, prefix)
	const id = 1
	if int64(b.N) > total {
		b.Fatalf("%d reservations in a sale of %d units", b.N, total)
	}
	warm(b, st, rdb, id, sale{total: total, limit: 1, start: -time.Hour, end: time.Hour})
	users, oids := make([]string, b.N), make([]string, b.N)
	for i := range users {
		users[i], oids[i] = "u"+strconv.Itoa(i), ordermsg.NewOrderID(id)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := st.Reserve(context.Background(), reservation.Request{
			ActivityID: id, UserID: users[i], Quantity: 1, OrderID: oids[i], TTL: ttl,
		})
		if err != nil || res.Outcome != reservation.Reserved {
			b.Fatalf("%+v %v", res, err)
		}
	}
}

// BenchmarkReserveParallel is one hot sale reserved by 32
// goroutines per CPU (SECKILL_TEST_REDIS_URL picks the engine: one node or a cluster,
// where the sale's keys are one slot on one master).
func BenchmarkReserveParallel(b *testing.B) {
	rdb, prefix := servicetest.Redis(b)
	st := reservation.New(rdb, prefix)
	const id = 1
	warm(b, st, rdb, id, sale{total: 1 << 40, limit: 1, start: -time.Hour, end: time.Hour})
	var n atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			res, err := st.Reserve(context.Background(), reservation.Request{
				ActivityID: id, UserID: "u" + strconv.FormatInt(i, 10), Quantity: 1, OrderID: ordermsg.NewOrderID(id), TTL: ttl,
			})
			if err != nil || res.Outcome != reservation.Reserved {
				b.Errorf("%+v %v", res, err)
				return
			}
		}
	})
}

// BenchmarkRawEvalSha is the ceiling of BenchmarkReserve: the same script by
// bare EVALSHA, reply unparsed.
func BenchmarkRawEvalSha(b *testing.B) {
	rdb, prefix := servicetest.Redis(b)
	st := reservation.New(rdb, prefix)
	const id = 1
	warm(b, st, rdb, id, sale{total: 1 << 40, limit: 1, start: -time.Hour, end: time.Hour})
	ctx := context.Background()
	servicetest.Must(b, lua.Preload(ctx, rdb), "preload")
	sha := lua.Reserve.Hash()
	k := st.Keys(id)
	n, err := st.Buckets(ctx, id)
	servicetest.Must(b, err, "buckets")
	users, oids, keys := make([]string, b.N), make([]string, b.N), make([][]string, b.N)
	for i := range users {
		users[i], oids[i] = "u"+strconv.Itoa(i), ordermsg.NewOrderID(id)
		keys[i] = k.ReserveKeys(n, users[i], oids[i])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := rdb.EvalSha(ctx, sha, keys[i], users[i], "", 1, oids[i], ttl.Milliseconds(), n).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// Only the meta hash lost (eviction, a partial flush): the rebuild counts the
// open reservations that survived, so their later release cannot drive
// pending below zero, and their holders keep their units.
func TestWarmAfterMetaLossCountsSurvivingReservations(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 13
	warm(t, st, rdb, id, open)
	a := reserve(t, st, id, "d", "kd", 2)
	b := reserve(t, st, id, "e", "", 1)
	_, err := st.Claim(ctx, id, []string{b.OrderID})
	servicetest.Must(t, err, "claim")
	rdb.Del(ctx, st.Keys(id).Meta)
	warm(t, st, rdb, id, open)
	if s := meta(t, st, id); s.Pending != 3 || s.Sold != 0 {
		t.Fatalf("after the rebuild: %+v, want pending 3", s)
	}
	if u, _ := st.User(ctx, id, "d"); u.Held != 2 || u.Keys["kd"] != a.OrderID {
		t.Errorf("d holds %+v after the rebuild, want 2 and its key", u)
	}
	out, err := st.Release(ctx, id, a.OrderID, "expired")
	servicetest.Must(t, err, "release")
	if out != reservation.Released {
		t.Fatalf("release = %s", out)
	}
	if s := meta(t, st, id); s.Pending != 1 {
		t.Errorf("pending after the release = %d, want 1", s.Pending)
	}
}

// A rebuild (CreateOnly) never overwrites a sale that exists: its settings may
// be newer than the rebuild's read of MySQL.
func TestWarmCreateOnlyLeavesAnExistingSale(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 14
	warm(t, st, rdb, id, sale{total: 5, limit: 2, start: -time.Hour, end: time.Hour})
	before := meta(t, st, id)
	now := redisNow(t, rdb)
	out, _, err := st.Warm(ctx, id, reservation.WarmArgs{Total: 50, Limit: 9, Start: now.Add(-time.Hour),
		End: now.Add(time.Hour), Users: map[string]int64{}, CreateOnly: true})
	servicetest.Must(t, err, "warm")
	if out != reservation.WarmExists {
		t.Fatalf("create-only warm of an existing sale = %s, want exists", out)
	}
	if after := meta(t, st, id); after != before {
		t.Errorf("create-only warm changed the sale: %+v -> %+v", before, after)
	}
	rdb.Del(ctx, st.Keys(id).Meta)
	out, _, err = st.Warm(ctx, id, reservation.WarmArgs{Total: 50, Limit: 9, Start: now.Add(-time.Hour),
		End: now.Add(time.Hour), Users: map[string]int64{}, CreateOnly: true})
	servicetest.Must(t, err, "warm")
	if out != reservation.WarmCreated || meta(t, st, id).Total != 50 {
		t.Errorf("create-only warm of a lost sale = %s %+v", out, meta(t, st, id))
	}
}

// TestWarmOfAnArchivedSale: a summary is left alone by a warm of its own or
// an older generation (a stale rebuild), and rebuilt whole — users first — by
// a newer one (an admin change that reopens it).
func TestWarmOfAnArchivedSale(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	ctx := context.Background()
	servicetest.Must(t, lua.Preload(ctx, rdb), "preload")
	st := reservation.New(rdb, prefix)
	now := redisNow(t, rdb)
	args := reservation.WarmArgs{Total: 10, Limit: 3, Start: now.Add(-time.Hour), End: now.Add(-time.Minute), Gen: 4, Users: map[string]int64{}}
	_, _, err := st.Warm(ctx, 1, args)
	servicetest.Must(t, err, "warm")
	// Archive with nothing sold (and nothing pending).
	out, _, err := st.Archive(ctx, 1, reservation.ArchiveArgs{Gen: 4, Total: 10, Sold: 0, Grace: time.Millisecond, SummaryTTL: time.Hour})
	servicetest.Must(t, err, "archive")
	if out != reservation.ArchiveDone {
		t.Fatalf("archive = %s", out)
	}
	// Pretend MySQL sold 2 units to alice before the archive.
	servicetest.Must(t, rdb.HSet(ctx, st.Keys(1).Meta, "sold", 2).Err(), "sold")
	summary := snapshot(t, rdb, prefix)
	for _, gen := range []int64{3, 4} {
		a := args
		a.Gen, a.Sold, a.Users, a.CreateOnly = gen, 2, map[string]int64{"alice": 2}, true
		if out, _, err := st.Warm(ctx, 1, a); err != nil || out != reservation.WarmArchived {
			t.Fatalf("warm of generation %d: %s %v", gen, out, err)
		}
	}
	if got := snapshot(t, rdb, prefix); !reflect.DeepEqual(got, summary) {
		t.Fatalf("a stale warm changed the summary:\n%v\n%v", summary, got)
	}
	a := args
	a.Gen, a.Sold, a.Users, a.End = 5, 2, nil, now.Add(time.Hour)
	if out, _, err := st.Warm(ctx, 1, a); err != nil || out != reservation.WarmNeedUsers {
		t.Fatalf("reopen without users: %s %v", out, err)
	}
	if got := snapshot(t, rdb, prefix); !reflect.DeepEqual(got, summary) {
		t.Fatal("asking for users changed Redis")
	}
	a.Users = map[string]int64{"alice": 2}
	if out, _, err := st.Warm(ctx, 1, a); err != nil || out != reservation.WarmCreated {
		t.Fatalf("reopen: %s %v", out, err)
	}
	s := meta(t, st, 1)
	if s.Archived || s.Gen != 5 || s.Sold != 2 || s.Total != 10 {
		t.Errorf("reopened sale %+v", s)
	}
	if ttl := rdb.PTTL(ctx, st.Keys(1).Meta).Val(); ttl != -1 {
		t.Errorf("the reopened sale kept the summary's TTL (%v)", ttl)
	}
	if res := reserve(t, st, 1, "alice", "", 2); res.Outcome != reservation.LimitExceeded {
		t.Errorf("alice over her limit in the reopened sale: %s", res.Outcome)
	}
	if res := reserve(t, st, 1, "bob", "", 3); res.Outcome != reservation.Reserved {
		t.Errorf("bob in the reopened sale: %s", res.Outcome)
	}
}

// TestReserveIsIdempotentOnTheOrderID: the order id is chosen before the
// call, so a repeat of the same call (a lost reply, a client-level retry)
// answers ok with the same deadline and reserves nothing more — with a key
// too, where it must not answer "replay" (that would skip the publish).
func TestReserveIsIdempotentOnTheOrderID(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	const id = 21
	warm(t, st, rdb, id, sale{total: 5, limit: 2, start: -time.Hour, end: time.Hour})
	for _, key := range []string{"", "k"} {
		req := reservation.Request{ActivityID: id, UserID: "u" + key, IdempotencyKey: key, Quantity: 1,
			OrderID: ordermsg.NewOrderID(id), TTL: ttl}
		first, err := st.Reserve(context.Background(), req)
		servicetest.Must(t, err, "reserve")
		before := snapshot(t, rdb, prefix)
		again, err := st.Reserve(context.Background(), req)
		servicetest.Must(t, err, "repeat")
		if again != first || first.Outcome != reservation.Reserved {
			t.Errorf("key %q: repeat = %+v, first %+v", key, again, first)
		}
		if after := snapshot(t, rdb, prefix); !reflect.DeepEqual(before, after) {
			t.Errorf("key %q: the repeat wrote to Redis", key)
		}
		// Another user cannot take the id over.
		other := req
		other.UserID, other.IdempotencyKey = "intruder", ""
		if r, err := st.Reserve(context.Background(), other); err != nil || r.Outcome != reservation.IDConflict {
			t.Errorf("key %q: other user's reserve of the id = %+v %v", key, r, err)
		}
	}
	if s := meta(t, st, id); s.Pending != 2 {
		t.Errorf("pending %d, want 2", s.Pending)
	}
}

// TestUndoBeforeReserveLeavesATombstone: the backend's undo reaches Redis
// before its delayed reserve. The undo leaves a tombstone and answers
// released; the late reserve is refused and writes nothing, so the 503 keeps
// nothing. Repeating the undo answers released again.
func TestUndoBeforeReserveLeavesATombstone(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 22
	warm(t, st, rdb, id, sale{total: 5, limit: 2, start: -time.Hour, end: time.Hour})
	req := reservation.Request{ActivityID: id, UserID: "u", IdempotencyKey: "k", Quantity: 2,
		OrderID: ordermsg.NewOrderID(id), TTL: ttl}
	for range 2 {
		out, err := st.Undo(ctx, id, req.OrderID, "reserve_failed", "u", "k")
		servicetest.Must(t, err, "undo")
		if out != reservation.Released {
			t.Fatalf("undo = %s, want released", out)
		}
	}
	before := snapshot(t, rdb, prefix)
	res, err := st.Reserve(ctx, req)
	servicetest.Must(t, err, "late reserve")
	if res.Outcome != reservation.Undone {
		t.Fatalf("late reserve = %+v, want undone", res)
	}
	if after := snapshot(t, rdb, prefix); !reflect.DeepEqual(before, after) {
		t.Error("the refused reserve wrote to Redis")
	}
	if s := meta(t, st, id); s.Pending != 0 || s.Sold != 0 {
		t.Errorf("sale %+v, want nothing reserved", s)
	}
	// The key was never bound: the client's retry with it reserves anew.
	retry := req
	retry.OrderID = ordermsg.NewOrderID(id)
	if r, err := st.Reserve(ctx, retry); err != nil || r.Outcome != reservation.Reserved {
		t.Errorf("retry with the key = %+v %v", r, err)
	}
}

// TestUndoAfterReserveReleasesAndForgetsTheKey: the reserve ran but its reply
// was lost; the undo gives the units back and unbinds the key.
func TestUndoAfterReserveReleasesAndForgetsTheKey(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 23
	warm(t, st, rdb, id, sale{total: 5, limit: 2, start: -time.Hour, end: time.Hour})
	r := reserve(t, st, id, "u", "k", 2)
	out, err := st.Undo(ctx, id, r.OrderID, "reserve_failed", "u", "k")
	servicetest.Must(t, err, "undo")
	if out != reservation.Released {
		t.Fatalf("undo = %s", out)
	}
	if s := meta(t, st, id); s.Pending != 0 {
		t.Errorf("pending %d after the undo", s.Pending)
	}
	if r2 := reserve(t, st, id, "u", "k", 2); r2.Outcome != reservation.Reserved || r2.OrderID == r.OrderID {
		t.Errorf("retry with the key = %+v", r2)
	}
}

// TestMarkQueued: only an open record is marked; the mark survives a claim
// and shows in a replay; settling clears it.
func TestMarkQueued(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 24
	warm(t, st, rdb, id, sale{total: 5, limit: 2, start: -time.Hour, end: time.Hour})
	r := reserve(t, st, id, "u", "k", 1)
	if rep := reserve(t, st, id, "u", "k", 1); rep.Queued {
		t.Error("replay reports queued before the mark")
	}
	ok, err := st.MarkQueued(ctx, id, r.OrderID)
	servicetest.Must(t, err, "mark")
	if !ok {
		t.Fatal("open record not marked")
	}
	if rep := reserve(t, st, id, "u", "k", 1); !rep.Queued || rep.State != reservation.Pending {
		t.Errorf("replay after the mark = %+v", rep)
	}
	_, err = st.Claim(ctx, id, []string{r.OrderID})
	servicetest.Must(t, err, "claim")
	rec, _, err := st.Order(ctx, id, r.OrderID)
	servicetest.Must(t, err, "order")
	if rec.State != reservation.Claimed || !rec.Queued || rec.Reason != "" {
		t.Errorf("claimed record %+v, want claimed and queued", rec)
	}
	_, err = st.Settle(ctx, id, []reservation.Settlement{{OrderID: r.OrderID, Confirmed: true, Quantity: 1, UserID: "u"}})
	servicetest.Must(t, err, "settle")
	if ok, _ := st.MarkQueued(ctx, id, r.OrderID); ok {
		t.Error("a settled record was marked")
	}
	if ok, _ := st.MarkQueued(ctx, id, "24-00000000000000000000000000"); ok {
		t.Error("a missing record was marked")
	}
	rec, _, _ = st.Order(ctx, id, r.OrderID)
	if rec.State != reservation.Confirmed || rec.Queued {
		t.Errorf("settled record %+v", rec)
	}
}

// TestUndoLeavesAQueuedOrder: once the broker confirmed a message of the
// order (another request of the key published it), the undo answers queued
// and changes nothing: a worker will decide it, and the key keeps naming it.
func TestUndoLeavesAQueuedOrder(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	ctx := context.Background()
	const id = 25
	warm(t, st, rdb, id, sale{total: 5, limit: 2, start: -time.Hour, end: time.Hour})
	r := reserve(t, st, id, "u", "k", 1)
	_, err := st.MarkQueued(ctx, id, r.OrderID)
	servicetest.Must(t, err, "mark")
	before := snapshot(t, rdb, prefix)
	out, err := st.Undo(ctx, id, r.OrderID, "publish_failed", "u", "k")
	servicetest.Must(t, err, "undo")
	if out != reservation.AlreadyQueued {
		t.Fatalf("undo of a queued order = %s, want queued", out)
	}
	if after := snapshot(t, rdb, prefix); !reflect.DeepEqual(before, after) {
		t.Error("the undo of a queued order wrote to Redis")
	}
}
