package edge

import (
	"context"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/proxy/internal/room"
)

func (s *roomSetup) clients() []*fasthttp.HostClient {
	var cs []*fasthttp.HostClient
	for _, px := range s.pxs {
		cs = append(cs, &fasthttp.HostClient{Addr: px.addr, MaxConns: 2048, ReadTimeout: 10 * time.Second})
	}
	return cs
}

// byIdentity indexes the admissions traced by both proxies, failing on an
// identity admitted twice.
func byIdentity(t *testing.T, evs []room.Event) map[string]room.Event {
	t.Helper()
	m := map[string]room.Event{}
	for _, e := range evs {
		if _, dup := m[e.Identity]; dup {
			t.Errorf("%s admitted twice", e.Identity)
		}
		if e.Arrival <= 0 || e.Granted < e.Arrival || e.Place <= 0 {
			t.Errorf("%s: admission traced with arrival %d, grant %d, place %d", e.Identity, e.Arrival, e.Granted, e.Place)
		}
		m[e.Identity] = e
	}
	return m
}

// Order: clients arriving over a spread, alternately at two proxies, each
// polling as told, are admitted in arrival order: nobody is admitted before
// a client that arrived more than 50 ms earlier (arrival: when an instance
// first saw the client, admission: when the line admitted it; both Redis
// time, the one clock of both instances), and each exactly once.
func TestRoomOrder(t *testing.T) {
	t.Parallel()
	n, spread, rate := 300, 300*time.Millisecond, 150.0
	if chaos() {
		n, spread, rate = 5000, 2*time.Second, 1000
	}
	// A place_ttl well above the poll interval: a client slowed by a loaded
	// machine keeps its place (the abandonment test covers losing it).
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: rate, MaxActive: 100_000, PlaceTTL: conf.D(10 * time.Second)})
	s.start(t, 2)
	cs := s.clients()
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(spread * time.Duration(i) / time.Duration(n))))
		wg.Go(func() {
			rs := politeClient(t, cs, clientIP(i), i, "")
			if last := rs[len(rs)-1]; last.status != 202 {
				t.Errorf("client %d ended %d %s", i, last.status, last.code)
			}
		})
	}
	wg.Wait()
	adm := byIdentity(t, s.events())
	if len(adm) != n {
		t.Fatalf("%d admissions traced, want %d", len(adm), n)
	}
	evs := make([]room.Event, 0, n)
	for _, e := range adm {
		evs = append(evs, e)
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].Arrival < evs[j].Arrival })
	// For each client, the latest admission of anyone who arrived more than
	// 50 ms before it must not be later than its own.
	worst, j := int64(math.MinInt64), 0
	bad := 0
	for _, e := range evs {
		for j < len(evs) && evs[j].Arrival < e.Arrival-50 {
			worst = max(worst, evs[j].Granted)
			j++
		}
		if worst > e.Granted {
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d clients admitted before someone who arrived more than 50 ms earlier", bad, n)
	}
	first, last := evs[0].Granted, evs[0].Granted
	for _, e := range evs {
		first, last = min(first, e.Granted), max(last, e.Granted)
	}
	t.Logf("%d clients over %v: admitted over %d ms (%.0f/s, admit_per_second %v); out of order: %d", n, spread, last-first,
		float64(n-1)/(float64(max(last-first, 1))/1000), rate, bad)
}

// spearman is the rank correlation of two orders of the same n items (no
// ties): rank a[i], rank b[i].
func spearman(a, b []int) float64 {
	n := float64(len(a))
	var d2 float64
	for i := range a {
		d := float64(a[i] - b[i])
		d2 += d * d
	}
	return 1 - 6*d2/(n*(n*n-1))
}

// Pre-queue: clients arriving before the opening, in a known order, get
// their places at the opening in an order unrelated to it: the rank
// correlation between arrival order and place is within 3.5/√(n−1) of 0
// (the null distribution's sd is 1/√(n−1): a false alarm about once in
// 2,000 runs); each is admitted exactly once.
func TestRoomPreQueue(t *testing.T) {
	t.Parallel()
	n, rate := 300, 300.0
	if chaos() {
		n, rate = 3000, 1000
	}
	opens := time.Now().Add(1500 * time.Millisecond)
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: rate, MaxActive: 100_000, OpensAt: opens.Format(time.RFC3339Nano),
		PlaceTTL: conf.D(10 * time.Second)})
	s.start(t, 2)
	cs := s.clients()
	var wg sync.WaitGroup
	var mu sync.Mutex
	firstCode := map[int]string{}
	for i := range n {
		// One at a time: the arrival order is the loop's.
		r := roomAsk(t, cs[i%2], "POST", purchasePath(roomAct), clientIP(i), "")
		mu.Lock()
		firstCode[i] = r.code
		mu.Unlock()
		if r.status != 429 || r.position != 0 {
			t.Fatalf("client %d before the opening: %d %s position %d, want 429 in the pre-queue", i, r.status, r.code, r.position)
		}
		wg.Go(func() {
			time.Sleep(time.Duration(max(r.retryAfter, 1)) * time.Second)
			rs := politeClient(t, cs, clientIP(i), i+1, r.ticket)
			if last := rs[len(rs)-1]; last.status != 202 {
				t.Errorf("client %d ended %d %s", i, last.status, last.code)
			}
		})
	}
	if time.Now().After(opens) {
		t.Fatalf("arrivals took past the opening; the machine is too slow for this test's %d clients", n)
	}
	wg.Wait()
	adm := byIdentity(t, s.events())
	if len(adm) != n {
		t.Fatalf("%d admissions traced, want %d", len(adm), n)
	}
	type pa struct{ arrival, place int }
	ps := make([]pa, 0, n)
	for i := range n {
		e, ok := adm["a:"+clientIP(i)]
		if !ok {
			t.Fatalf("client %d never admitted", i)
		}
		ps = append(ps, pa{i, int(e.Place)})
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].place < ps[j].place })
	arr, rank := make([]int, n), make([]int, n)
	for r, p := range ps {
		arr[r], rank[r] = p.arrival, r
	}
	rho := spearman(arr, rank)
	bound := 3.5 / math.Sqrt(float64(n-1))
	t.Logf("pre-queue of %d: rank correlation of arrival and place %.3f (bound ±%.3f)", n, rho, bound)
	if math.Abs(rho) > bound {
		t.Errorf("rank correlation %.3f beyond ±%.3f: the pre-queue follows arrival order", rho, bound)
	}
}

// One place per identity: one client arriving many times at once, at both
// instances, without a ticket, gets one place; the next identity is behind it.
func TestRoomOnePlacePerIdentity(t *testing.T) {
	t.Parallel()
	// A line that never moves: every answer is a place.
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 0.01})
	s.start(t, 2)
	cs := s.clients()
	var wg sync.WaitGroup
	var mu sync.Mutex
	pos := map[int64]int{}
	for i := range 40 {
		wg.Go(func() {
			r := roomAsk(t, cs[i%2], "POST", purchasePath(roomAct), "10.9.9.9", "")
			mu.Lock()
			pos[r.position]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(pos) != 1 || pos[1] != 40 {
		t.Fatalf("40 concurrent arrivals of one identity got places %v, want all 1", pos)
	}
	if r := roomAsk(t, cs[1], "POST", purchasePath(roomAct), "10.9.9.8", ""); r.position != 2 || r.ahead != 1 {
		t.Errorf("next identity: position %d ahead %d, want 2, 1", r.position, r.ahead)
	}
	next, _ := s.rdb.HGet(context.Background(), s.prefix+"{room:buy:1}:meta", "next").Int64()
	if next != 2 {
		t.Errorf("places given: %d, want 2", next)
	}
}

// Stock: a sale of 200 units and a crowd in line. At no moment are more
// clients admitted and unfinished (no purchase answered 202 yet) than units
// left plus no_show_margin; once the last unit sold, every waiting client is
// told sold_out (409, with its position) at its next poll and within 3 s,
// and nobody is admitted afterwards.
func TestRoomStock(t *testing.T) {
	t.Parallel()
	const units, margin = 200, 5
	n := 600
	if chaos() {
		n = 5000
	}
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 400, MaxActive: 100_000, NoShowMargin: margin})
	putSale(t, s.rdb, s.prefix, roomAct, units)
	s.start(t, 2)
	cs := s.clients()
	meta := reservation.KeysFor(s.prefix, roomAct).Meta
	active := s.prefix + "{room:buy:1}:active"

	stop := make(chan struct{})
	samplerDone := make(chan struct{})
	worst, samples := math.MinInt64, 0
	go func() {
		defer close(samplerDone)
		ctx := context.Background()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			// One MULTI (one node: the two slots may share it): the
			// active set, the stock and its buyers at one moment.
			p := s.rdb.TxPipeline()
			ms := p.ZRange(ctx, active, 0, -1)
			sold := p.HGet(ctx, meta, "sold")
			buyers := p.SMembers(ctx, buyersKey(s.prefix, roomAct))
			if _, err := p.Exec(ctx); err != nil {
				continue
			}
			sn, _ := sold.Int()
			bought := map[string]bool{}
			for _, b := range buyers.Val() {
				bought[b] = true
			}
			unfinished := 0
			for _, id := range ms.Val() {
				if !bought[id] {
					unfinished++
				}
			}
			worst = max(worst, unfinished-(units-sn+margin))
			samples++
		}
	}()

	var wg sync.WaitGroup
	replies := make([][]roomReply, n)
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(500 * time.Millisecond * time.Duration(i) / time.Duration(n))))
		wg.Go(func() { replies[i] = politeClient(t, cs, clientIP(i), i, "") })
	}
	wg.Wait()
	close(stop)
	<-samplerDone

	if got := s.shop.sold.Load(); got != units {
		ends := map[string]int{}
		for _, rs := range replies {
			last := rs[len(rs)-1]
			ends[strconv.Itoa(last.status)+" "+last.typ+" "+last.code]++
		}
		t.Errorf("sold %d, want %d; the clients ended %v", got, units, ends)
	}
	if worst > 0 {
		t.Errorf("admitted and unfinished exceeded units left + margin by %d (of %d samples)", worst, samples)
	}
	if samples == 0 {
		// One MULTI over two hash slots: not on a Redis Cluster.
		t.Log("the bound was not sampled (no MULTI over the room's and the sale's keys on this Redis)")
	}
	soldAt := s.shop.soldAt.Load()
	if soldAt == 0 {
		t.Fatal("the sale never sold out")
	}
	told, late, notTold, waitedLast := 0, 0, 0, time.Duration(0)
	for i, rs := range replies {
		last := rs[len(rs)-1]
		switch {
		case last.status == 202:
			continue
		case last.status == 409 && last.code == "sold_out":
		default:
			notTold++
			t.Errorf("client %d ended %d %q", i, last.status, last.code)
			continue
		}
		hadPlace := false
		for _, r := range rs {
			hadPlace = hadPlace || r.position > 0
		}
		if last.typ == "urn:seckill:proxy:sold_out" && last.position == 0 && hadPlace {
			t.Errorf("client %d told sold out without its position", i)
		}
		told++
		// Its first poll answered more than the step's pace after the
		// sell-out must say so.
		for _, r := range rs {
			if r.at.UnixMilli() > soldAt+300 && r.status == 429 {
				late++
				break
			}
		}
		if d := last.at.Sub(time.UnixMilli(soldAt)); d > waitedLast {
			waitedLast = d
		}
	}
	if late > 0 {
		t.Errorf("%d clients still told to wait more than 300 ms after the last unit sold", late)
	}
	if waitedLast > 3*time.Second {
		t.Errorf("the last waiting client learnt sold out %v after the last unit sold, want within 3 s", waitedLast)
	}
	after := 0
	for _, e := range s.events() {
		if e.Granted > soldAt+100 {
			after++
		}
	}
	if after > 0 {
		t.Errorf("%d clients admitted more than 100 ms after the last unit sold", after)
	}
	t.Logf("%d clients, %d units: worst (unfinished - units left - margin) %d over %d samples; %d told sold_out, the last %v after the sell-out; admitted after it: %d",
		n, units, worst, samples, told, waitedLast.Round(time.Millisecond), after)
}

// Units that come back after a sell-out are offered to the next in line:
// the clients that keep polling are admitted in the order of their places.
func TestRoomUnitsComeBack(t *testing.T) {
	t.Parallel()
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 200})
	putSale(t, s.rdb, s.prefix, roomAct, 3)
	s.start(t, 2)
	cs := s.clients()
	var wg sync.WaitGroup
	replies := make([][]roomReply, 20)
	for i := range 20 {
		wg.Go(func() { replies[i] = politeClient(t, cs, clientIP(i), i, "") })
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	type waiter struct {
		ip    string
		place int64
	}
	var ws []waiter
	for i, rs := range replies {
		last := rs[len(rs)-1]
		if last.status == 409 && last.position > 0 {
			ws = append(ws, waiter{clientIP(i), last.position})
		}
	}
	if len(ws) < 5 {
		t.Fatalf("%d clients told sold out in line, want at least 5", len(ws))
	}
	slices.SortFunc(ws, func(a, b waiter) int { return int(a.place - b.place) })
	// Two units come back (an order failed): news on the stock channel.
	ctx := context.Background()
	meta := reservation.KeysFor(s.prefix, roomAct).Meta
	s.rdb.HIncrBy(ctx, meta, "sold", -2)
	s.rdb.Publish(ctx, reservation.Channel(s.prefix), "1")
	time.Sleep(300 * time.Millisecond) // the rooms read the stock again at their next step
	s.events()
	// Every waiter polls again until its purchase is answered.
	got := make([]int, len(ws))
	for i, w := range ws {
		wg.Go(func() {
			rs := politeClient(t, cs, w.ip, i, "")
			got[i] = rs[len(rs)-1].status
		})
	}
	wg.Wait()
	bought := 0
	for i, st := range got {
		if st == 202 {
			bought++
			if i >= 2 {
				t.Errorf("the waiter at place %d bought, though %d waited ahead of it", ws[i].place, i)
			}
		}
	}
	if bought != 2 {
		t.Errorf("%d bought the 2 units that came back (statuses %v)", bought, got)
	}
}

// Abandonment: 30% of the clients in line vanish; the line skips them
// without waiting (and without spending admissions on them): the rest are
// admitted at admit_per_second.
func TestRoomAbandonment(t *testing.T) {
	t.Parallel()
	n, rate := 150, 50.0
	// Everyone arrives before the opening; those who vanish have not
	// polled for place_ttl when it opens.
	opens := time.Now().Add(3500 * time.Millisecond)
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: rate, MaxActive: 100_000, OpensAt: opens.Format(time.RFC3339Nano)})
	s.start(t, 2)
	cs := s.clients()
	var wg sync.WaitGroup
	live := 0
	// Those who vanish arrive first, so that their last poll is place_ttl
	// old at the opening however slow the machine is with the rest.
	order := make([]int, 0, n)
	for i := range n {
		if i%10 < 3 {
			order = append(order, i)
		}
	}
	for i := range n {
		if i%10 >= 3 {
			order = append(order, i)
		}
	}
	for _, i := range order {
		r := roomAsk(t, cs[i%2], "POST", purchasePath(roomAct), clientIP(i), "")
		if r.status != 429 {
			t.Fatalf("client %d: %d, want 429 (pre-queue)", i, r.status)
		}
		tk := r.ticket
		if i%10 < 3 {
			continue // vanishes
		}
		live++
		wg.Go(func() {
			time.Sleep(time.Second)
			politeClient(t, cs, clientIP(i), i+1, tk)
		})
	}
	wg.Wait()
	adm := byIdentity(t, s.events())
	if len(adm) != live {
		t.Fatalf("%d admitted, want the %d who stayed", len(adm), live)
	}
	first, last := int64(math.MaxInt64), int64(0)
	for _, e := range adm {
		first, last = min(first, e.Granted), max(last, e.Granted)
	}
	got := float64(live-1) / (float64(last-first) / 1000)
	abandoned := 0.0
	for _, px := range s.pxs {
		abandoned += metricSum(scrape(t, px), `seckill_proxy_room_abandoned_total{room="buy/1"}`)
	}
	t.Logf("%d of %d stayed: admitted at %.1f/s (admit_per_second %v); abandoned places skipped: %v", live, n, got, rate, abandoned)
	if int(abandoned) != n-live {
		t.Errorf("abandoned %v, want %d", abandoned, n-live)
	}
	if got < 0.7*rate {
		t.Errorf("the line moved at %.1f/s with abandoned places in it, want about %v", got, rate)
	}
}

// botClient retries every 50 ms (20 tries/s), ignores Retry-After, drops
// its ticket on every try and alternates between the proxies, until its
// purchase is answered 202 or 409 (by the shop or the room).
func botClient(t *testing.T, cs []*fasthttp.HostClient, ip string, first int) roomReply {
	for i := first; ; i++ {
		r := roomAsk(t, cs[i%len(cs)], "POST", purchasePath(roomAct), ip, "")
		if r.status == 202 || r.status == 409 {
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// katzUpper is the one-sided 95% upper bound of the ratio of two win rates
// a/n1 over c/n2 (Katz's log method; +0.5 to every cell when one is 0).
func katzUpper(a, n1, c, n2 int) float64 {
	fa, f1, fc, f2 := float64(a), float64(n1), float64(c), float64(n2)
	if a == 0 || c == 0 {
		fa, f1, fc, f2 = fa+0.5, f1+1, fc+0.5, f2+1
	}
	rr := (fa / f1) / (fc / f2)
	se := math.Sqrt(1/fa - 1/f1 + 1/fc - 1/f2)
	return rr * math.Exp(1.645*se)
}

// Fairness: with the room on, bots (20 tries/s, ignoring Retry-After,
// dropping their ticket on every try, using both instances) arriving among
// clients who ask once and poll as told win no larger share of the units:
// the ratio of their win rates stays at most 1.5 (under SECKILL_CHAOS=1, at
// 1,000 clients, its one-sided 95% upper bound too). Arrivals are
// interleaved one bot per five polite clients, each first request sent in
// turn, so arrival order is known.
func TestRoomFairness(t *testing.T) {
	t.Parallel()
	n, units := 240, 60
	if chaos() {
		n, units = 1200, 300
	}
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 200, MaxActive: 100_000, PlaceTTL: conf.D(10 * time.Second)})
	putSale(t, s.rdb, s.prefix, roomAct, units)
	s.start(t, 2)
	cs := s.clients()
	var wg sync.WaitGroup
	won := make([]bool, n)
	isBot := func(i int) bool { return i%6 == 5 }
	for i := range n {
		ip := clientIP(i)
		first := roomAsk(t, cs[i%2], "POST", purchasePath(roomAct), ip, "")
		if first.status == 202 {
			won[i] = true
			continue
		}
		if first.status == 409 {
			continue
		}
		wg.Go(func() {
			if isBot(i) {
				won[i] = botClient(t, cs, ip, i).status == 202
				return
			}
			time.Sleep(time.Duration(max(first.retryAfter, 1)) * time.Second)
			rs := politeClient(t, cs, ip, i+1, first.ticket)
			won[i] = rs[len(rs)-1].status == 202
		})
	}
	wg.Wait()
	bots, botWins, polite, politeWins := 0, 0, 0, 0
	for i, w := range won {
		if isBot(i) {
			bots++
			if w {
				botWins++
			}
		} else {
			polite++
			if w {
				politeWins++
			}
		}
	}
	if botWins+politeWins != units {
		t.Errorf("%d units won, want %d", botWins+politeWins, units)
	}
	ratio := (float64(botWins) / float64(bots)) / (float64(politeWins) / float64(polite))
	upper := katzUpper(botWins, bots, politeWins, polite)
	text := scrape(t, s.pxs[0]) + scrape(t, s.pxs[1])
	answers := metricSum(text, `seckill_proxy_room_answers_total{`)
	calls := 0.0
	for _, res := range []string{"ok", "error"} {
		for _, script := range []string{"enter", "check", "finish"} {
			calls += metricSum(text, `seckill_proxy_room_redis_calls_total{result="`+res+`",room="buy/1",script="`+script+`"}`)
		}
	}
	t.Logf("bots won %d/%d, polite clients %d/%d: ratio of win rates %.2f (one-sided 95%% upper bound %.2f); "+
		"%v requests decided by the room with %v Redis calls on the request path; beyond the %d arrivals' own: %.3f per request",
		botWins, bots, politeWins, polite, ratio, upper, answers, calls, n, (calls-float64(n))/max(answers-float64(n), 1))
	if ratio > 1.5 {
		t.Errorf("bots won at %.2f× the polite clients' rate", ratio)
	}
	if chaos() && upper > 1.5 {
		t.Errorf("one-sided 95%% upper bound of the ratio %.2f > 1.5", upper)
	}
}

// Without opens_at the room opens at the sale's starts_at as Redis holds
// it: arrivals before it wait in the pre-queue (no place yet), and get
// places once it passed.
func TestRoomOpensAtSaleStart(t *testing.T) {
	t.Parallel()
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 0.01})
	start := time.Now().Add(1200 * time.Millisecond)
	err := s.rdb.HSet(context.Background(), reservation.KeysFor(s.prefix, roomAct).Meta, "start", start.UnixMilli()).Err()
	servicetest.Must(t, err, "sale start")
	s.start(t, 2)
	cs := s.clients()
	tickets := make([]string, 3)
	for i := range 3 {
		r := roomAsk(t, cs[i%2], "POST", purchasePath(roomAct), clientIP(i), "")
		if r.status != 429 || r.position != 0 || r.ticket == "" || r.eta < 1 {
			t.Fatalf("client %d before the sale starts: %+v, want 429 in the pre-queue with an eta", i, r)
		}
		tickets[i] = r.ticket
	}
	time.Sleep(time.Until(start) + 300*time.Millisecond)
	seen := map[int64]bool{}
	for i := range 3 {
		r := roomAsk(t, cs[(i+1)%2], "POST", purchasePath(roomAct), clientIP(i), tickets[i])
		if r.status != 429 || r.position < 1 || r.position > 3 || seen[r.position] {
			t.Errorf("client %d after the start: %+v, want its own place among 1-3", i, r)
		}
		seen[r.position] = true
	}
}

// An admitted client that never finishes frees its slot when its session
// ends: with max_active 1, the next in line gets in then.
func TestRoomSessionExpiry(t *testing.T) {
	t.Parallel()
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 100, MaxActive: 1, Session: conf.D(time.Second)})
	s.start(t, 2)
	cs := s.clients()
	a := roomAsk(t, cs[0], "GET", "/api/v1/activities/1/page", "10.0.0.1", "")
	b := roomAsk(t, cs[1], "GET", "/api/v1/activities/1/page", "10.0.0.2", "")
	deadline := time.Now().Add(3 * time.Second)
	for a.status != 200 {
		if time.Now().After(deadline) {
			t.Fatalf("a never admitted: %+v", a)
		}
		time.Sleep(100 * time.Millisecond)
		a = roomAsk(t, cs[0], "GET", "/api/v1/activities/1/page", "10.0.0.1", a.ticket)
	}
	admittedA := time.Now()
	// a never buys; b polls until its turn.
	for b.status != 200 {
		if time.Now().After(admittedA.Add(3 * time.Second)) {
			t.Fatalf("b not admitted 3 s after a, whose session is 1 s: %+v", b)
		}
		time.Sleep(100 * time.Millisecond)
		b = roomAsk(t, cs[1], "GET", "/api/v1/activities/1/page", "10.0.0.2", b.ticket)
	}
	if d := time.Since(admittedA); d < 800*time.Millisecond {
		t.Errorf("b admitted %v after a, before a's 1 s session ended (max_active 1)", d)
	}
	expired := metricSum(scrape(t, s.pxs[0])+scrape(t, s.pxs[1]), `seckill_proxy_room_sessions_expired_total{room="buy/1"}`)
	if expired < 1 {
		t.Errorf("sessions expired: %v, want a's", expired)
	}
}
