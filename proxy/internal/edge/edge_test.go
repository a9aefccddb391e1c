package edge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

// Per-IP exactness: 10/1s, 200 requests from one client in one window: exactly
// 10 reach the upstream, the 190 others are 429 with the documented headers
// and body; once the window frees the client is admitted again.
func TestPerIPExact(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	cfg.Proxy.Rules = []conf.Rule{rule("purchase", 10, 0, time.Second)}
	px := startProxy(t, cfg)
	c := client(px.addr)
	limited := 0
	var maxRetry int
	for i := 0; i < 200; i++ {
		r := get(t, c, "POST", "/api/v1/activities/1/purchase")
		switch r.StatusCode() {
		case 200:
			if got := string(r.Header.Peek("RateLimit-Policy")); got != `"purchase-ip";q=10;w=1` {
				t.Fatalf("admitted RateLimit-Policy = %q", got)
			}
		case 429:
			limited++
			ra, err := strconv.Atoi(string(r.Header.Peek("Retry-After")))
			if err != nil || ra < 1 || ra > 1 {
				t.Fatalf("Retry-After = %q", r.Header.Peek("Retry-After"))
			}
			maxRetry = max(maxRetry, ra)
			if ct := string(r.Header.ContentType()); ct != "application/problem+json" {
				t.Fatalf("429 content type %q", ct)
			}
			if got := string(r.Header.Peek("RateLimit")); got != `"purchase-ip";r=0;t=1` {
				t.Fatalf("RateLimit = %q", got)
			}
			if got := string(r.Header.Peek("RateLimit-Policy")); got != `"purchase-ip";q=10;w=1` {
				t.Fatalf("RateLimit-Policy = %q", got)
			}
			body := string(r.Body())
			if !strings.Contains(body, `"violated-policies":["purchase-ip"]`) || !strings.Contains(body, "quota-exceeded") {
				t.Fatalf("429 body %s", body)
			}
		default:
			t.Fatalf("status %d", r.StatusCode())
		}
	}
	if n := up.hits.Load(); n != 10 || limited != 190 {
		t.Fatalf("forwarded %d, limited %d; want 10 and 190", n, limited)
	}
	// Retry-After is never earlier than the window frees: waiting it out admits.
	time.Sleep(time.Duration(maxRetry)*time.Second + 50*time.Millisecond)
	if r := get(t, c, "POST", "/api/v1/activities/1/purchase"); r.StatusCode() != 200 {
		t.Fatalf("next window: status %d", r.StatusCode())
	}
}

// Global accuracy across two proxy instances sharing Redis: many clients,
// limit L in one window: exactly L admitted (the traffic goes on until
// then).
func TestGlobalTwoInstances(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	const L = 500
	cfg := trustedConfig(t, up.addr, rule("sale", 0, L, 10*time.Second))
	a, b := startProxy(t, cfg), startProxy(t, cfg)
	var wg sync.WaitGroup
	var sent atomic.Int64
	for g := 0; g < 16; g++ {
		px := a
		if g%2 == 1 {
			px = b
		}
		wg.Go(func() {
			c := client(px.addr)
			for i := 0; ; i++ {
				if n := sent.Add(1); n > 10*L || (n > 3*L && up.hits.Load() >= L) {
					return
				}
				ip := fmt.Sprintf("198.51.%d.%d", g, i%250)
				get(t, c, "GET", "/item", "X-Forwarded-For", ip)
			}
		})
	}
	wg.Wait()
	noDegraded(t, a)
	noDegraded(t, b)
	admitted := up.hits.Load()
	t.Logf("admitted %d of %d, limit %d, live %d", admitted, sent.Load(), L, a.p.Handler.Limiter.Live())
	if admitted != L {
		t.Fatalf("admitted %d, want exactly %d", admitted, L)
	}
}

// Spoofing: an untrusted peer's X-Forwarded-For changes nothing; behind a
// trusted peer the header is walked from the right.
func TestSpoofing(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	cfg.Proxy.Rules = []conf.Rule{rule("r", 3, 0, 10*time.Second)}
	untrusted := startProxy(t, cfg)
	c := client(untrusted.addr)
	ok := 0
	for i := 0; i < 8; i++ {
		if get(t, c, "GET", "/", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i)).StatusCode() == 200 {
			ok++
		}
	}
	if ok != 3 {
		t.Fatalf("untrusted peer with varying XFF: %d admitted, want 3 (keyed by the peer)", ok)
	}

	cfg2 := baseConfig(t, up.addr)
	cfg2.Proxy.TrustedProxies = []string{"127.0.0.1/32", "10.0.0.0/8"}
	cfg2.Proxy.Rules = []conf.Rule{rule("r", 3, 0, 10*time.Second)}
	trusted := startProxy(t, cfg2)
	c = client(trusted.addr)
	ok = 0
	for i := 0; i < 8; i++ {
		// The left part is client-controlled; the rightmost untrusted hop is 198.51.100.1.
		xff := fmt.Sprintf("203.0.113.%d, 198.51.100.1, 10.1.2.3", i)
		if get(t, c, "GET", "/", "X-Forwarded-For", xff).StatusCode() == 200 {
			ok++
		}
	}
	if ok != 3 {
		t.Fatalf("trusted peer: %d admitted, want 3 (keyed by 198.51.100.1)", ok)
	}
	for i := 0; i < 5; i++ {
		if s := get(t, c, "GET", "/", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", 10+i)).StatusCode(); s != 200 {
			t.Fatalf("distinct clients behind a trusted proxy: status %d", s)
		}
	}
	h := *up.last.Load()
	if !strings.Contains(h, "198.51.100.14, 127.0.0.1") {
		t.Fatalf("X-Forwarded-For not appended:\n%s", h)
	}
}

// Forwarding: hop-by-hop headers stripped both ways, X-Request-ID set,
// large responses come through whole.
func TestForwardHeadersAndStreaming(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	px := startProxy(t, cfg)
	c := client(px.addr)
	r := get(t, c, "GET", "/x", "Connection", "X-Secret", "X-Secret", "1", "Keep-Alive", "300",
		"TE", "trailers", "Proxy-Authorization", "Basic Zm9v", "Upgrade", "websocket", "X-Keep", "yes")
	if r.StatusCode() != 200 {
		t.Fatalf("status %d", r.StatusCode())
	}
	h := strings.ToLower(*up.last.Load())
	for _, bad := range []string{"x-secret", "keep-alive", "\nte:", "proxy-authorization", "upgrade"} {
		if strings.Contains(h, bad) {
			t.Errorf("upstream received hop-by-hop %q:\n%s", bad, h)
		}
	}
	for _, want := range []string{"x-keep: yes", "x-request-id: ", "x-forwarded-for: 127.0.0.1"} {
		if !strings.Contains(h, want) {
			t.Errorf("upstream lacks %q:\n%s", want, h)
		}
	}
	if len(r.Header.Peek("Keep-Alive")) > 0 || len(r.Header.Peek("Proxy-Foo")) > 0 {
		t.Errorf("hop-by-hop response headers passed: %s", r.Header.String())
	}
	big := get(t, c, "GET", "/big")
	if big.StatusCode() != 200 || len(big.Body()) != 128*64<<10 || !bytes.Equal(big.Body()[:4], []byte("xxxx")) {
		t.Fatalf("streamed body: status %d, %d bytes", big.StatusCode(), len(big.Body()))
	}
}

// Bad input: malformed request line, oversized header and body, slowloris,
// upstream down and slow.
func TestBadInput(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	cfg.Proxy.MaxHeaderBytes = 2048
	cfg.Proxy.MaxBodyBytes = 4096
	cfg.Proxy.ReadTimeout = conf.D(300 * time.Millisecond)
	cfg.Proxy.UpstreamTimeout = conf.D(300 * time.Millisecond)
	px := startProxy(t, cfg)
	cases := []struct {
		name, req, want string
	}{
		{"malformed request line", "GARBAGE\r\n\r\n", "HTTP/1.1 400"},
		{"oversized header", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 4096) + "\r\n\r\n", "HTTP/1.1 431"},
		{"oversized body", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n" + strings.Repeat("b", 10000), "HTTP/1.1 413"},
	}
	for _, tc := range cases {
		got := raw(t, px.addr, tc.req, 2*time.Second)
		if !strings.HasPrefix(got, tc.want) || !strings.Contains(got, "application/problem+json") {
			t.Errorf("%s: got %.120q, want %s", tc.name, got, tc.want)
		}
	}
	// Slowloris: half a header, then silence; the read timeout closes it.
	start := time.Now()
	got := raw(t, px.addr, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ", 5*time.Second)
	if el := time.Since(start); el >= 5*time.Second {
		t.Fatalf("slowloris connection still open after %v (got %q)", el, got)
	}
	if up.hits.Load() != 0 {
		t.Fatalf("bad requests reached the upstream: %d", up.hits.Load())
	}

	// Upstream slow: 504; upstream down: 502.
	up.delay.Store(int64(time.Second))
	c := client(px.addr)
	if s := get(t, c, "GET", "/slow").StatusCode(); s != 504 {
		t.Fatalf("slow upstream: %d, want 504", s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "listen")
	dead := ln.Addr().String()
	ln.Close()
	cfg.Proxy.Upstreams = []string{"http://" + dead}
	down := startProxy(t, cfg)
	if s := get(t, client(down.addr), "GET", "/").StatusCode(); s != 502 {
		t.Fatalf("down upstream: %d, want 502", s)
	}
}

// Sold out: the backend's sold_out answer is replayed by the proxy for the
// TTL, and forgotten at once on a stock event.
func TestSoldOutCache(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	cfg.Proxy.SoldOutTTL = conf.D(time.Minute)
	px := startProxy(t, cfg)
	c := client(px.addr)
	first := get(t, c, "POST", "/api/v1/activities/7/purchase")
	for i := 0; i < 5; i++ {
		r := get(t, c, "POST", "/api/v1/activities/7/purchase")
		if r.StatusCode() != 409 || !bytes.Equal(r.Body(), first.Body()) || string(r.Header.ContentType()) != "application/json" {
			t.Fatalf("cached answer: %d %s %s", r.StatusCode(), r.Header.ContentType(), r.Body())
		}
	}
	if n := up.hits.Load(); n != 1 {
		t.Fatalf("upstream saw %d purchases, want 1", n)
	}
	servicetest.Must(t, px.rdb.Publish(context.Background(), cfg.Redis.KeyPrefix+"seckill:stock-events", "7").Err(), "publish")
	deadline := time.Now().Add(5 * time.Second)
	for up.hits.Load() == 1 && time.Now().Before(deadline) {
		get(t, c, "POST", "/api/v1/activities/7/purchase")
		time.Sleep(10 * time.Millisecond)
	}
	if up.hits.Load() < 2 {
		t.Fatal("stock event did not clear the sold-out flag")
	}
}

// Redis down, paused and slow: each on_redis_error mode behaves as
// documented and latency stays bounded by the Redis timeout (plus a loose
// margin for a shared machine: this proves no request waits on Redis).
func TestRedisFaults(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not installed (CI requires it: make services)")
		}
		t.Skip("redis-server not installed")
	}
	up := startUpstream(t)
	for _, fault := range []string{"down", "paused", "slow"} {
		for _, mode := range []string{"local", "open", "closed"} {
			t.Run(fault+"/"+mode, func(t *testing.T) {
				addr := servicetest.PrivateRedis(t).Addr
				redisAddr := addr
				switch fault {
				case "slow":
					redisAddr = slowProxy(t, addr, 200*time.Millisecond)
				}
				cfg := baseConfig(t, up.addr)
				cfg.Redis.URL = "redis://" + redisAddr + "/0"
				r := rule("r", 5, 0, 30*time.Second)
				r.OnRedisError = mode
				cfg.Proxy.Rules = []conf.Rule{r}
				px := startProxy(t, cfg)
				switch fault {
				case "down":
					killRedis(t, addr)
				case "paused":
					pauseRedis(t, addr)
				}
				c := client(px.addr)
				codes := map[int]int{}
				var lat []time.Duration
				for i := 0; i < 30; i++ {
					start := time.Now()
					codes[get(t, c, "GET", "/").StatusCode()]++
					lat = append(lat, time.Since(start))
				}
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				p99 := lat[len(lat)*99/100]
				if p99 > cfg.Proxy.RedisTimeout.Duration+time.Second {
					t.Errorf("p99 %v while Redis is %s", p99, fault)
				}
				switch mode {
				case "open":
					if codes[200] != 30 {
						t.Errorf("open: %v, want all 200", codes)
					}
				case "closed":
					if codes[503] != 30 {
						t.Errorf("closed: %v, want all 503", codes)
					}
				case "local":
					if codes[200] != 5 || codes[429] != 25 {
						t.Errorf("local: %v, want 5 admitted (limit/1 live instance) and 25 limited", codes)
					}
				}
				if metricSum(scrape(t, px), `seckill_proxy_decisions_total{outcome="degraded",rule="r"}`) == 0 {
					t.Errorf("no degraded decisions in metrics")
				}
			})
		}
	}
}

// A handler that panics (the test hook injects one) answers 500 as problem
// JSON and closes that connection; the proxy keeps serving the next request.
func TestPanicAnswers500AndTheProxyServesOn(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, baseConfig(t, up.addr))
	boom := func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/boom" {
			panic("injected")
		}
	}
	p.p.beforeServe.Store(&boom)
	c := client(p.addr)
	resp := get(t, c, "GET", "/boom")
	if resp.StatusCode() != fasthttp.StatusInternalServerError || string(resp.Header.ContentType()) != "application/problem+json" ||
		!resp.ConnectionClose() {
		t.Fatalf("panic answered %d %q close=%v: %s", resp.StatusCode(), resp.Header.ContentType(), resp.ConnectionClose(), resp.Body())
	}
	for range 3 {
		if resp := get(t, c, "GET", "/fine"); resp.StatusCode() != fasthttp.StatusOK {
			t.Fatalf("after the panic: %d %s", resp.StatusCode(), resp.Body())
		}
	}
}

// MaxConnsPerIP bounds one client's connections, Concurrency all of them:
// beyond either the proxy refuses with problem details and Retry-After (429
// per address, 503 in all) and closes; the connection held passes.
func TestMaxConnsPerIP(t *testing.T) {
	t.Parallel()
	t.Run("per_ip", func(t *testing.T) {
		t.Parallel()
		cfg := baseConfig(t, startUpstream(t).addr)
		cfg.Proxy.MaxConnsPerIP = 1
		connBound(t, cfg, "429", "too-many-connections-per-ip")
	})
	t.Run("concurrency", func(t *testing.T) {
		t.Parallel()
		cfg := baseConfig(t, startUpstream(t).addr)
		cfg.Proxy.Concurrency = 1
		connBound(t, cfg, "503", "too-many-connections")
	})
}

func connBound(t *testing.T, cfg conf.Config, status, code string) {
	t.Helper()
	p := startProxy(t, cfg)
	first, err := net.Dial("tcp", p.addr)
	servicetest.Must(t, err, "dial")
	defer first.Close()
	_, err = first.Write([]byte("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"))
	servicetest.Must(t, err, "write")
	buf := make([]byte, 512)
	_ = first.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := first.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200") {
		t.Fatalf("first connection: %q %v", buf[:n], err)
	}
	// The first connection is still open: a second one is refused.
	got := raw(t, p.addr, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n", 5*time.Second)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := resp.Read(bufio.NewReader(strings.NewReader(got))); err != nil {
		t.Fatalf("second connection: %q: %v", got, err)
	}
	var body struct{ Code string }
	if !strings.HasPrefix(got, "HTTP/1.1 "+status) || string(resp.Header.ContentType()) != "application/problem+json" ||
		string(resp.Header.Peek("Retry-After")) != "1" || json.Unmarshal(resp.Body(), &body) != nil || body.Code != code {
		t.Fatalf("second connection: %q, want %s problem details %q with Retry-After", got, status, code)
	}
	// The held connection still serves.
	_, err = first.Write([]byte("GET /c HTTP/1.1\r\nHost: x\r\n\r\n"))
	servicetest.Must(t, err, "write")
	if n, err := first.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200") {
		t.Fatalf("held connection after the refusal: %q %v", buf[:n], err)
	}
}

// [proxy] limiter = "memory": the windows live in the process, exact for
// it, and no decision calls Redis.
func TestMemoryLimiter(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := trustedConfig(t, up.addr, rule("mem", 3, 0, 10*time.Second))
	cfg.Proxy.Limiter = "memory"
	px := startProxy(t, cfg)
	for round := range 5 {
		codes, _ := burst(t, px.addr, 9, "GET", "/x", "X-Forwarded-For", freshIP())
		if codes[200] != 3 || codes[429] != 6 {
			t.Fatalf("round %d: %v, want exactly 3 admitted and 6 limited", round, codes)
		}
	}
	if n := px.p.Metrics.Calls(); n != 0 {
		t.Fatalf("%d Redis calls with the memory limiter", n)
	}
}
