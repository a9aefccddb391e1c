package limiter

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

// Review (s3-revlim), finding: a request that waits for a held slot
// (waitSettled) is bounded by its own deadline, but the holder is not: a
// holder may keep its slot for up to two calls of its other window (here:
// it waits on another request's call, is one of its late waiters, then
// makes its own), each answered within redis_timeout. The waiter's deadline
// passes first, and it is decided by on_redis_error although Redis answered
// every call in time and its window was full. With on_redis_error = "open"
// that admits it past its limit: all-ip (5 per 10s) admits 6.
//
//	t=0      O  GET /api/x (api only): its api-ip call is held 0.8T in the hook
//	t≈0      H  POST /api/x (all + api): takes all-ip's last slot (a lease),
//	            waits for O's api-ip call (a late waiter of it)
//	t≈0      V  POST /x (all only): asks Redis: all-ip full, a slot held by H:
//	            V puts back and waits (deadline T)
//	t=0.8T   O admitted; its reply leaves a refill for H, who calls: held 0.8T
//	t=T      V's deadline: on_redis_error = open admits V (degraded)
//	t=1.6T   H admitted, spending all-ip's last slot: 6 admitted of 5
//
// Expected: V refused by all-ip (429), not decided by on_redis_error; no
// window over its limit.
func TestWaiterOutlivedByHolder(t *testing.T) {
	rdb, prefix := hookedRedis(t)
	const T = 500 * time.Millisecond
	const hold = 400 * time.Millisecond // < T: every call is answered within its timeout
	var toHold atomic.Int32
	entered := make(chan struct{}, 2)
	var failed atomic.Int32 // script calls that did not answer in time
	rdb.AddHook(&hook{pre: func(args []any) time.Duration {
		if argsContain(args, "}:api") && !argsContain(args, "}:all") && toHold.Add(-1) >= 0 {
			entered <- struct{}{}
			return hold
		}
		return 0
	}, post: func(cmd redis.Cmder) {
		if argsContain(cmd.Args(), "") && cmd.Err() != nil {
			failed.Add(1)
		}
	}})
	const W = 10 * time.Second
	m := NewMetrics(prometheus.NewRegistry())
	rs, err := Compile([]conf.Rule{
		{Name: "all", Methods: []string{"POST"}, PathPrefix: "/", OnRedisError: "open", PerIP: &conf.Window{Limit: 5, Window: conf.D(W)}},
		{Name: "api", PathPrefix: "/api/", OnRedisError: "open", PerIP: &conf.Window{Limit: 3, Window: conf.D(W)}},
	}, prefix, m)
	servicetest.Must(t, err, "compile")
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: T, Instance: "A", Metrics: m})
	check := func(method, path string) Decision {
		var d Decision
		l.Check(rs, Request{Method: []byte(method), Path: []byte(path), Addr: []byte("X")}, &d)
		return d
	}
	ctx := context.Background()
	allKey, apiKey := prefix+"{rl:a:X}:all", prefix+"{rl:a:X}:api"
	var bSeq int
	admittedByB := func(key string, n int) { // requests of X another instance admitted
		now := float64(redisNowUS(t, rdb))
		for range n {
			bSeq++
			servicetest.Must(t, rdb.ZAdd(ctx, key, redis.Z{Score: now, Member: fmt.Sprint("B:1:1:", bSeq)}).Err(), "zadd")
		}
		servicetest.Must(t, rdb.Expire(ctx, key, time.Minute).Err(), "expire")
	}
	admittedByB(allKey, 2)
	if d := check("POST", "/x"); d.Outcome != Admit { // R1: all-ip 2B + R1 + a lease of 1
		t.Fatalf("R1: %v %v", d.Outcome, d.Violated)
	}
	all := rs.list[0].clients.lookup([]byte("a:X"))
	all.mu.Lock()
	leased := slotsOf(all)
	all.mu.Unlock()
	if leased != 1 {
		t.Fatalf("all-ip: %d leased slots after R1, want 1", leased)
	}
	admittedByB(allKey, 1) // all-ip full in Redis (5), its last slot A's lease
	admittedByB(apiKey, 1) // api-ip: O takes 1 (no lease: cap (2-1)/2 = 0), 1 left for H
	admitted := 5 - 1      // all-ip so far: 3 B + R1; the lease is not spent yet

	toHold.Store(2)
	oDone, hDone, vDone := make(chan Decision, 1), make(chan Decision, 1), make(chan Decision, 1)
	go func() { oDone <- check("GET", "/api/x") }()
	<-entered
	go func() { hDone <- check("POST", "/api/x") }()
	for deadline := time.Now().Add(2 * time.Second); all.held.Load() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("H never took all-ip's lease")
		}
	}
	time.Sleep(5 * time.Millisecond) // H registers as a waiter of O's call
	go func() { vDone <- check("POST", "/x") }()
	dO, dH, dV := <-oDone, <-hDone, <-vDone
	t.Logf("O: %v %v; H: %v %v; V: %v %v degraded=%v; failed calls %d, breaker open %v",
		dO.Outcome, dO.Violated, dH.Outcome, dH.Violated, dV.Outcome, dV.Violated, dV.Degraded,
		failed.Load(), l.Degraded())
	if failed.Load() != 0 {
		t.Fatalf("a script call failed: the scenario needs Redis answering every call in time")
	}
	for _, d := range []Decision{dH, dV} {
		if d.Outcome == Admit {
			admitted++
		}
	}
	if dV.Degraded {
		t.Errorf("V decided by on_redis_error (%v) although Redis answered every call within redis_timeout: it outwaited its deadline for H's slot", dV.Outcome)
	}
	if admitted > 5 {
		t.Errorf("all-ip (5 per %v) admitted %d in one window", W, admitted)
	}
}

// Review (s3-revlim), finding: a window Redis reports full while a slot of
// it is held is refused anyway when the holder decides between the reply
// and the check, and its slot goes to back (given back in the next call)
// instead of the lease: refillAndDecide's last look sees no lease and
// nothing held, and refuses. The negative cache does not refuse while slots
// wait to be given back (takeLocal); the Redis path forgets it. Here H
// holds all-ip's last slot (a lease) past its time while its api-ip call is
// held; V asks for all-ip (full: H's slot counts) and its reply is held
// after Redis ran; H is refused by api-ip and gives its expired slot back
// (st.back); then V's reply comes in. V is refused by all-ip, whose missing
// slot was held and is being given back; V2, right after, is admitted with
// it (its call gives the slot back). V should have been admitted (or waited
// and looked again), as V2 is.
func TestRefusalAfterHeldSlotGivenBack(t *testing.T) {
	rdb, prefix := hookedRedis(t)
	var armH, armV atomic.Bool
	hEntered, hRelease := make(chan struct{}), make(chan struct{})
	vEntered, vRelease := make(chan struct{}), make(chan struct{})
	rdb.AddHook(&hook{pre: func(args []any) time.Duration {
		if argsContain(args, "}:api") && !argsContain(args, "}:all") && armH.CompareAndSwap(true, false) {
			close(hEntered)
			<-hRelease
		}
		return 0
	}, post: func(cmd redis.Cmder) {
		if args := cmd.Args(); argsContain(args, "}:all") && !argsContain(args, "}:api") && armV.CompareAndSwap(true, false) {
			close(vEntered)
			<-vRelease
		}
	}})
	const W = 10 * time.Second // lease min(W/2, 1s) = 1s
	m := NewMetrics(prometheus.NewRegistry())
	rs, err := Compile([]conf.Rule{
		{Name: "all", PathPrefix: "/", OnRedisError: "closed", PerIP: &conf.Window{Limit: 5, Window: conf.D(W)}},
		{Name: "api", PathPrefix: "/api/", OnRedisError: "closed", PerIP: &conf.Window{Limit: 3, Window: conf.D(W)}},
	}, prefix, m)
	servicetest.Must(t, err, "compile")
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: 5 * time.Second, Instance: "A", Metrics: m})
	check := func(path string) Decision {
		var d Decision
		l.Check(rs, Request{Method: []byte("POST"), Path: []byte(path), Addr: []byte("X")}, &d)
		return d
	}
	ctx := context.Background()
	allKey, apiKey := prefix+"{rl:a:X}:all", prefix+"{rl:a:X}:api"
	var bSeq int
	admittedByB := func(key string, n int) {
		now := float64(redisNowUS(t, rdb))
		for range n {
			bSeq++
			servicetest.Must(t, rdb.ZAdd(ctx, key, redis.Z{Score: now, Member: fmt.Sprint("B:1:1:", bSeq)}).Err(), "zadd")
		}
		servicetest.Must(t, rdb.Expire(ctx, key, time.Minute).Err(), "expire")
	}
	admittedByB(allKey, 2)
	if d := check("/x"); d.Outcome != Admit {
		t.Fatalf("R1: %v %v", d.Outcome, d.Violated)
	}
	leasedAt := time.Now()
	all := rs.list[0].clients.lookup([]byte("a:X"))
	all.mu.Lock()
	leased := slotsOf(all)
	all.mu.Unlock()
	if leased != 1 {
		t.Fatalf("all-ip: %d leased slots after R1, want 1", leased)
	}
	admittedByB(allKey, 1) // all-ip full in Redis, its last slot A's lease
	admittedByB(apiKey, 3) // api-ip full
	armH.Store(true)
	hDone := make(chan Decision, 1)
	go func() { hDone <- check("/api/x") }() // takes the lease; its api-ip call is held
	<-hEntered
	time.Sleep(time.Until(leasedAt.Add(1100 * time.Millisecond))) // H's slot runs out while held
	armV.Store(true)
	vDone := make(chan Decision, 1)
	go func() { vDone <- check("/x") }()
	<-vEntered // V's all-ip call ran in Redis (full: H's slot counts); its reply is held
	close(hRelease)
	dH := <-hDone // refused by api-ip; its expired slot waits in all-ip's back
	all.mu.Lock()
	back, held := spanSlots(all.back), all.held.Load()
	all.mu.Unlock()
	close(vRelease)
	dV := <-vDone
	dV2 := check("/x")
	t.Logf("H: %v %v; all-ip then: %d slots to give back, %d held; V: %v %v; V2: %v %v",
		dH.Outcome, dH.Violated, back, held, dV.Outcome, dV.Violated, dV2.Outcome, dV2.Violated)
	if dH.Outcome != Limited || len(dH.Violated) != 1 || dH.Violated[0] != "api-ip" {
		t.Fatalf("H: %v %v, want refused by api-ip", dH.Outcome, dH.Violated)
	}
	if back != 1 || held != 0 {
		t.Fatalf("all-ip after H: %d to give back, %d held; the scenario needs H's slot in back", back, held)
	}
	if dV.Outcome != Admit {
		t.Errorf("V: %v %v: refused by all-ip, whose missing slot was held by H when Redis answered and is being given back (V2 then: %v)",
			dV.Outcome, dV.Violated, dV2.Outcome)
	}
}

// Review (s3-revlim), finding: the sweeper's give-back of a state's expired
// lease that fails (kept "for the next call or sweep") is put back into the
// state it was taken from — but that state may have been evicted while the
// call was in flight (the sweeper holds no use of it). The spans then live
// in a state no table holds, and are never given back: the client's window
// counts the unspent slots until they slide out (score + window), not
// "within a second". Here X's lease expires, the sweep's give-back call
// times out after a new client of X's shard evicted X, and a later sweep
// leaves X's log holding the lease.
func TestFailedGiveBackOfEvictedStateKept(t *testing.T) {
	rdb, prefix := hookedRedis(t)
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	rdb.AddHook(&hook{pre: func(args []any) time.Duration {
		if argsContain(args, "{rl:a:X}") && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release // past the call's timeout: it fails before Redis runs it
		}
		return 0
	}})
	m := NewMetrics(prometheus.NewRegistry())
	rs, err := Compile([]conf.Rule{{Name: "r", PathPrefix: "/", OnRedisError: "closed",
		PerIP: &conf.Window{Limit: 5, Window: conf.D(10 * time.Second)}}}, prefix, m)
	servicetest.Must(t, err, "compile")
	const T = 300 * time.Millisecond
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: T, Instance: "A", Metrics: m, MaxClientStates: 64})
	l.SetRules(rs)
	tab := rs.list[0].clients
	key := rs.Key(rs.list[0].Windows[0], []byte("a:X"))
	if d := chk(l, rs, "X"); d.Outcome != Admit {
		t.Fatalf("X: %v", d.Outcome)
	}
	if n := rdb.ZCard(context.Background(), key).Val(); n != 2 {
		t.Fatalf("X's log holds %d, want 2 (its request and a lease of 1)", n)
	}
	// A client of X's shard (one state per shard at a bound of 64).
	shardOf := func(c string) uint64 { return maphash.Bytes(tab.seed, []byte("a:"+c)) & (tableShards - 1) }
	other := ""
	for i := 0; other == ""; i++ {
		if c := fmt.Sprint("n", i); shardOf(c) == shardOf("X") {
			other = c
		}
	}
	armed.Store(true)
	swept := make(chan struct{})
	later := time.Now().Add(2 * time.Second) // X's 1s lease has run out by then
	go func() { l.Sweep(later); close(swept) }()
	<-entered // the give-back call is held until it times out
	if d := chk(l, rs, other); d.Outcome != Admit {
		t.Fatalf("%s: %v", other, d.Outcome)
	}
	if tab.lookup([]byte("a:X")) != nil {
		t.Fatal("X was not evicted: the scenario needs it gone")
	}
	time.Sleep(T + 50*time.Millisecond)
	close(release)
	<-swept
	l.Sweep(later)
	l.Sweep(later.Add(time.Second))
	if n := rdb.ZCard(context.Background(), key).Val(); n != 1 {
		t.Errorf("X's log holds %d after the failed give-back and two more sweeps, want 1 (its request; the lease given back)", n)
	}
}
