package limiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/redisnodes"
	"github.com/seckill/seckill/internal/servicetest"
)

func compile(t testing.TB, prefix string, m *Metrics, rules ...conf.Rule) *Rules {
	t.Helper()
	rs, err := Compile(rules, prefix, m)
	servicetest.Must(t, err, "compile")
	return rs
}

func win(limit int, w time.Duration) *conf.Window {
	return &conf.Window{Limit: limit, Window: conf.D(w)}
}

func check(l *Limiter, rs *Rules, addr string) Decision {
	var d Decision
	l.Check(rs, Request{Method: []byte("GET"), Path: []byte("/x"), Addr: []byte(addr)}, &d)
	return d
}

func histCount(t testing.TB, h prometheus.Histogram) uint64 {
	t.Helper()
	var pm dto.Metric
	servicetest.Must(t, h.Write(&pm), "read histogram")
	return pm.GetHistogram().GetSampleCount()
}

func value(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	c.Collect(ch)
	close(ch)
	sum := 0.0
	for m := range ch {
		var pm dto.Metric
		servicetest.Must(t, m.Write(&pm), "read metric")
		sum += pm.GetCounter().GetValue()
	}
	return sum
}

// A crowd of 2,000 new clients deciding at once shares calls: far fewer
// Redis calls than decisions, every first request admitted, none shed or
// fallen back, and each decision within the bound.
func TestCrowdSharesCalls(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	m := NewMetrics(prometheus.NewRegistry())
	rs := compile(t, prefix, m, conf.Rule{Name: "r", PathPrefix: "/", PerIP: win(5, time.Second), Global: win(1_000_000, time.Second)})
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: 2 * time.Second, Instance: "crowd", Metrics: m})
	const n = 2000
	var slow atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			d := check(l, rs, fmt.Sprintf("10.1.%d.%d", i>>8, i&255))
			if d.Outcome != Admit || d.Degraded {
				t.Errorf("client %d: outcome %v degraded %v", i, d.Outcome, d.Degraded)
			}
			if time.Since(t0) > 4*time.Second {
				slow.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	// Round trips, not script calls: on a cluster every client's tag is a
	// call of its own, and the calls of a batch share one pipeline.
	trips := histCount(t, m.latency)
	t.Logf("%d first decisions: %d round trips, %d script calls", n, trips, m.Calls())
	if trips > n/4 {
		t.Fatalf("%d round trips for %d decisions: the crowd's decisions did not share them", trips, n)
	}
	if slow.Load() > 0 || value(t, m.fallbacks) != 0 || value(t, m.shed) != 0 {
		t.Fatalf("%d decisions past the bound, %v fallbacks, %v shed", slow.Load(), value(t, m.fallbacks), value(t, m.shed))
	}
}

// hold blocks every script call until released (it ignores the call's
// deadline, as a flusher stuck on a slow Redis would), counting them.
type hold struct {
	release chan struct{}
	held    atomic.Int32
	only    int32 // hold this many calls (the first ones), let the rest through; 0: all
	silent  bool  // PINGs get no answer within their deadline either
}

func (h *hold) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *hold) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && (h.only == 0 || h.held.Load() < h.only) {
			h.held.Add(1)
			<-h.release
		} else if cmd.Name() == "ping" && h.silent {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}
func (h *hold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The one wait the limiter keeps, forced: every flusher is stuck on a call
// and Redis answers nothing (PINGs neither) for longer than a decision's
// bound. Every decision, in a call or queued behind, falls back to
// on_redis_error (as a timeout) within about twice the timeout of when it
// was asked; none is shed (a silent Redis is not load) and none waits for
// the calls. Released late, the calls answer decisions nobody waits for any
// more: their hits go back to the windows (the waiters were told nothing).
func TestSilentRedisFallsBackWithinBound(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.RedisNode(t)
	h := &hold{release: make(chan struct{}), silent: true}
	rdb.AddHook(h)
	m := NewMetrics(prometheus.NewRegistry())
	rs := compile(t, prefix, m, conf.Rule{Name: "r", PathPrefix: "/", PerIP: win(5, time.Second)})
	const timeout = 100 * time.Millisecond
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: timeout, Instance: "silent", Metrics: m})
	type ended struct {
		d    Decision
		took time.Duration
	}
	out := make(chan ended, flushers+8)
	ask := func(ip string) {
		t0 := time.Now()
		d := check(l, rs, ip)
		out <- ended{d, time.Since(t0)}
	}
	for i := range flushers { // one call each: every flusher stuck
		go ask(fmt.Sprint("10.2.0.", i))
		for h.held.Load() < int32(i+1) {
			time.Sleep(time.Millisecond)
		}
	}
	for i := range 8 {
		go ask(fmt.Sprint("10.2.1.", i))
	}
	for range flushers + 8 {
		e := <-out
		if !e.d.Degraded || e.d.Outcome == Shed {
			t.Fatalf("silent Redis: a decision not fallen back: %+v", e.d)
		}
		if e.took > 2*timeout+50*time.Millisecond {
			t.Fatalf("a decision took %v, bound about %v", e.took, 2*timeout)
		}
	}
	if value(t, m.shed) != 0 || value(t, m.fallbacks) != flushers+8 {
		t.Fatalf("%v shed, %v fallen back, want 0 and %d", value(t, m.shed), value(t, m.fallbacks), flushers+8)
	}
	close(h.release) // the held calls now reach Redis and admit their ops
	for i := range flushers {
		awaitGivenBack(t, rdb, rs, fmt.Sprint("10.2.0.", i))
	}
}

// awaitGivenBack waits (5 s at most) until the per-IP window of the first
// rule holds no hit of client addr: a decision nobody waits for any more
// gave its hits back.
func awaitGivenBack(t *testing.T, rdb redis.UniversalClient, rs *Rules, addr string) {
	t.Helper()
	w := rs.list[0].Windows[0]
	key := w.Key(appendClientKey(nil, w, Request{Addr: []byte(addr)}))
	deadline := time.Now().Add(5 * time.Second)
	for n := rdb.ZCard(context.Background(), key).Val(); n != 0; n = rdb.ZCard(context.Background(), key).Val() {
		if time.Now().After(deadline) {
			t.Fatalf("client %s: %d hits of a decision nobody waited for stayed in its window", addr, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A reply later than the timeout but within a decision's bound is an exact
// answer, used as it is: on a host saturated by a crowd the reader of a
// reply that came in time runs late, and neither a shed nor a fallback is
// right then. Forced: the call held 1.2 timeouts.
func TestLateReplyWithinBoundIsUsed(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.RedisNode(t)
	h := &hold{release: make(chan struct{}), only: 1}
	rdb.AddHook(h)
	m := NewMetrics(prometheus.NewRegistry())
	rs := compile(t, prefix, m, conf.Rule{Name: "r", PathPrefix: "/", PerIP: win(5, time.Second)})
	// 1.2 timeouts held leaves 0.8 of one for the reply to be read before
	// the bound, on a box busy with make test's other packages
	const timeout = 250 * time.Millisecond
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: timeout, Instance: "late", Metrics: m})
	go func() {
		for h.held.Load() < 1 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(timeout * 6 / 5)
		close(h.release)
	}()
	d := check(l, rs, "10.6.2.1")
	if d.Outcome != Admit || d.Degraded || value(t, m.shed) != 0 || value(t, m.fallbacks) != 0 || l.Degraded() {
		t.Fatalf("late reply within the bound: %+v, %v shed, %v fallbacks", d, value(t, m.shed), value(t, m.fallbacks))
	}
}

// A decision whose call is held past its bound while Redis answers another
// call met load, not a failure: shed (503), not handed to on_redis_error,
// the breaker closed; its hit, written when the call finally runs, goes
// back. Forced: the first call held past the bound while a second one goes
// through.
func TestHeldPastBoundWhileRedisAnswersIsShed(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.RedisNode(t)
	h := &hold{release: make(chan struct{}), only: 1}
	rdb.AddHook(h)
	m := NewMetrics(prometheus.NewRegistry())
	rs := compile(t, prefix, m, conf.Rule{Name: "r", PathPrefix: "/", PerIP: win(5, time.Second)})
	const timeout = 100 * time.Millisecond
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: timeout, Instance: "slow", Metrics: m})
	held := make(chan Decision, 1)
	go func() { held <- check(l, rs, "10.6.0.1") }()
	for h.held.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	if d := check(l, rs, "10.6.0.2"); d.Outcome != Admit || d.Degraded {
		t.Fatalf("the call beside the held one: %+v", d)
	}
	d := <-held
	if d.Outcome != Shed || d.Degraded || value(t, m.fallbacks) != 0 || value(t, m.shed.WithLabelValues("wait_timeout")) != 1 || l.Degraded() {
		t.Fatalf("held past the bound while Redis answered: %+v, %v fallbacks, %v shed", d, value(t, m.fallbacks), value(t, m.shed))
	}
	close(h.release)
	awaitGivenBack(t, rdb, rs, "10.6.0.1")
}

// A lone call held past the bound, while Redis answers the PING sent once
// the timeout passed, met load too (with leases few calls are in flight):
// shed, not a fallback, the breaker closed. (A Redis that answers neither:
// TestSilentRedisFallsBackWithinBound, and the edge's TestRedisFaults with
// Redis paused.)
func TestLoneHeldCallWithRedisAliveIsShed(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.RedisNode(t)
	h := &hold{release: make(chan struct{}), only: 1}
	rdb.AddHook(h)
	t.Cleanup(func() { close(h.release) })
	m := NewMetrics(prometheus.NewRegistry())
	rs := compile(t, prefix, m, conf.Rule{Name: "r", PathPrefix: "/", PerIP: win(5, time.Second)})
	const timeout = 100 * time.Millisecond
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: timeout, Instance: "lone", Metrics: m})
	d := check(l, rs, "10.6.1.1")
	if d.Outcome != Shed || d.Degraded || value(t, m.fallbacks) != 0 || value(t, m.shed.WithLabelValues("wait_timeout")) != 1 || l.Degraded() {
		t.Fatalf("lone held call, Redis alive: %+v, %v fallbacks, %v shed", d, value(t, m.fallbacks), value(t, m.shed))
	}
}

// While Redis cannot be reached each rule does its on_redis_error, and the
// fallbacks are counted by reason: errors first, then breaker_open once the
// circuit opens; "local" limits in-process at limit / live, "closed" is 503.
func TestFallbackByReason(t *testing.T) {
	t.Parallel()
	dead := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", servicetest.FreePort(t)), MaxRetries: -1})
	m := NewMetrics(prometheus.NewRegistry())
	rs := compile(t, "p:", m, conf.Rule{Name: "loc", PathPrefix: "/x", PerIP: win(3, time.Minute)},
		conf.Rule{Name: "shut", PathPrefix: "/closed", OnRedisError: "closed", Global: win(100, time.Minute)})
	l := New(Config{Redis: dead, KeyPrefix: "p:", Timeout: 200 * time.Millisecond, Instance: "dead", Metrics: m})
	admitted := 0
	for range 10 {
		d := check(l, rs, "10.3.0.1")
		if !d.Degraded {
			t.Fatalf("not degraded: %+v", d)
		}
		if d.Outcome == Admit {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("local fallback admitted %d of 10, want 3", admitted)
	}
	var d Decision
	l.Check(rs, Request{Method: []byte("GET"), Path: []byte("/closed"), Addr: []byte("10.3.0.2")}, &d)
	if d.Outcome != Unavailable {
		t.Fatalf("closed rule: %v, want Unavailable", d.Outcome)
	}
	// A refused dial within the call's deadline is an error; one the
	// pool's dial retries carry past it, a timeout.
	errs := value(t, m.fallbacks.WithLabelValues("error")) + value(t, m.fallbacks.WithLabelValues("timeout"))
	open := value(t, m.fallbacks.WithLabelValues("breaker_open"))
	if errs < breakerThreshold || open < 1 || errs+open != 11 {
		t.Fatalf("fallbacks: %v error or timeout, %v breaker_open, want >= %d, >= 1, 11 in all", errs, open, breakerThreshold)
	}
}

// The negative cache: once the store says a window is full, requests are
// refused without a Redis call until its oldest hit slides out, with
// Retry-After counting down; then the next one is admitted.
func TestNegativeCache(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	m := NewMetrics(prometheus.NewRegistry())
	rs := compile(t, prefix, m, conf.Rule{Name: "r", PathPrefix: "/", PerIP: win(2, 300*time.Millisecond)})
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: 2 * time.Second, Instance: "neg", Metrics: m})
	for i := range 2 {
		if d := check(l, rs, "10.4.0.1"); d.Outcome != Admit {
			t.Fatalf("request %d: %v", i, d.Outcome)
		}
	}
	calls := m.Calls()
	var last time.Duration
	for i := range 50 {
		d := check(l, rs, "10.4.0.1")
		if d.Outcome != Limited || d.RetryAfter <= 0 || d.RetryAfter > 300*time.Millisecond || len(d.Violated) != 1 {
			t.Fatalf("refusal %d: %+v", i, d)
		}
		last = d.RetryAfter
	}
	if m.Calls() != calls {
		t.Fatalf("%d Redis calls for refusals the negative cache knew", m.Calls()-calls)
	}
	time.Sleep(last + 10*time.Millisecond)
	if d := check(l, rs, "10.4.0.1"); d.Outcome != Admit {
		t.Fatalf("after Retry-After: %+v", d)
	}
}

// The negative cache keeps each rule within max_client_states: a flood of
// clients each refused once holds at most the bound, the rest evicted.
func TestClientStatesBounded(t *testing.T) {
	t.Parallel()
	const max, flood = 640, 3000
	m := NewMetrics(prometheus.NewRegistry())
	rs := compile(t, "b:", m, conf.Rule{Name: "r", PathPrefix: "/", PerIP: win(1, time.Hour)})
	l := New(Config{Instance: "mem", Metrics: m, MaxClientStates: max})
	l.SetRules(rs)
	for i := range flood {
		a := fmt.Sprint("c", i)
		check(l, rs, a)
		if d := check(l, rs, a); d.Outcome != Limited {
			t.Fatalf("client %s: second request %v", a, d.Outcome)
		}
	}
	if n := l.ClientStates(); n > max {
		t.Fatalf("%d negative-cache entries, bound %d", n, max)
	}
	if e := value(t, m.evicted); e < flood-max {
		t.Fatalf("%v evicted, want at least %d", e, flood-max)
	}
}

// A refusal from the negative cache allocates nothing.
func TestNegativeCacheAllocs(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	rs := compile(t, "a:", m, conf.Rule{Name: "r", PathPrefix: "/", PerIP: win(1, time.Hour), Global: win(100, time.Hour)})
	l := New(Config{Instance: "mem", Metrics: m})
	req := Request{Method: []byte("GET"), Path: []byte("/x"), Addr: []byte("10.5.0.1")}
	var d Decision
	l.Check(rs, req, &d)
	d.Reset()
	if l.Check(rs, req, &d); d.Outcome != Limited {
		t.Fatal("second request in an hour-long window of 1 admitted")
	}
	if a := testing.AllocsPerRun(200, func() { d.Reset(); l.Check(rs, req, &d) }); a != 0 {
		t.Errorf("negative-cache refusal: %v allocs, want 0", a)
	}
}

// Decision paths, side by side: a new client's first decision (a Redis
// call, batched with whoever waits), a known client far from its limits
// (decided from leases), a refusal from the negative cache, and the memory
// store.
func BenchmarkCheck(b *testing.B) {
	rdb, prefix := servicetest.Redis(b)
	big := win(10_000_000, time.Second)
	for _, bc := range []struct {
		name   string
		redis  bool
		limit  int
		client func(i int64) string
	}{
		{"new-client", true, 5, func(i int64) string { return fmt.Sprint("n", i) }},
		{"lease-hit", true, 10_000_000, func(int64) string { return "k" }},
		{"negative-cache", true, 1, func(int64) string { return "full" }},
		{"memory-new-client", false, 5, func(i int64) string { return fmt.Sprint("n", i) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := NewMetrics(prometheus.NewRegistry())
			p := fmt.Sprintf("%sb%d:", prefix, time.Now().UnixNano())
			rs := compile(b, p, m, conf.Rule{Name: "b", PathPrefix: "/", PerIP: win(bc.limit, time.Minute), Global: big})
			c := Config{KeyPrefix: p, Timeout: time.Second, Instance: "bench", Metrics: m}
			if bc.redis {
				c.Redis = rdb
			}
			l := New(c)
			var seq atomic.Int64
			us0 := scriptMicros(b, rdb)
			b.ReportAllocs()
			b.SetParallelism(32) // a crowd: decisions wait together
			b.RunParallel(func(pb *testing.PB) {
				var d Decision
				req := Request{Method: []byte("GET"), Path: []byte("/x")}
				for pb.Next() {
					d.Reset()
					req.Addr = []byte(bc.client(seq.Add(1)))
					l.Check(rs, req, &d)
					if d.Degraded || d.Outcome == Shed {
						b.Fatalf("degraded %v, outcome %v", d.Degraded, d.Outcome)
					}
				}
			})
			b.ReportMetric(float64(m.Calls())/float64(b.N), "redis-calls/op")
			if bc.redis {
				b.ReportMetric((scriptMicros(b, rdb)-us0)/float64(b.N), "redis-us/op")
			}
		})
	}
}

// scriptMicros is the time Redis spent in scripts so far (INFO
// commandstats; summed over a cluster's nodes), µs.
func scriptMicros(b testing.TB, rdb redis.UniversalClient) float64 {
	var mu sync.Mutex
	us := 0.0
	err := redisnodes.EachMaster(context.Background(), rdb, func(ctx context.Context, n redis.Cmdable) error {
		info, err := n.Info(ctx, "commandstats").Result()
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "cmdstat_eval") {
				_, rest, _ := strings.Cut(line, "usec=")
				v, _ := strconv.ParseFloat(strings.Split(rest, ",")[0], 64)
				mu.Lock()
				us += v
				mu.Unlock()
			}
		}
		return err
	})
	servicetest.Must(b, err, "commandstats")
	return us
}

// A window left without a free slot while another instance holds leased
// slots of it is known full only until that lease's spending time ends (its
// unspent slots come back then), not until the oldest hit slides out: the
// negative cache must not refuse once they are back. A leases (one live
// instance for it), B never does and takes the last slot.
func TestLastSlotResetHeedsLeases(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	rs := compile(t, prefix, NewMetrics(prometheus.NewRegistry()), conf.Rule{Name: "r", PathPrefix: "/", PerIP: win(64, 10*time.Second)})
	a := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: 2 * time.Second, Instance: "lA", Metrics: NewMetrics(prometheus.NewRegistry())})
	a.redis.leases.spending = time.Second // B fills the window within it, even on a busy box
	mB := NewMetrics(prometheus.NewRegistry())
	b := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: 2 * time.Second, Instance: "lB", Metrics: mB})
	b.redis.live.Store(9) // 2 x 9 x 4 > 64: B never leases
	const ip = "10.77.0.1"
	for i := range 6 {
		if d := check(a, rs, ip); d.Outcome != Admit {
			t.Fatalf("A %d: %+v", i, d)
		}
	}
	if counterValue(a.m.leased) == 0 {
		t.Fatal("A holds no lease: the test needs one")
	}
	key := rs.list[0].Windows[0].Key(appendClientKey(nil, rs.list[0].Windows[0], Request{Addr: []byte(ip)}))
	ctx := context.Background()
	for i := 0; rdb.ZCard(ctx, key).Val() < 64; i++ {
		if d := check(b, rs, ip); d.Outcome != Admit {
			t.Fatalf("B %d refused before the window filled: %+v", i, d)
		}
	}
	time.Sleep(a.redis.leases.spending + 100*time.Millisecond) // A's lease ends, its unspent slots go back
	free := 64 - rdb.ZCard(ctx, key).Val()
	if free == 0 {
		t.Fatal("A's unspent slots did not come back")
	}
	if d := check(b, rs, ip); d.Outcome != Admit { // its oldest hit slides out only in ~9 s
		t.Fatalf("%d slots free, yet B refused (negative cache for %v)", free, d.RetryAfter)
	}
}

// The bound holds when Redis is a black hole: a decision queued behind four
// stuck calls, then timing out itself, then judged, ends within about twice
// the timeout of when it was asked.
func TestBlackHoleBound(t *testing.T) {
	t.Parallel()
	// Redis behind the test's fault proxy, every reply held a minute.
	real, _ := servicetest.RedisNode(t)
	fp, err := faultnet.Listen("127.0.0.1:0", real.Options().Addr)
	servicetest.Must(t, err, "fault proxy")
	t.Cleanup(func() { _ = fp.Close() })
	fp.Set(faultnet.Faults{Down: faultnet.Flow{DelayRate: 1, Delay: time.Minute}})
	rdb := redis.NewClient(&redis.Options{Addr: fp.Addr(), ContextTimeoutEnabled: true, Protocol: 2, MaxRetries: -1, DisableIdentity: true})
	t.Cleanup(func() { _ = rdb.Close() })
	const T = 100 * time.Millisecond
	s := NewRedis(rdb, "blk", T, NewMetrics(prometheus.NewRegistry()), nil)
	w := func(i int) []Want { return []Want{{Key: fmt.Sprint("bh:", i), Limit: 5, Length: time.Second}} }
	for i := range flushers {
		go func() { _, _ = s.Take(w(i), 1, make([]Got, 1)) }()
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond)
	t0 := time.Now()
	_, err = s.Take(w(99), 1, make([]Got, 1))
	if took := time.Since(t0); took > 2*T+30*time.Millisecond || err == nil {
		t.Fatalf("took %v (bound about %v), err %v", took, 2*T, err)
	}
}
