package chaos

// The edge limiter under a crowd of distinct clients (issue 22, "Proof"):
// two proxy processes (bin/proxy, built from ./proxy) share the real Redis
// under a key prefix of the test's own; every client has its own source
// address on 127.0.0.0/8 and one keep-alive connection to each proxy, so
// its per-IP window is shared by both instances. The crowd's upstream, in
// the test process, stamps each request's arrival; the client stamps its
// send and its answer on the same clock. The judge (e2e/internal/ratecrowd)
// then checks docs/limiter.md from outside:
//
//   - every window, every interval of length W: the admissions whose whole
//     span (sent -> reached the upstream) lies inside it are at most the
//     limit (an arrival log alone overstates: a burst that queued at a proxy
//     reaches the upstream at once but was admitted over a longer time);
//   - admitted (requests stamped at the upstream) >= 95% of what the limits
//     allow: Ideal replays the very demand the crowd sent through an ideal
//     exact limiter — per-client and global sliding windows, a request
//     refused only when a window it needs already holds its limit of
//     admissions in the last W, no leases, no latency — once at the send
//     times and once at the moments the requests met the limiter (arrival
//     at the upstream for an admitted one, the answer for a refused one),
//     and takes the lesser. For one window under demand always above its
//     limit, over a run of length T, that is L·⌊T/W⌋ plus up to L more
//     depending on where the first burst fell (the phase); the two replays
//     keep delays before the limiter from counting as under-admission (the
//     latency checks judge those). Ratecrowd's Report.Judge says more;
//   - 0 decisions fallen back to on_redis_error with Redis not faulted (the
//     proxies' seckill_proxy_decisions_total{outcome="degraded"}; strict:
//     the log says whether Redis met the health measure, so a
//     reader can tell an overloaded box from the defect), sheds
//     (seckill_proxy_limiter_shed_total, absent = 0) at most 0.1% of the
//     decisions (= the crowd's requests: each is one decision of the rule);
//   - no answer slower than twice the shed bound, none hung.
//
// Redis's own health is logged beside it: a PING on an idle connection
// every 50 ms from a goroutine (the issue calls Redis healthy while those
// stay under 5 ms), and redis-cli --latency from outside the test process
// when it is installed.
//
// Why here: these are load tests of real processes that must have the box
// to themselves, like the rest of this package — `make chaos` runs it alone
// (-p 1) with SECKILL_CHAOS=1, which selects the full forms (5,000 clients),
// while `make test` runs the short forms (2,000 clients, a few seconds).
// They do not run in parallel with this package's other tests (Go runs the
// sequential tests first), and they need only Redis, not a whole stack.

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/e2e/internal/ratecrowd"
	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/servicetest"
)

// crowdHang: a request not answered this long after it was sent hung.
const crowdHang = 10 * time.Second

// degradedMark is the response header by which the proxy would mark an
// answer decided by on_redis_error. Today's proxy marks none (only the
// metric counts them), so the slow test judges the windows strictly only
// when nothing fell back; a proxy that sends this header on such answers
// gets them left out and the rest judged strictly (name the real header
// here if the limiter's rewrite adds one).
const degradedMark = "Seckill-Limiter-Degraded"

// crowdShape is one form of a crowd test.
type crowdShape struct {
	plan   ratecrowd.Plan
	limits ratecrowd.Limits
	// redisTimeout is the proxies' redis_timeout; 0: the default.
	redisTimeout time.Duration
}

// crowdForm is the short form (make test) or, under SECKILL_CHAOS=1, the
// full one (make chaos). Both windows bind: a few clients are hot, their
// share of the global window is above their per-IP limit; the others are
// held by the global window, which is well below the crowd's demand (the
// test fails when Ideal sees either window refuse nothing). The demand is
// ~6,800 requests/s (short) and ~7,850/s (full): what a 2-core box serves
// beside the race detector's client; more clients, not more load.
func crowdForm() crowdShape {
	if os.Getenv(EnvChaos) == "1" {
		return crowdShape{
			plan: ratecrowd.Plan{Clients: 5000, Duration: 6 * time.Second, HotEvery: 20,
				HotRate: 20, ColdRate: 0.6, Path: "/crowd/x", Hang: crowdHang},
			limits: ratecrowd.Limits{PerIP: 3, Global: 1500, Window: time.Second},
		}
	}
	// Under make test the crowd runs beside other packages' race-built
	// tests on 2 cores, where Redis itself answers an idle PING in 100 ms to
	// 1 s at times: not the healthy Redis this test is about. A redis_timeout
	// that such stalls do not reach keeps the check on what it is for (exact
	// windows, no fallback, no shed under a crowd); the full form, run alone
	// by make chaos, keeps the default.
	return crowdShape{
		plan: ratecrowd.Plan{Clients: 2000, Duration: 4 * time.Second, HotEvery: 10,
			HotRate: 16, ColdRate: 2, Path: "/crowd/x", Hang: crowdHang},
		limits:       ratecrowd.Limits{PerIP: 3, Global: 1000, Window: time.Second},
		redisTimeout: 2 * time.Second,
	}
}

// shedBound is the longest the limiter may keep a request waiting on Redis
// before it decides or sheds, for a given redis_timeout: docs/limiter.md
// says Check takes at most about twice redis_timeout. Answers are allowed
// twice this (scheduling on a loaded 2-core box, the upstream's turn).
func shedBound(redisTimeout time.Duration) time.Duration { return 2 * redisTimeout }

// crowdRule is the proxy config of the crowd's rule; extra goes into
// [proxy].
func crowdRule(l ratecrowd.Limits, extra string) string {
	w := l.Window.String()
	return fmt.Sprintf(`
[proxy]
read_timeout     = "30s"
# The upstream shares the test process with the race-built crowd: on a
# loaded box it accepts and answers late (1s to connect gave 502s).
upstream_connect_timeout = "5s"
upstream_timeout         = "10s"
%s
[[proxy.rules]]
name        = "crowd"
path_prefix = "/crowd/"
per_ip      = { limit = %d, window = %q }
global      = { limit = %d, window = %q }
`, extra, l.PerIP, w, l.Global, w)
}

// startCrowdProxies runs n bin/proxy processes with config in front of up,
// on Redis at redisURL under prefix, on ports of the repo's free-port
// helper; they are stopped when the test ends.
func startCrowdProxies(t *testing.T, n int, config, up, redisURL, prefix string) []*stack.Proc {
	t.Helper()
	dir := t.TempDir()
	path := dir + "/proxy.toml"
	servicetest.Must(t, os.WriteFile(path, []byte(config), 0o644), "proxy config")
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SECKILL_") {
			env = append(env, e)
		}
	}
	env = append(env, conf.EnvRedisURL+"="+redisURL, conf.EnvRedisKeyPrefix+"="+prefix,
		conf.EnvProxyUpstreams+"=http://"+up)
	var ps []*stack.Proc
	for i := range n {
		p := stack.NewProc(t, stack.Binary(t, "proxy"), fmt.Sprintf("proxy-%d", i), "", dir, env, "-config", path).
			Serves(t, conf.EnvProxyListen, conf.EnvProxyAdminListen)
		p.Start(t)
		ps = append(ps, p)
	}
	for _, p := range ps {
		p.WaitReady(t, "/readyz")
	}
	return ps
}

// crowdRun is one run's figures: the judge's report, Redis's health and
// the proxies' metrics summed over both.
type crowdRun struct {
	rep  ratecrowd.Report
	ping ratecrowd.PingStats
	m    ratecrowd.Metrics
	// degraded: decisions fallen back to on_redis_error
	// (seckill_proxy_decisions_total{outcome="degraded"}, a flag counted
	// beside admitted or limited); shed: seckill_proxy_limiter_shed_total
	// (absent: 0); through: the crowd's decisions neither (each request of
	// the crowd is one decision of its rule).
	degraded, shed, through    float64
	outcomes, cacheHits, calls string
}

// runCrowd runs the crowd through ps and judges it.
func runCrowd(t *testing.T, sh crowdShape, ps []*stack.Proc, up *ratecrowd.Upstream, redisAddr string) crowdRun {
	t.Helper()
	targets := make([]string, len(ps))
	for i, p := range ps {
		targets[i] = p.Addr
	}
	ping := ratecrowd.StartPinger(t, redisAddr)
	res := ratecrowd.Run(t, sh.plan, targets, up)
	r := crowdRun{ping: ping.Stop(), rep: res.Judge(sh.limits)}
	var ms []ratecrowd.Metrics
	for _, p := range ps {
		ms = append(ms, ratecrowd.Scrape(t, p.AdminAddr))
	}
	r.m = ratecrowd.Add(ms...)
	const dec = "seckill_proxy_decisions_total"
	r.degraded = r.m.Sum(dec, `outcome="degraded"`)
	r.shed = r.m.Sum("seckill_proxy_limiter_shed_total")
	r.through = max(0, float64(r.rep.Sent)-r.degraded-r.shed)
	r.outcomes = r.m.By(dec, "outcome")
	r.cacheHits = r.m.By("seckill_proxy_local_cache_hits_total", "kind")
	r.calls = r.m.By("seckill_proxy_redis_calls_total", "result")
	health := "healthy (every PING under 5 ms)"
	if !r.ping.Healthy() {
		health = "NOT healthy by the issue's measure (a PING took 5 ms or more)"
	}
	t.Logf("crowd:\n%s\n%s: Redis %s\nproxies' decisions: %s; of the crowd's %d decisions: through Redis %.0f (%.1f%%), fallen back to on_redis_error %.0f, shed %.0f (%.3f%%); local hits %s; Redis calls %s",
		r.rep, r.ping, health, r.outcomes, r.rep.Sent, r.through, 100*r.through/float64(max(1, r.rep.Sent)),
		r.degraded, r.shed, 100*r.shed/float64(max(1, r.rep.Sent)), r.cacheHits, r.calls)
	return r
}

// crowdNoFiles is the open files a crowd needs in this process (a
// connection per client and proxy, the upstream's side of the proxies'
// connections, slack) and in each proxy (a connection per client).
func crowdNoFiles(sh crowdShape, proxies int) int {
	return sh.plan.Clients*proxies + 2048
}

// reportRow appends the run's row to `make chaos`'s table (the file named
// by SECKILL_CHAOS_REPORT; nothing without it) once the test's checks ran:
// the fault column carries the limiter's figures, attempts the crowd's
// requests, accepted the admitted ones; the order columns do not apply.
func reportRow(t *testing.T, what string, r *crowdRun) {
	path := os.Getenv(stack.EnvReport)
	if path == "" || r == nil {
		return
	}
	verdict := "ok"
	if t.Failed() {
		verdict = "FAIL"
	}
	rep := r.rep
	fault := fmt.Sprintf("edge limiter, %s: %d clients x 2 proxies; global worst %d/%d, per-IP worst %d/%d; fallbacks %.0f, sheds %.0f; p99 %v; admitted %.1f%% of allowed",
		what, rep.Clients, rep.WorstGlobal.N, rep.Limits.Global, rep.WorstIP.N, rep.Limits.PerIP, r.degraded, r.shed,
		rep.P99.Round(time.Millisecond), 100*rep.AdmittedShare())
	row := strings.Join([]string{fault, fmt.Sprint(rep.Sent), fmt.Sprint(rep.Admitted), "-", "-", "-", "-", "-", verdict}, "\t") + "\n"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Logf("chaos report: %v", err)
		return
	}
	_, _ = f.WriteString(row)
	_ = f.Close()
}

// checkExact fails the test for each window over its limit in some
// interval, counted from whole spans only.
func checkExact(t *testing.T, rep ratecrowd.Report) {
	t.Helper()
	l := rep.Limits
	if rep.WorstGlobal.N > l.Global {
		t.Errorf("global window over its limit: %d admissions certainly inside [%.3fs, +%v) of the run, limit %d",
			rep.WorstGlobal.N, rep.At(rep.WorstGlobal), l.Window, l.Global)
	}
	if rep.IPOver > 0 {
		t.Errorf("per-IP window over its limit for %d clients: worst %d certainly inside [%.3fs, +%v) of the run for client %d (%s), limit %d",
			rep.IPOver, rep.WorstIP.N, rep.At(rep.WorstIP), l.Window, rep.WorstIPClient,
			ratecrowd.SourceAddr(rep.WorstIPClient), l.PerIP)
	}
}

// checkAnswers fails the test for a hung request, a broken connection or an
// answer slower than twice bound.
func checkAnswers(t *testing.T, rep ratecrowd.Report, bound time.Duration) {
	t.Helper()
	if rep.Hung > 0 || rep.Broken > 0 {
		t.Errorf("%d requests hung (no answer within %v), %d connections broke before an answer", rep.Hung,
			crowdHang, rep.Broken)
	}
	if rep.Max > 2*bound {
		t.Errorf("answers slower than twice the shed bound (%v): p50 %v p99 %v p99.9 %v max %v",
			bound, rep.P50, rep.P99, rep.P999, rep.Max)
	}
	if rep.Other > 0 {
		t.Errorf("%d answers neither 200, 429 nor 503", rep.Other)
	}
}

// A crowd of distinct clients through 2 proxy processes with Redis healthy:
// both windows exact, at least 95% of what they allow admitted, not one
// decision fallen back, sheds at most 0.1%, every answer within the shed
// bound.
func TestProxyCrowdExact(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a crowd through bin/proxy")
	}
	sh := crowdForm()
	ratecrowd.RaiseNoFile(t, crowdNoFiles(sh, 2), fmt.Sprintf("a crowd of %d clients through 2 proxies", sh.plan.Clients))
	rdb, prefix := servicetest.RedisNode(t)
	addr := rdb.Options().Addr
	up := ratecrowd.StartUpstream(t)
	extra, timeout := "", conf.Default().Proxy.RedisTimeout.Duration
	if sh.redisTimeout > 0 {
		extra, timeout = fmt.Sprintf("redis_timeout = %q", sh.redisTimeout), sh.redisTimeout
	}
	ps := startCrowdProxies(t, 2, crowdRule(sh.limits, extra), up.Addr, "redis://"+addr+"/0", prefix)
	r := runCrowd(t, sh, ps, up, addr)
	defer reportRow(t, "Redis healthy", &r)

	checkExact(t, r.rep)
	if r.degraded > 0 {
		t.Errorf("%.0f of %d decisions fell back to on_redis_error with Redis not faulted (%v; healthy by the issue's measure: %v)",
			r.degraded, r.rep.Sent, r.ping, r.ping.Healthy())
	}
	if r.shed > 0.001*float64(r.rep.Sent) {
		t.Errorf("%.0f sheds, %.3f%% of %d decisions (at most 0.1%%)", r.shed, 100*r.shed/float64(r.rep.Sent), r.rep.Sent)
	}
	if share := r.rep.AdmittedShare(); share < 0.95 {
		t.Errorf("admitted %d, %.1f%% of the %d the limits allow for this demand (at least 95%%)", r.rep.Admitted, 100*share, r.rep.Allowed)
	}
	checkAnswers(t, r.rep, shedBound(timeout))
	if r.rep.IdealByIP == 0 || r.rep.IdealByGlobal == 0 {
		t.Errorf("the demand did not make both windows bind (ideal refusals: per-IP %d, global %d): reshape the crowd", r.rep.IdealByIP, r.rep.IdealByGlobal)
	}
}

// Redis slowed under the crowd (a fault proxy between the proxies and
// Redis adds a delay to every reply chunk): +5 ms with the default
// redis_timeout, +50 ms with redis_timeout = "200ms". Every answer within
// twice the shed bound, none hung; the decisions that went through Redis
// versus fell back or were shed are reported; and the windows are exact for
// every decision that did not fall back. Today's proxy marks no single
// answer as fallen back (only the metric counts them; see degradedMark), so
// the windows are judged strictly when no decision fell back; otherwise
// only the global window, against its limit plus the fallbacks (each admits
// at most one request), and the log says so.
func TestProxyCrowdRedisSlow(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a crowd through bin/proxy")
	}
	// Its timeouts are the (the default, 200ms): judged alone, on a
	// box not busy with other tests (make chaos).
	if os.Getenv(EnvChaos) != "1" {
		t.Skip("make chaos only (SECKILL_CHAOS=1): its redis_timeouts need a box running nothing else")
	}
	sh := crowdForm()
	ratecrowd.RaiseNoFile(t, crowdNoFiles(sh, 2), fmt.Sprintf("a crowd of %d clients through 2 proxies", sh.plan.Clients))
	for _, c := range []struct {
		name         string
		delay        time.Duration
		redisTimeout time.Duration // 0: the default
	}{
		{"5ms per reply, default redis_timeout", 5 * time.Millisecond, 0},
		{"50ms per reply, redis_timeout 200ms", 50 * time.Millisecond, 200 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb, prefix := servicetest.RedisNode(t)
			addr := rdb.Options().Addr
			fp, err := faultnet.Listen("127.0.0.1:0", addr)
			servicetest.Must(t, err, "fault proxy")
			t.Cleanup(func() { _ = fp.Close() })
			extra, timeout := "", conf.Default().Proxy.RedisTimeout.Duration
			if c.redisTimeout > 0 {
				extra, timeout = fmt.Sprintf("redis_timeout = %q", c.redisTimeout), c.redisTimeout
			}
			up := ratecrowd.StartUpstream(t)
			ps := startCrowdProxies(t, 2, crowdRule(sh.limits, extra), up.Addr, "redis://"+fp.Addr()+"/0", prefix)
			sh := sh
			sh.plan.DegradedHeader = degradedMark
			fp.Set(faultnet.Faults{Down: faultnet.Flow{DelayRate: 1, Delay: c.delay}})
			r := runCrowd(t, sh, ps, up, addr)
			defer reportRow(t, "Redis replies +"+c.delay.String(), &r)
			fp.Set(faultnet.Faults{})
			st := fp.Stats()
			t.Logf("fault proxy: %d connections, %d reply chunks delayed by %v; decisions through Redis %.0f of %d (%.1f%%), fallen back %.0f, shed %.0f",
				st.Conns, st.Delayed, c.delay, r.through, r.rep.Sent, 100*r.through/float64(max(1, r.rep.Sent)), r.degraded, r.shed)
			if st.Delayed == 0 {
				t.Fatalf("no reply was delayed: %+v", st)
			}
			checkAnswers(t, r.rep, shedBound(timeout))
			switch {
			case r.degraded == 0:
				checkExact(t, r.rep)
				return
			case r.rep.Degraded > 0:
				t.Logf("windows judged on the answers not marked %s (%d marked; the proxies counted %.0f fallbacks)",
					degradedMark, r.rep.Degraded, r.degraded)
				checkExact(t, r.rep)
				return
			}
			t.Logf("windows not judged strictly: %.0f decisions fell back and no answer says which; global judged against its limit plus those", r.degraded)
			if lim := float64(sh.limits.Global) + r.degraded; float64(r.rep.WorstGlobal.N) > lim {
				t.Errorf("global window: %d admissions certainly inside [%.3fs, +%v) of the run, more than its limit %d plus every fallback (%.0f)",
					r.rep.WorstGlobal.N, r.rep.At(r.rep.WorstGlobal), sh.limits.Window, sh.limits.Global, r.degraded)
			}
		})
	}
}
