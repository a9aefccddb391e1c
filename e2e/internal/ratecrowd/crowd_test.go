package ratecrowd

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/servicetest"
)

// fakeEdge is an exact in-process limiter in front of the crowd's upstream
// (a sliding log per client address and one global, decided under one
// lock when the request arrives), served on several listeners as if it
// were several proxies sharing one store.
type fakeEdge struct {
	l      Limits
	mu     sync.Mutex
	global []time.Time
	own    map[string][]time.Time
	hc     *fasthttp.HostClient
}

func recent(log []time.Time, now time.Time, w time.Duration) []time.Time {
	i := 0
	for i < len(log) && !log[i].After(now.Add(-w)) {
		i++
	}
	return log[i:]
}

func (e *fakeEdge) handle(ctx *fasthttp.RequestCtx) {
	ip := ctx.RemoteIP().String()
	e.mu.Lock()
	now := time.Now()
	e.global = recent(e.global, now, e.l.Window)
	own := recent(e.own[ip], now, e.l.Window)
	ok := len(own) < e.l.PerIP && len(e.global) < e.l.Global
	if ok {
		e.global = append(e.global, now)
		own = append(own, now)
	}
	e.own[ip] = own
	e.mu.Unlock()
	if !ok {
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
		return
	}
	if err := e.hc.Do(&ctx.Request, &ctx.Response); err != nil {
		ctx.SetStatusCode(fasthttp.StatusBadGateway)
	}
}

func startFakeEdges(t *testing.T, n int, l Limits, up string) []string {
	t.Helper()
	e := &fakeEdge{l: l, own: map[string][]time.Time{}, hc: &fasthttp.HostClient{Addr: up, MaxConns: 4096}}
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		servicetest.Must(t, err, "listen")
		srv := &fasthttp.Server{Handler: e.handle, Concurrency: 1 << 20}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Shutdown() })
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

// The whole harness on an exact limiter it knows: a crowd through two
// listeners of one exact in-process limiter reads as exact and as
// admitting (nearly) all the limits allow, with the busiest intervals at
// the limits themselves; judged against limits one lower (a too-low
// claimed limit) the same run is caught over them. So the crowd's spans
// are tight enough for the judge to see an excess of one.
func TestHarnessOnAnExactLimiter(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a crowd")
	}
	// ~420 requests/s: light enough that the race-built crowd, limiter and
	// upstream in this one process keep their stamps tight on a loaded box.
	// Both windows bind whatever the phase: the hot clients (10/s) are held
	// by their per-IP 3, and what the per-IP windows let through (~315/s)
	// exceeds the global 250. (With a global of 100 it filled before any hot
	// client reached 3 in some runs, and the per-IP window refused nothing.)
	l := Limits{PerIP: 3, Global: 250, Window: time.Second}
	RaiseNoFile(t, 2*150+512, "a crowd of 150 clients")
	up := StartUpstream(t)
	targets := startFakeEdges(t, 2, l, up.Addr)
	res := Run(t, Plan{Clients: 150, Duration: 3 * time.Second, HotEvery: 10, HotRate: 10, ColdRate: 2,
		Path: "/x", Hang: 10 * time.Second}, targets, up)
	rep := res.Judge(l)
	t.Logf("%s", rep)
	if rep.Hung+rep.Broken+rep.Other > 0 || rep.Answered != rep.Sent {
		t.Fatalf("the crowd did not get an answer to every request: %s", rep)
	}
	if rep.WorstGlobal.N > l.Global || rep.IPOver > 0 {
		t.Fatalf("an exact limiter judged over its limits: %s", rep)
	}
	if rep.AdmittedShare() < 0.95 || rep.IdealByIP == 0 || rep.IdealByGlobal == 0 {
		t.Fatalf("admitted %.1f%% of the allowance, ideal refusals %d per-IP %d global: %s",
			100*rep.AdmittedShare(), rep.IdealByIP, rep.IdealByGlobal, rep)
	}
	low := res.Judge(Limits{PerIP: l.PerIP - 1, Global: l.Global - 1, Window: l.Window})
	if low.WorstGlobal.N <= low.Limits.Global || low.IPOver == 0 {
		t.Fatalf("judged against limits one lower (%d, %d) the run passed: global worst %d, %d clients over",
			low.Limits.PerIP, low.Limits.Global, low.WorstGlobal.N, low.IPOver)
	}
	t.Logf("against limits one lower: global worst %d > %d, %d clients over %d", low.WorstGlobal.N, low.Limits.Global,
		low.IPOver, low.Limits.PerIP)
}

// Answers marked degraded stay out of the windows.
func TestJudgeLeavesOutDegradedAnswers(t *testing.T) {
	r := &Result{Plan: Plan{Clients: 1}, Targets: 1}
	for i := range 4 {
		at := time.Duration(i) * 100 * time.Millisecond
		r.Requests = append(r.Requests, Request{Sent: at, Answered: at + ms, Reached: at + ms/2, Status: 200, Degraded: i == 3})
	}
	l := Limits{PerIP: 3, Global: 3, Window: time.Second}
	if rep := r.Judge(l); rep.IPOver != 0 || rep.WorstGlobal.N != 3 || rep.Degraded != 1 || rep.Admitted != 4 {
		t.Fatalf("one of 4 marked degraded: %+v", rep)
	}
	r.Requests[3].Degraded = false
	if rep := r.Judge(l); rep.IPOver != 1 || rep.WorstGlobal.N != 4 {
		t.Fatalf("4 unmarked within 1s, limit 3: %+v", rep)
	}
}
