package edge

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/proxy/internal/forward"
)

// benchUpstream is proxy/benchserver's upstream on an in-memory listener.
func benchUpstream(b *testing.B) *fasthttputil.InmemoryListener {
	b.Helper()
	ln := fasthttputil.NewInmemoryListener()
	body := []byte(`{"ok":true}`)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
	}, NoDefaultDate: true, NoDefaultServerHeader: true}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = ln.Close() })
	return ln
}

// runRequests serves handler with srv on an in-memory listener and sends it
// GET / from b.RunParallel goroutines over keep-alive connections, as wrk
// does: the whole request path, server parsing and writing included.
func runRequests(b *testing.B, srv *fasthttp.Server, status int, hdr ...string) {
	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = ln.Close() })
	c := &fasthttp.HostClient{Addr: "bench", Dial: func(string) (net.Conn, error) { return ln.Dial() },
		MaxConns: 4096, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	// One request first: warms the connection, and spends the one slot of
	// BenchmarkServeLimited.
	// A waiting room's ticket, when the warm-up got one, goes back with
	// every request, as a poller sends it.
	warm, warmResp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	warm.SetRequestURI("http://bench/")
	servicetest.Must(b, c.Do(warm, warmResp), "warm-up request")
	if tk := warmResp.Header.Peek("Room-Ticket"); len(tk) > 0 {
		hdr = append(hdr, "Room-Ticket", string(tk))
	}
	fasthttp.ReleaseRequest(warm)
	fasthttp.ReleaseResponse(warmResp)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		var req fasthttp.Request
		var resp fasthttp.Response
		req.SetRequestURI("http://bench/")
		req.Header.Set("User-Agent", "wrk")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		for pb.Next() {
			if err := c.Do(&req, &resp); err != nil {
				b.Fatal(err)
			}
			if resp.StatusCode() != status {
				b.Fatalf("status %d: %s", resp.StatusCode(), resp.Body())
			}
		}
	})
	// CPU time (user+system, whole process: client, server, upstream) per
	// request: steadier than ns/op on a shared machine.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPassthrough is the bare fasthttp pass-through of
// proxy/benchserver: the floor of the forwarding work.
func BenchmarkPassthrough(b *testing.B) {
	ln := benchUpstream(b)
	hc := &fasthttp.HostClient{Addr: "bench", Dial: func(string) (net.Conn, error) { return ln.Dial() },
		MaxConns: 4096, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	runRequests(b, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
			ctx.Error("bad gateway", fasthttp.StatusBadGateway)
		}
	}, NoDefaultDate: true, NoDefaultServerHeader: true}, fasthttp.StatusOK)
}

// BenchmarkServe is the proxy's whole request path (its server settings,
// identity, a per-IP and a global rule that never trigger, forwarding,
// RateLimit headers) against the same upstream: compare with
// BenchmarkPassthrough. The aim is at most 1/0.9 of its ns/op.
func BenchmarkServe(b *testing.B) {
	benchProxy(b, 10_000_000, time.Second, fasthttp.StatusOK)
}

// BenchmarkServeLimited: every request is answered 429 by the proxy (a
// per-IP limit of 1 per hour, spent), from the local negative cache.
func BenchmarkServeLimited(b *testing.B) {
	benchProxy(b, 1, time.Hour, fasthttp.StatusTooManyRequests)
}

func benchProxy(b *testing.B, perIP int, window time.Duration, status int) {
	benchProxyWith(b, perIP, window, status, nil)
}

// benchProxyWith is benchProxy with a config edit and request headers.
func benchProxyWith(b *testing.B, perIP int, window time.Duration, status int, edit func(*conf.Config), hdr ...string) {
	ln := benchUpstream(b)
	rdb, prefix := servicetest.Redis(b)
	cfg := conf.Default()
	cfg.Redis.URL = servicetest.RedisURL()
	cfg.Redis.KeyPrefix = prefix
	cfg.Proxy.Upstreams = []string{"http://bench"}
	cfg.Proxy.RedisTimeout = conf.D(50 * time.Millisecond)
	r := rule("bench", perIP, 10_000_000, window)
	cfg.Proxy.Rules = []conf.Rule{r}
	if edit != nil {
		edit(&cfg)
	}
	servicetest.Must(b, cfg.Validate(), "config")
	log := slog.New(slog.DiscardHandler)
	p, err := New(cfg, rdb, log)
	servicetest.Must(b, err, "new proxy")
	p.Handler.Pool, err = forward.NewPool(cfg.Proxy.Upstreams, forward.Options{
		ConnectTimeout: time.Second, Timeout: 5 * time.Second, RequestIDPrefix: "bench-",
		Metrics: forward.NewMetrics(prometheus.NewRegistry()), // the proxy's registry has the replaced pool's
		Dial:    func(string) (net.Conn, error) { return ln.Dial() },
	})
	servicetest.Must(b, err, "pool")
	calls := p.Metrics.Calls
	before, cmds := calls(), redisCommands(b, rdb)
	runRequests(b, p.Server(log), status, hdr...)
	b.ReportMetric(float64(calls()-before)/float64(b.N), "redis-calls/op")
	// every command Redis ran meanwhile (the room's steps, other tests on
	// the shared Redis too: an upper bound)
	b.ReportMetric(float64(redisCommands(b, rdb)-cmds)/float64(b.N), "redis-cmds/op")
}

// BenchmarkServeForward is BenchmarkServe without rules: the proxy's server,
// identity, gate and forwarding alone, the part BenchmarkPassthrough does.
func BenchmarkServeForward(b *testing.B) {
	benchProxyWith(b, 1, time.Second, fasthttp.StatusOK, func(c *conf.Config) { c.Proxy.Rules = nil })
}

// BenchmarkServeWaiting: every request is the poll of a client in a
// waiting room's line that never moves, with the ticket its first request
// got, answered 429 from the line as this instance last saw it, with no
// Redis call: compare with BenchmarkServeLimited (the aim: at least 0.8 of
// its rate, at most 0.1 Redis commands per poll).
func BenchmarkServeWaiting(b *testing.B) {
	key := filepath.Join(b.TempDir(), "room.key")
	servicetest.Must(b, os.WriteFile(key, []byte(strings.Repeat("k", 32)), 0o600), "key")
	benchProxyWith(b, 10_000_000, time.Second, fasthttp.StatusTooManyRequests, func(c *conf.Config) {
		c.Proxy.Rules[0].WaitingRoom = &conf.WaitingRoom{KeyFile: key, ActivityID: 1, AdmitPerSecond: 0.01}
	})
}

// redisCommands is the sum of every command's calls in INFO commandstats.
func redisCommands(b *testing.B, rdb redis.UniversalClient) int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	servicetest.Must(b, err, "commandstats")
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if _, rest, ok := strings.Cut(line, "calls="); ok && strings.HasPrefix(line, "cmdstat_") {
			v, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			n += v
		}
	}
	return n
}
