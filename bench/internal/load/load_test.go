package load

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/servicetest"
)

// shop is a tiny in-process stand-in for proxy + backend speaking the
// contract of docs/contract.md, so the load generator's own behaviour (addresses,
// retries, idempotency keys, pacing) can be observed without the stack.
type shop struct {
	mu       sync.Mutex
	stock    int
	orders   map[string]string // user:key -> order id
	failOnce map[string]bool   // keys already answered 503 once
	peers    map[string]int    // remote IP -> requests
	buyers   map[string]string // X-User-ID -> the remote IP of its purchases ("*" when it used two)
	bought   map[string]int    // remote IP -> purchase requests
	attempts map[string]int    // user:key -> purchase attempts
	delay    time.Duration
	every503 int // every n-th new key gets one 503 first
	newKeys  int
	unkeyed  int // purchases without an Idempotency-Key
}

func newShop(stock int) *shop {
	return &shop{stock: stock, orders: map[string]string{}, failOnce: map[string]bool{},
		peers: map[string]int{}, buyers: map[string]string{}, bought: map[string]int{}, attempts: map[string]int{}}
}

func (s *shop) handle(ctx *fasthttp.RequestCtx) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.delay > 0 {
		time.Sleep(s.delay) // under the lock: the shop serves one at a time
	}
	host, _, _ := net.SplitHostPort(ctx.RemoteAddr().String())
	s.peers[host]++
	ctx.SetContentType("application/json")
	path := string(ctx.Path())
	if string(ctx.Method()) == "GET" {
		fmt.Fprintf(ctx, `{"activity_id":1,"stock":%d}`, s.stock)
		return
	}
	if !strings.HasSuffix(path, "/purchase") {
		ctx.SetStatusCode(404)
		return
	}
	user := string(ctx.Request.Header.Peek("X-User-ID"))
	if ip, ok := s.buyers[user]; ok && ip != host {
		s.buyers[user] = "*"
	} else {
		s.buyers[user] = host
	}
	s.bought[host]++
	k := user + ":" + string(ctx.Request.Header.Peek("Idempotency-Key"))
	if !strings.HasSuffix(k, ":") {
		s.attempts[k]++
	} else {
		s.unkeyed++
	}
	if id, ok := s.orders[k]; ok {
		ctx.SetStatusCode(202)
		fmt.Fprintf(ctx, `{"order_id":%q,"status":"pending"}`, id)
		return
	}
	if s.every503 > 0 && !s.failOnce[k] {
		s.failOnce[k] = true
		s.newKeys++
		if s.newKeys%s.every503 == 0 {
			ctx.SetStatusCode(503)
			ctx.Response.Header.Set("Retry-After", "0")
			ctx.SetBodyString(`{"code":"unavailable"}`)
			return
		}
	}
	if s.stock == 0 {
		ctx.SetStatusCode(409)
		ctx.SetBodyString(`{"code":"sold_out"}`)
		return
	}
	s.stock--
	id := fmt.Sprintf("o%d", len(s.orders)+1)
	s.orders[k] = id
	ctx.SetStatusCode(202)
	fmt.Fprintf(ctx, `{"order_id":%q,"status":"pending"}`, id)
}

func serve(t *testing.T, s *shop) string {
	t.Helper()
	return "http://" + servicetest.Serve(t, &fasthttp.Server{Handler: s.handle, Concurrency: 10000})
}

func baseConfig(url string) Config {
	return Config{Targets: []string{url}, ActivityID: 1, Users: 500, UserPrefix: "u",
		Warmup: 50 * time.Millisecond, Rush: 300 * time.Millisecond, Tail: 100 * time.Millisecond,
		Connections: 8, RequestTimeout: 5 * time.Second, Retries: 3, MaxInFlight: 256}
}

func run(t *testing.T, cfg Config) *Recorder {
	t.Helper()
	rec := NewRecorder(time.Now(), 50*time.Millisecond, cfg.Users, len(cfg.Sources))
	r, err := NewRunner(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Run(ctx, r.Plan(rec.Start())); err != nil {
		t.Fatal(err)
	}
	return rec
}

// Requests leave from the configured loopback addresses, so a proxy sees
// that many distinct peers; hot users share a few of them. A fixed plan (an
// open loop: 400 purchases at 1000/s, sent however late a loaded machine
// gets to them), counted per request: every user sends from one address,
// the hot half of the users from the one hot address.
func TestDistinctSourceAddresses(t *testing.T) {
	s := newShop(1 << 30)
	cfg := baseConfig(serve(t, s))
	src, err := SourceAddrs("127.3.0.0/16", 40)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Sources, cfg.HotShare = src, 0.5
	cfg.Rate, cfg.Rush, cfg.Tail = 1000, 300*time.Millisecond, 100*time.Millisecond
	snap := run(t, cfg).Snapshot()
	s.mu.Lock()
	defer s.mu.Unlock()
	// The warm-up reads through every source once at least.
	if len(s.peers) != 40 {
		t.Errorf("server saw %d distinct peers, want 40: %v", len(s.peers), s.peers)
	}
	for ip := range s.peers {
		if !strings.HasPrefix(ip, "127.3.0.") {
			t.Errorf("peer %s outside the source net", ip)
		}
	}
	purchases := 0
	for _, n := range s.bought {
		purchases += n
	}
	if purchases != 400 {
		t.Fatalf("%d purchase requests, want the plan's 400", purchases)
	}
	// The recorder counts the addresses purchases used: users are drawn at
	// random, so one of the 39 cold addresses may have drawn none of the 400
	// (about one run in five); the server counts the same addresses.
	if snap.DistinctIPs != int64(len(s.bought)) {
		t.Errorf("recorder counted %d addresses, the server saw purchases from %d", snap.DistinctIPs, len(s.bought))
	}
	// Half the users sit behind the one hot address (40/100 → 1), the other
	// half spread over the other 39.
	const hotUsers = 250 // HotShare × Users
	for user, ip := range s.buyers {
		i, err := strconv.Atoi(strings.TrimPrefix(user, cfg.UserPrefix))
		if err != nil {
			t.Fatalf("user %q", user)
		}
		switch hot := i < hotUsers; {
		case ip == "*":
			t.Errorf("user %s sent from two addresses", user)
		case hot && ip != "127.3.0.1":
			t.Errorf("hot user %s sent from %s, want the hot address", user, ip)
		case !hot && ip == "127.3.0.1":
			t.Errorf("user %s sent from the hot address", user)
		}
	}
	// So the hot address carries about half the purchases (200 ± 10), any
	// other about 400/500 × 6.4 users ≈ 5.
	hot := s.bought["127.3.0.1"]
	for ip, n := range s.bought {
		if ip != "127.3.0.1" && n*4 > hot {
			t.Errorf("hot address carried %d purchases, %s carried %d", hot, ip, n)
		}
	}
}

// With X-Forwarded-For the addresses travel in the header, from one peer.
func TestForwardedFor(t *testing.T) {
	var mu sync.Mutex
	xff := map[string]bool{}
	s := newShop(1 << 30)
	addr := servicetest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		if v := ctx.Request.Header.Peek("X-Forwarded-For"); len(v) > 0 {
			xff[string(v)] = true
		}
		mu.Unlock()
		s.handle(ctx)
	}})
	cfg := baseConfig("http://" + addr)
	cfg.Sources, _ = SourceAddrs("127.4.0.0/24", 10)
	cfg.ForwardedFor = true
	// A fixed plan of 400 purchases (open loop): each of the 10 addresses
	// is drawn by a tenth of the users, so one is missed in a run with
	// odds 10 × 0.9^400 (about 5e-18); a closed loop's short timed rush on
	// a stalled machine sent few enough purchases to miss one.
	cfg.Rate = 1000
	run(t, cfg)
	if len(s.peers) != 1 {
		t.Errorf("%d peers, want only the default address", len(s.peers))
	}
	if len(xff) != 10 {
		t.Errorf("%d distinct X-Forwarded-For values, want 10", len(xff))
	}
}

// A 503 is retried with the same Idempotency-Key, and the final answer is
// the one recorded; every key gets at most one order.
func TestRetrySameKey(t *testing.T) {
	s := newShop(1 << 30)
	s.every503 = 3
	cfg := baseConfig(serve(t, s))
	snap := run(t, cfg).Snapshot()
	s.mu.Lock()
	defer s.mu.Unlock()
	retried := 0
	for k, n := range s.attempts {
		if n > 2 {
			t.Errorf("key %s sent %d times", k, n)
		}
		if n == 2 {
			retried++
		}
	}
	if retried == 0 || int64(retried) != snap.Retries {
		t.Errorf("server saw %d retried keys, recorder %d retries", retried, snap.Retries)
	}
	if len(snap.RetryMix) != 1 || snap.RetryMix[0].Key != "503 unavailable" || snap.RetryMix[0].Count != snap.Retries {
		t.Errorf("retry causes %v", snap.RetryMix)
	}
	for _, m := range snap.Mix {
		if strings.HasPrefix(m.Key, "503") {
			t.Errorf("a 503 that was retried must not be the recorded outcome: %v", snap.Mix)
		}
	}
	if int(snap.Classes[Accepted].Count()) != len(s.orders) {
		t.Errorf("recorded %d accepted, shop made %d orders", snap.Classes[Accepted].Count(), len(s.orders))
	}
	if len(snap.Accepted) != len(s.orders) {
		t.Errorf("%d accepted order ids, shop made %d", len(snap.Accepted), len(s.orders))
	}
}

// UnkeyedShare of the purchases carry no Idempotency-Key, and those are
// never retried (a retry without a key may buy again).
func TestUnkeyedShare(t *testing.T) {
	s := newShop(1 << 30)
	cfg := baseConfig(serve(t, s))
	cfg.UnkeyedShare = 0.5
	run(t, cfg)
	s.mu.Lock()
	keyed, unkeyed := len(s.attempts), s.unkeyed
	s.mu.Unlock()
	if total := keyed + unkeyed; total < 100 || unkeyed < total/4 || unkeyed > total*3/4 {
		t.Errorf("%d keyed and %d unkeyed purchases, want about half without a key", keyed, unkeyed)
	}
	s = newShop(1 << 30)
	s.every503 = 1 // every first attempt of a user gets a 503
	cfg = baseConfig(serve(t, s))
	cfg.UnkeyedShare = 1
	snap := run(t, cfg).Snapshot()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.attempts) != 0 || s.unkeyed == 0 || snap.Retries != 0 {
		t.Errorf("%d keyed purchases, %d unkeyed, %d retries: want only unkeyed ones, none retried", len(s.attempts), s.unkeyed, snap.Retries)
	}
}

// Sold-out answers are classed as such and fall in the tail once stock is
// gone. A fixed plan (open loop: 300 purchases meant for the rush, 100 for
// the tail, each counted in the phase it was meant for): a closed loop's
// 100ms tail held no request at all when a loaded machine stalled it.
func TestSoldOutTail(t *testing.T) {
	s := newShop(20)
	cfg := baseConfig(serve(t, s))
	cfg.Rate = 1000
	snap := run(t, cfg).Snapshot()
	if got := snap.Classes[Accepted].Count(); got != 20 {
		t.Errorf("%d accepted, want 20", got)
	}
	if got := snap.Classes[SoldOut].Count(); got != 400-20 {
		t.Errorf("%d sold-out answers recorded, want the 380 purchases after the 20 units", got)
	}
	tail := snap.Phases[Tail]
	if tail.Requests != 100 || tail.Classes[SoldOut] != tail.Requests {
		t.Errorf("tail: %d requests, %d sold out; want 100 sold out", tail.Requests, tail.Classes[SoldOut])
	}
	if snap.Phases[Warmup].Requests == 0 {
		t.Error("warm-up sent nothing")
	}
}

// The open loop sends at its rate whatever the server does, and measures
// from the intended send time: a server that can take only a fraction of the
// rate shows the queueing in the latencies (coordinated omission corrected).
func TestOpenLoopCorrectsCoordinatedOmission(t *testing.T) {
	s := newShop(1 << 30)
	s.delay = 20 * time.Millisecond // the shop serialises: ≤ 50 answers/s
	cfg := baseConfig(serve(t, s))
	cfg.Warmup, cfg.Rush, cfg.Tail = 0, 500*time.Millisecond, 0
	cfg.Rate = 200
	snap := run(t, cfg).Snapshot()
	n := snap.Phases[Rush].Requests
	if n != 100 {
		t.Errorf("open loop sent %d requests in 0.5 s at 200/s, want 100", n)
	}
	// 100 requests through a 20 ms server take ≥ 2 s; the last was meant to
	// leave at 0.5 s, so it waited ≥ 1.5 s. Service time alone is 20 ms.
	if max := snap.All.Max(); max < 1_000_000 {
		t.Errorf("max latency %d µs: the backlog is not in the measurement", max)
	}
	if p50 := snap.All.Quantile(0.5); p50 < 200_000 {
		t.Errorf("p50 %d µs: the backlog is not in the measurement", p50)
	}
}

func TestSourceAddrs(t *testing.T) {
	ips, err := SourceAddrs("127.1.0.0/16", 300)
	if err != nil {
		t.Fatal(err)
	}
	if ips[0].String() != "127.1.0.1" || ips[255].String() != "127.1.1.0" || ips[299].String() != "127.1.1.44" {
		t.Errorf("got %v %v %v", ips[0], ips[255], ips[299])
	}
	if _, err := SourceAddrs("127.1.0.0/30", 3); err == nil {
		t.Error("a /30 holds two host addresses")
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		status int
		code   string
		want   Class
	}{
		{202, "", Accepted}, {409, "sold_out", SoldOut}, {409, "limit_exceeded", Other},
		{429, "purchase-ip", Limited}, {503, "unavailable", ServerError}, {502, "", ServerError},
		{0, "timeout", Other}, {400, "bad_request", Other},
	}
	for _, c := range cases {
		if got := Classify(c.status, c.code); got != c.want {
			t.Errorf("Classify(%d, %q) = %v, want %v", c.status, c.code, got, c.want)
		}
	}
	if MixKey(0, "timeout") != "error timeout" || MixKey(409, "sold_out") != "409 sold_out" || MixKey(200, "") != "200" {
		t.Error("MixKey")
	}
}

// The keyed tail's replays: at least ReplayShare of the tail's purchases
// replay a key answered 202 in the rush (its user and key), and each gets
// its order again. A fixed plan, as TestSoldOutTail.
func TestReplayShare(t *testing.T) {
	s := newShop(20)
	cfg := baseConfig(serve(t, s))
	cfg.Rate = 1000
	cfg.ReplayShare = 0.1
	snap := run(t, cfg).Snapshot()
	tail := snap.Phases[Tail]
	replays := int64(0)
	for _, m := range snap.ReplayMix {
		if m.Key != "202" {
			t.Errorf("a replay answered %s ×%d, want 202", m.Key, m.Count)
		}
		replays += m.Count
	}
	if tail.Requests != 100 || replays < tail.Requests/10 || replays > tail.Requests/10+1 {
		t.Errorf("%d replays of %d tail purchases, want 10%%", replays, tail.Requests)
	}
	if tail.Classes[Accepted] != replays || tail.Classes[SoldOut] != tail.Requests-replays {
		t.Errorf("tail answers %v, want the %d replays accepted and the rest sold out", tail.Classes, replays)
	}
	byKey := map[string]string{}
	for _, a := range snap.Accepted {
		if prev, ok := byKey[a.UserID+":"+a.Key]; ok && prev != a.OrderID {
			t.Errorf("key %s:%s answered %s and %s", a.UserID, a.Key, prev, a.OrderID)
		}
		byKey[a.UserID+":"+a.Key] = a.OrderID
	}
	if len(byKey) != 20 || int64(len(snap.Accepted)) != 20+replays {
		t.Errorf("%d keys answered 202 in %d answers, want 20 keys and each replay answered again", len(byKey), len(snap.Accepted))
	}
}
