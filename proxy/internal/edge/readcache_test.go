package edge

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// stateUpstream answers GET /api/v1/activities/{id} like the backend (200,
// Cache-Control max-age, Age) with a version number in the body, counting the
// reads; /nostore says no-store, /cookie sets a cookie; the purchase of 7
// answers sold out.
type stateUpstream struct {
	addr    string
	reads   atomic.Int64
	version atomic.Int64
}

func startStateUpstream(t *testing.T) *stateUpstream {
	t.Helper()
	u := &stateUpstream{}
	u.addr = servicetest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		u.reads.Add(1)
		ctx.SetContentType("application/json")
		switch p := string(ctx.Path()); p {
		case "/api/v1/activities/7/purchase":
			ctx.SetStatusCode(409)
			ctx.SetBodyString(`{"code":"sold_out","message":"sold out"}`)
			return
		case "/api/v1/activities/9/nostore":
			ctx.Response.Header.Set("Cache-Control", "no-store")
		case "/api/v1/activities/9/big":
			ctx.Response.Header.Set("Cache-Control", "max-age=60")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for range 16 {
					_, _ = w.Write(bytes.Repeat([]byte("x"), 64<<10))
					_ = w.Flush()
				}
			})
			return
		case "/api/v1/activities/9/cookie":
			ctx.Response.Header.Set("Cache-Control", "max-age=60")
			ctx.Response.Header.Set("Set-Cookie", "s=1")
		default:
			ctx.Response.Header.Set("Cache-Control", "max-age=60")
			ctx.Response.Header.Set("Age", "2")
		}
		ctx.SetBodyString(fmt.Sprintf(`{"path":%q,"version":%d}`, ctx.Path(), u.version.Load()))
	}})
	return u
}

func readCacheProxy(t *testing.T, ttl time.Duration) (*stateUpstream, *proxyUnderTest, *fasthttp.HostClient) {
	t.Helper()
	up := startStateUpstream(t)
	cfg := baseConfig(t, up.addr)
	cfg.Proxy.SoldOutTTL = conf.D(time.Minute)
	r := rule("state", 1_000_000, 0, time.Second)
	r.Methods, r.PathPrefix, r.ReadCacheTTL = []string{"GET"}, "/api/v1/activities/", conf.D(ttl)
	cfg.Proxy.Rules = []conf.Rule{r}
	px := startProxy(t, cfg)
	return up, px, client(px.addr)
}

func TestReadCacheAnswersWithoutTheUpstream(t *testing.T) {
	t.Parallel()
	up, px, c := readCacheProxy(t, time.Minute)
	first := get(t, c, "GET", "/api/v1/activities/7")
	for range 50 {
		r := get(t, c, "GET", "/api/v1/activities/7")
		if r.StatusCode() != 200 || string(r.Body()) != string(first.Body()) || string(r.Header.ContentType()) != "application/json" ||
			string(r.Header.Peek("Cache-Control")) != "max-age=60" {
			t.Fatalf("cached answer: %d %q %q %s", r.StatusCode(), r.Header.ContentType(), r.Header.Peek("Cache-Control"), r.Body())
		}
		if age, _ := strconv.Atoi(string(r.Header.Peek("Age"))); age < 2 {
			t.Fatalf("Age %q: the upstream's age (2) is lost", r.Header.Peek("Age"))
		}
	}
	if n := up.reads.Load(); n != 1 {
		t.Fatalf("upstream read %d times, want 1", n)
	}
	// Another URI is another entry; a query string too.
	get(t, c, "GET", "/api/v1/activities/8")
	get(t, c, "GET", "/api/v1/activities/7?x=1")
	get(t, c, "GET", "/api/v1/activities/7?x=1")
	if n := up.reads.Load(); n != 3 {
		t.Errorf("upstream read %d times, want 3", n)
	}
	// Credentials, no-store, a cookie, another method: never from the cache.
	before := up.reads.Load()
	get(t, c, "GET", "/api/v1/activities/7", "Authorization", "Bearer x")
	get(t, c, "GET", "/api/v1/activities/7", "Cookie", "a=b")
	for range 2 {
		get(t, c, "GET", "/api/v1/activities/9/nostore")
		get(t, c, "GET", "/api/v1/activities/9/cookie")
	}
	get(t, c, "HEAD", "/api/v1/activities/8")
	for range 2 { // chunked, 1 MiB: streamed through, never buffered or kept
		if r := get(t, c, "GET", "/api/v1/activities/9/big"); r.StatusCode() != 200 || len(r.Body()) != 1<<20 {
			t.Errorf("big answer: %d, %d bytes", r.StatusCode(), len(r.Body()))
		}
	}
	if n := up.reads.Load() - before; n != 9 {
		t.Errorf("uncacheable requests reached the upstream %d times, want 9", n)
	}

	// News about activity 7 (the stock-event channel) drops its entries, not
	// those of 8.
	up.version.Store(1)
	servicetest.Must(t, px.rdb.Publish(context.Background(), reservation.Channel(px.p.cfg.Redis.KeyPrefix), "7").Err(), "publish")
	deadline := time.Now().Add(10 * time.Second)
	for string(get(t, c, "GET", "/api/v1/activities/7").Body()) == string(first.Body()) {
		if time.Now().After(deadline) {
			t.Fatal("a stock event never dropped the cached state")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if b := string(get(t, c, "GET", "/api/v1/activities/8").Body()); b != `{"path":"/api/v1/activities/8","version":0}` {
		t.Errorf("activity 8 after news about 7: %s", b)
	}

	// The proxy learning that 7 sold out drops its cached state too.
	up.version.Store(2)
	get(t, c, "POST", "/api/v1/activities/7/purchase")
	if b := string(get(t, c, "GET", "/api/v1/activities/7").Body()); b != `{"path":"/api/v1/activities/7","version":2}` {
		t.Errorf("state after the sold-out answer was learnt: %s", b)
	}
}

func TestReadCacheTTL(t *testing.T) {
	t.Parallel()
	const ttl = 200 * time.Millisecond
	up, _, c := readCacheProxy(t, ttl)
	get(t, c, "GET", "/api/v1/activities/5")
	stored := time.Now()
	get(t, c, "GET", "/api/v1/activities/5")
	if time.Since(stored) < ttl/2 && up.reads.Load() != 1 {
		t.Errorf("a read within the TTL reached the upstream")
	}
	time.Sleep(ttl)
	get(t, c, "GET", "/api/v1/activities/5")
	if n := up.reads.Load(); n < 2 {
		t.Errorf("after the TTL the cache still answered (upstream reads %d)", n)
	}
}

// A rule without read_cache_ttl caches nothing.
func TestReadCacheOff(t *testing.T) {
	t.Parallel()
	up, _, c := readCacheProxy(t, 0)
	for range 3 {
		get(t, c, "GET", "/api/v1/activities/5")
	}
	if n := up.reads.Load(); n != 3 {
		t.Errorf("upstream read %d times, want 3", n)
	}
}
