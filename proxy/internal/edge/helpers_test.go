package edge

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

type upstream struct {
	addr  string
	hits  atomic.Int64
	delay atomic.Int64 // ns
	last  atomic.Pointer[string]
	// ledger counts the requests that reached the upstream per value of
	// their X-Test-Client header (the client's own ledger, upstream side).
	ledger sync.Map // string -> *atomic.Int64
}

func (u *upstream) count(client string) int64 {
	if v, ok := u.ledger.Load(client); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// startUpstream serves on a random port; /big streams 8 MiB; purchase of
// activity 7 answers sold_out; everything else 200 with the request headers
// recorded.
func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	u.addr = servicetest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		u.hits.Add(1)
		if c := ctx.Request.Header.Peek("X-Test-Client"); len(c) > 0 {
			v, _ := u.ledger.LoadOrStore(string(c), new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}
		if d := u.delay.Load(); d > 0 {
			time.Sleep(time.Duration(d))
		}
		h := ctx.Request.Header.String()
		u.last.Store(&h)
		switch string(ctx.Path()) {
		case "/big":
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				chunk := []byte(strings.Repeat("x", 64<<10))
				for i := 0; i < 128; i++ {
					_, _ = w.Write(chunk)
					_ = w.Flush()
				}
			})
			return
		case "/api/v1/activities/7/purchase":
			// A keyed purchase is a replay of an accepted order (as the
			// backend answers it from its own store); a new one is sold out.
			if k := ctx.Request.Header.Peek("Idempotency-Key"); len(k) > 0 {
				ctx.SetStatusCode(202)
				ctx.SetContentType("application/json")
				ctx.SetBodyString(`{"order_id":"o-` + string(k) + `","status":"confirmed"}`)
				return
			}
			ctx.SetStatusCode(409)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"code":"sold_out","message":"activity 7 is sold out"}`)
			return
		}
		ctx.Response.Header.Set("Keep-Alive", "timeout=5")
		ctx.Response.Header.Set("Proxy-Foo", "x")
		ctx.SetBodyString("ok")
	}})
	return u
}

type proxyUnderTest struct {
	addr string
	p    *Proxy
	rdb  redis.UniversalClient
}

// startProxy runs one proxy instance on random ports, with its own Redis
// client, limiter and instance id (as a separate process would have).
func startProxy(t *testing.T, cfg conf.Config, opts ...Option) *proxyUnderTest {
	t.Helper()
	servicetest.Must(t, cfg.Validate(), "config")
	rdb := cfg.Redis.NewClient()
	t.Cleanup(func() { _ = rdb.Close() })
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("SECKILL_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	p, err := New(cfg, rdb, log, opts...)
	servicetest.Must(t, err, "new proxy")
	addr := servicetest.Serve(t, p.Server(log), p.Listener)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Handler.Limiter.Run(ctx); close(done) }()
	roomsDone := make(chan struct{})
	go func() { p.Handler.Rooms.Run(ctx); close(roomsDone) }()
	ready := make(chan struct{})
	go p.WatchStockEvents(ctx, rdb, log, ready)
	<-ready
	t.Cleanup(func() { cancel(); <-done; <-roomsDone }) // before Serve's shutdown
	return &proxyUnderTest{addr: addr, p: p, rdb: rdb}
}

// baseConfig points at the test Redis with the test's key prefix and at up.
func baseConfig(t *testing.T, up string) conf.Config {
	t.Helper()
	_, prefix := servicetest.Redis(t)
	cfg := conf.Default()
	cfg.Redis.URL = servicetest.RedisURL()
	cfg.Redis.KeyPrefix = prefix
	cfg.Proxy.Upstreams = []string{"http://" + up}
	cfg.Proxy.Listen, cfg.Proxy.AdminListen = "127.0.0.1:0", "127.0.0.1:1"
	cfg.Proxy.RedisTimeout = conf.D(50 * time.Millisecond)
	cfg.Proxy.Rules = nil
	return cfg
}

func rule(name string, perIP, global int, window time.Duration) conf.Rule {
	r := conf.Rule{Name: name, PathPrefix: "/", OnRedisError: "local"}
	if perIP > 0 {
		r.PerIP = &conf.Window{Limit: perIP, Window: conf.D(window)}
	}
	if global > 0 {
		r.Global = &conf.Window{Limit: global, Window: conf.D(window)}
	}
	return r
}

func client(addr string) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: addr, MaxConns: 64, ReadTimeout: 10 * time.Second}
}

// get sends one request with extra headers (name, value pairs).
func get(t *testing.T, c *fasthttp.HostClient, method, path string, hdr ...string) *fasthttp.Response {
	t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://" + c.Addr + path)
	req.Header.SetMethod(method)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp := &fasthttp.Response{}
	servicetest.Must(t, c.Do(req, resp), "%s %s", method, path)
	return resp
}

// raw writes s on a fresh connection and returns what comes back until close
// or timeout.
func raw(t *testing.T, addr, s string, wait time.Duration) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	servicetest.Must(t, err, "dial")
	defer c.Close()
	_, _ = io.WriteString(c, s)
	_ = c.SetReadDeadline(time.Now().Add(wait))
	b, _ := io.ReadAll(c)
	return string(b)
}

// scrape returns the proxy's /metrics text.
func scrape(t *testing.T, px *proxyUnderTest) string {
	t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/metrics")
	px.p.Handler.Admin(&ctx)
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("/metrics: %d", ctx.Response.StatusCode())
	}
	return string(ctx.Response.Body())
}

// metricSum adds the values of every sample line of text starting with
// series (a metric name with the start of its labels).
func metricSum(text, series string) float64 {
	sum := 0.0
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, series) {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			v, _ := strconv.ParseFloat(line[i+1:], 64)
			sum += v
		}
	}
	return sum
}
