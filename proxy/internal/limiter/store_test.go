package limiter

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/servicetest"
)

// stores runs fn against the Redis store (the test's Redis: a node, or the
// cluster under make test-engines) and the memory store.
func stores(t *testing.T, fn func(t *testing.T, s Store, prefix string)) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rdb, prefix := servicetest.Redis(t)
		fn(t, NewRedis(rdb, "t", 2*time.Second, NewMetrics(prometheus.NewRegistry()), nil), prefix)
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		fn(t, NewMemory(), "m:")
	})
}

var keySeq atomic.Int64

// written is the number of hits decisions wrote into window w: in Redis its
// members once every lease slot this instance did not spend is back (its
// spending time over and the give-backs done, lease.go); in memory what a
// decision finds taken.
func written(t *testing.T, s Store, key string, w Want) int {
	t.Helper()
	if r, ok := s.(*Redis); ok {
		time.Sleep(r.leases.spending)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			sh := r.leases.shard(key)
			sh.mu.Lock()
			l := sh.m[key]
			pending := l != nil && (l.cur.left > 0 || l.next.left > 0 || l.asking)
			sh.mu.Unlock()
			if !pending && r.backs.Load() == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("lease slots of %s not back after 5 s", key)
			}
		}
		n, err := r.rdb.ZCard(context.Background(), key).Result()
		servicetest.Must(t, err, "zcard")
		return int(n)
	}
	out := make([]Got, 1)
	_, err := s.Take([]Want{w}, 1, out)
	servicetest.Must(t, err, "take")
	return w.Limit - out[0].Remaining - 1
}

// fresh is a new per-client window key (its own hash tag) and a global one.
func fresh(prefix string) (client, global string) {
	n := keySeq.Add(1)
	return fmt.Sprintf("%s{rl:a:10.0.%d.%d}:r", prefix, n>>8, n&255), fmt.Sprintf("%s{rl:g:r%d}", prefix, n)
}

// Bursts admit exactly the limit: 30 rounds of 3L concurrent decisions on
// a fresh pair of windows (per-client and global, under two hash tags on a
// cluster), L in {1, 5}; nothing is written for a refused decision.
func TestStoreBurstExact(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s Store, prefix string) {
		for _, L := range []int{1, 5} {
			for round := range 30 {
				c, g := fresh(prefix)
				ws := []Want{{Key: c, Limit: L, Length: 10 * time.Second}, {Key: g, Limit: 1000, Length: 10 * time.Second}}
				var admitted, full atomic.Int64
				var wg sync.WaitGroup
				for range 3 * L {
					wg.Go(func() {
						out := make([]Got, 2)
						ok, err := s.Take(ws, 1, out)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							admitted.Add(1)
						} else if out[0].Full && !out[1].Full {
							full.Add(1)
						}
					})
				}
				wg.Wait()
				if admitted.Load() != int64(L) || full.Load() != int64(2*L) {
					t.Fatalf("L=%d round %d: %d admitted, %d refused by the client's window, want %d and %d",
						L, round, admitted.Load(), full.Load(), L, 2*L)
				}
				if n := written(t, s, g, ws[1]); n != L {
					t.Fatalf("the global window holds %d hits, want %d (refused decisions write nothing)", n, L)
				}
			}
		}
	})
}

// Every window of a decision or none: a full one refuses and names itself,
// the others keep their slots; weights count as that many hits; a weight
// above the limit never passes; Reset says when the weight fits again.
func TestStoreAllOrNothingAndWeights(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s Store, prefix string) {
		// Two windows of one client: one hash tag, one op even on a cluster
		// (across tags a cluster asks the later tag only if the earlier admits).
		a, _ := fresh(prefix)
		b := a + ":other"
		ws := []Want{{Key: a, Limit: 2, Length: time.Second}, {Key: b, Limit: 10, Length: time.Second}}
		out := make([]Got, 2)
		for i := range 4 {
			ok, err := s.Take(ws, 1, out)
			servicetest.Must(t, err, "take")
			if ok != (i < 2) {
				t.Fatalf("decision %d: admitted %v", i, ok)
			}
		}
		if !out[0].Full || out[1].Full || out[1].Remaining != 8 || out[0].Reset <= 0 || out[0].Reset > time.Second {
			t.Fatalf("after the limit: %+v, want the first full (reset within 1s), the second with 8 left", out)
		}
		w := []Want{{Key: b, Limit: 10, Length: time.Second}}
		one := make([]Got, 1)
		for _, tc := range []struct {
			weight int
			ok     bool
			left   int
		}{{4, true, 4}, {4, true, 0}, {1, false, 0}, {11, false, 0}} {
			ok, err := s.Take(w, tc.weight, one)
			servicetest.Must(t, err, "take")
			if ok != tc.ok || one[0].Remaining != tc.left || one[0].Full == tc.ok {
				t.Fatalf("weight %d: admitted %v %+v, want %v with %d left", tc.weight, ok, one[0], tc.ok, tc.left)
			}
		}
		time.Sleep(one[0].Reset / 10) // Reset of a weight above the limit is the window: never
		if ok, _ := s.Take(w, 1, one); ok {
			t.Fatal("admitted in a full window")
		}
		time.Sleep(one[0].Reset + 20*time.Millisecond)
		if ok, err := s.Take(w, 1, one); !ok || err != nil {
			t.Fatalf("not admitted after its Reset %v: %v", one[0].Reset, err)
		}
	})
}

// The sliding window holds in every interval: 16 goroutines hammer a
// window of 20 per 200 ms for a second; the admission moments the store
// reports (its own clock) never hold more than 20 in any 200 ms, and the
// run admits at least 2 windows' worth (of 5).
func TestStoreWorstInterval(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s Store, prefix string) {
		const L, W = 20, 200 * time.Millisecond
		k, _ := fresh(prefix)
		ws := []Want{{Key: k, Limit: L, Length: W}}
		var mu sync.Mutex
		var at []int64
		end := time.Now().Add(time.Second)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				out := make([]Got, 1)
				for time.Now().Before(end) {
					ok, err := s.Take(ws, 1, out)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						mu.Lock()
						at = append(at, out[0].At)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		slices.Sort(at)
		worst := 0
		for i, j := 0, 0; i < len(at); i++ {
			for at[i]-at[j] >= W.Microseconds() {
				j++
			}
			worst = max(worst, i-j+1)
		}
		t.Logf("%d admitted, worst %v interval %d (limit %d)", len(at), W, worst, L)
		if worst > L || len(at) < 2*L {
			t.Fatalf("worst interval %d > %d, or only %d admitted", worst, L, len(at))
		}
	})
}

// Leases stay exact and pay: two instances (each told 2 are live) with 8
// deciders each hammer a window for 2.5 s. Binding (400 per second): in
// every interval of a second at most 400 are admitted, judged both by the
// store's stamps (a leased slot's score) and by the deciders' own clock
// counting only decisions whose whole span (called → returned) lies inside
// the interval. Far from binding (10^6 per second): most decisions are made
// from leases.
func TestRedisLeasesExact(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	for _, L := range []int{400, 1000000} {
		m := NewMetrics(prometheus.NewRegistry())
		a, b := NewRedis(rdb, "a", 2*time.Second, m, nil), NewRedis(rdb, "b", 2*time.Second, m, nil)
		a.live.Store(2)
		b.live.Store(2)
		const W = time.Second
		_, g := fresh(prefix)
		ws := []Want{{Key: g, Limit: L, Length: W}}
		type span struct{ t0, t1, at int64 }
		var mu sync.Mutex
		var spans []span
		var decided atomic.Int64
		end := time.Now().Add(2500 * time.Millisecond)
		var wg sync.WaitGroup
		for _, s := range []*Redis{a, b} {
			for range 8 {
				wg.Go(func() {
					out := make([]Got, 1)
					for time.Now().Before(end) {
						t0 := mono(time.Now())
						ok, err := s.Take(ws, 1, out)
						t1 := mono(time.Now())
						decided.Add(1)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							mu.Lock()
							spans = append(spans, span{t0, t1, out[0].At})
							mu.Unlock()
						} else {
							time.Sleep(time.Millisecond)
						}
					}
				})
			}
		}
		wg.Wait()
		at := make([]int64, len(spans))
		for i, s := range spans {
			at[i] = s.at
		}
		slices.Sort(at)
		worstAt := 0
		for i, j := 0, 0; i < len(at); i++ {
			for at[i]-at[j] >= W.Microseconds() {
				j++
			}
			worstAt = max(worstAt, i-j+1)
		}
		slices.SortFunc(spans, func(x, y span) int { return int(x.t0 - y.t0) })
		worstSpan := 0
		for i, k := 0, 0; i < len(spans); i++ {
			n := 0
			for k = i; k < len(spans) && spans[k].t0 < spans[i].t0+int64(W); k++ {
				if spans[k].t1 < spans[i].t0+int64(W) {
					n++
				}
			}
			worstSpan = max(worstSpan, n)
			if L > 1000 {
				break // one interval is enough: the limit is far
			}
		}
		hits := counterValue(m.leaseHits)
		t.Logf("limit %d: %d decisions, %d admitted, %.0f from leases, %d script calls; worst 1s interval: %d by stamps, %d by spans",
			L, decided.Load(), len(spans), hits, m.Calls(), worstAt, worstSpan)
		if worstAt > L || worstSpan > L {
			t.Fatalf("worst interval %d (stamps) / %d (spans) > %d", worstAt, worstSpan, L)
		}
		if L == 400 && (len(spans) < 2*L || hits == 0) {
			t.Fatalf("%d admitted in 2.5 windows of %d, %.0f from leases (each window starts far from its limit)", len(spans), L, hits)
		}
		if L > 1000 && hits < 0.9*float64(decided.Load()) {
			t.Fatalf("%.0f of %d decisions from leases, want at least 90%% far from the limit", hits, decided.Load())
		}
	}
}

// Leases are all or nothing per decision. A decision with a window that
// does not lease (a per-client limit of 5) goes to Redis whole and leaves
// the global window's lease alone; a decision of two leasable windows, one
// without a slot here, gives the other's slot back to its lease at once;
// what is unspent at a lease's end goes back to Redis.
func TestRedisLeaseAllOrNothing(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	s := NewRedis(rdb, "a", 2*time.Second, NewMetrics(prometheus.NewRegistry()), nil)
	s.leases.spending = 10 * time.Second // the test's steps stay inside it
	_, g := fresh(prefix)
	global := Want{Key: g, Limit: 1000, Length: 10 * time.Second}
	left := func(key string) int {
		sh := s.leases.shard(key)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if l := sh.m[key]; l != nil {
			return l.cur.left + l.next.left
		}
		return -1
	}
	out := make([]Got, 2)
	for i := 0; left(g) <= 0; i++ { // decisions of the global window alone: the 4th asks
		if i == 10 {
			t.Fatalf("no lease after %d decisions", i)
		}
		if ok, err := s.Take([]Want{global}, 1, out[:1]); !ok || err != nil {
			t.Fatalf("decision %d: %v %v", i, ok, err)
		}
	}
	before, calls := left(g), s.m.Calls()
	c, _ := fresh(prefix)
	client := Want{Key: c, Limit: 5, Length: 10 * time.Second}
	tags := uint64(1) // one call on a node; one per hash tag on a cluster
	if s.cluster {
		tags = 2
	}
	if ok, err := s.Take([]Want{client, global}, 1, out); !ok || err != nil || left(g) != before || s.m.Calls() != calls+tags {
		t.Fatalf("a decision with a window that does not lease: %v %v, lease %d (want %d untouched), %d calls (want %d)",
			ok, err, left(g), before, s.m.Calls()-calls, tags)
	}
	other := Want{Key: g + ":other", Limit: 1000, Length: 10 * time.Second} // leasable, no lease yet
	if ok, err := s.Take([]Want{global, other}, 1, out); !ok || err != nil || left(g) != before {
		t.Fatalf("a decision whose second window has no slot here: %v %v, lease %d, want its slot back (%d)", ok, err, left(g), before)
	}
	// The spending time ends (forced: the timer's own call): what is left
	// goes back to Redis, and only that.
	ctx := context.Background()
	members := rdb.ZCard(ctx, g).Val()
	sh := s.leases.shard(g)
	sh.mu.Lock()
	name, unspent := sh.m[g].cur.name, sh.m[g].cur.left+sh.m[g].next.left
	next := sh.m[g].next.left
	sh.mu.Unlock()
	if next > 0 {
		t.Fatal("next slots asked for: the test expects only the current ones")
	}
	s.leases.expire(g, name)
	for deadline := time.Now().Add(5 * time.Second); s.backs.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := rdb.ZCard(ctx, g).Val(); n != members-int64(unspent) || left(g) != 0 {
		t.Fatalf("%d members after the lease's end, want %d - %d unspent; lease left %d", n, members, unspent, left(g))
	}
}

// A reply shorter than its ops need, leased counts included, is an error,
// never an index out of range on the flusher.
func TestDecodeShortReply(t *testing.T) {
	s := NewRedis(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "x", time.Second, NewMetrics(prometheus.NewRegistry()), nil)
	o := &op{ws: make([]Want, 2), asks: []int{4, 4}, leased: make([]grant, 2), out: make([]Got, 2)}
	c := redis.NewCmd(context.Background())
	c.SetVal([]any{int64(1), int64(1), int64(0), int64(10), int64(0), int64(4), int64(0), int64(10)}) // 8 of 10
	if err := s.decode(c, []*op{o}); err == nil {
		t.Fatal("a short reply decoded")
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// A decision of two leasable windows, one busy here (the global) and one
// not (a client seen once in a while), asks no lease: the global's slots
// could never be spent without the client's, and would only come back
// unspent (Redis and proxy work for nothing; make bench's purchase path).
func TestNoLeaseAskedThatCannotBeSpent(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	m := NewMetrics(prometheus.NewRegistry())
	s := NewRedis(rdb, "a", 2*time.Second, m, nil)
	_, g := fresh(prefix)
	global := Want{Key: g, Limit: 100000, Length: time.Second}
	out := make([]Got, 2)
	for i := range 200 { // 200 clients, one decision each, all through the global
		c := Want{Key: fmt.Sprintf("%s{rl:a:client%d}:r", prefix, i), Limit: 100, Length: time.Second}
		if ok, err := s.Take([]Want{c, global}, 1, out); !ok || err != nil {
			t.Fatalf("decision %d: %v %v", i, ok, err)
		}
	}
	if n := counterValue(m.leased); n != 0 {
		t.Fatalf("%v lease slots granted that no decision could spend", n)
	}
}

// A lease that comes back mostly unspent stops the asks of its window for a
// while (20 spending times): leases that do not pay cost Redis a grant and
// a give-back each.
func TestUnspentLeaseCoolsAsks(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	m := NewMetrics(prometheus.NewRegistry())
	s := NewRedis(rdb, "a", 2*time.Second, m, nil)
	s.leases.spending = 100 * time.Millisecond
	_, g := fresh(prefix)
	w := Want{Key: g, Limit: 100000, Length: 10 * time.Second}
	out := make([]Got, 1)
	for range 5 { // the 4th asks: a lease of 4, then one spent
		if ok, err := s.Take([]Want{w}, 1, out); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	granted := counterValue(m.leased)
	if granted == 0 {
		t.Fatal("no lease granted")
	}
	time.Sleep(s.leases.spending + 50*time.Millisecond) // it ends mostly unspent
	for range 8 {
		if ok, err := s.Take([]Want{w}, 1, out); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if n := counterValue(m.leased); n != granted {
		t.Fatalf("%v slots granted after a lease came back mostly unspent, want none within the cool-down", n-granted)
	}
}
