package forward

import (
	"bufio"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// stripHop: the allocation-free check lets nothing through, in requests and
// responses; headers that are not hop-by-hop stay.
func TestStripHop(t *testing.T) {
	for _, tc := range []struct {
		name, hdr string
		gone      []string
	}{
		{"none", "X-Keep: 1\r\n", nil},
		{"connection names", "Connection: X-Secret, keep-alive\r\nX-Secret: 1\r\nX-Keep: 1\r\n", []string{"Connection", "X-Secret"}},
		{"hop set", "Keep-Alive: 300\r\nTE: trailers\r\nUpgrade: websocket\r\nX-Keep: 1\r\n", []string{"Keep-Alive", "TE", "Upgrade"}},
		{"proxy-*", "Proxy-Authorization: Basic x\r\nproxy-foo: y\r\nX-Keep: 1\r\n", []string{"Proxy-Authorization", "Proxy-Foo"}},
		{"lower case", "keep-alive: 1\r\nupgrade: h2c\r\nX-Keep: 1\r\n", []string{"Keep-Alive", "Upgrade"}},
	} {
		var req fasthttp.Request
		if err := req.Read(bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost: h\r\n" + tc.hdr + "\r\n"))); err != nil {
			t.Fatalf("%s: read request: %v", tc.name, err)
		}
		var resp fasthttp.Response
		if err := resp.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + tc.hdr + "\r\n"))); err != nil {
			t.Fatalf("%s: read response: %v", tc.name, err)
		}
		stripHop(&req.Header)
		stripHop(&resp.Header)
		for _, h := range tc.gone {
			if v := req.Header.Peek(h); len(v) > 0 {
				t.Errorf("%s: request kept %s: %q", tc.name, h, v)
			}
			if v := resp.Header.Peek(h); len(v) > 0 {
				t.Errorf("%s: response kept %s: %q", tc.name, h, v)
			}
		}
		if string(req.Header.Peek("X-Keep")) != "1" || string(resp.Header.Peek("X-Keep")) != "1" {
			t.Errorf("%s: X-Keep lost", tc.name)
		}
	}
}

func TestAnyHop(t *testing.T) {
	for k, want := range map[string]bool{
		"Connection": true, "Keep-Alive": true, "Te": true, "TE": true, "Trailer": true,
		"Transfer-Encoding": true, "Upgrade": true, "Proxy-Connection": true, "proxy-x": true,
		"Content-Type": false, "Cookie": false, "Tee": false, "Proxy": false, "User-Agent": false, "X": false,
	} {
		if got := anyHop([][]byte{[]byte(k)}); got != want {
			t.Errorf("anyHop(%q) = %v, want %v", k, got, want)
		}
	}
}

// BenchmarkPrepare: the per-request header work of the forward path, which
// must not allocate.
func BenchmarkPrepare(b *testing.B) {
	p, err := NewPool([]string{"http://127.0.0.1:1"}, Options{RequestIDPrefix: "bench-"})
	if err != nil {
		b.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	ctx.Init(&req, nil, nil)
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"))); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		ctx.Request.Header.Reset()
		ctx.Request.Header.SetRequestURI("/api/v1/activities/1/purchase")
		ctx.Request.Header.Set("User-Agent", "wrk")
		p.PrepareRequest(&ctx)
		p.prepareResponse(&resp)
	}
}

// BenchmarkDo: one exchange with an in-memory upstream through Do, the pool
// as it is ("pool": its transport reads a small response whole, DoTimeout's
// deadline bounds the exchange) beside the path it had before ("before":
// fasthttp's DefaultTransport streaming every response, and ReadTimeout and
// WriteTimeout beside the deadline). cpu-ns/op is the whole process's CPU
// (client and upstream) per exchange.
func BenchmarkDo(b *testing.B) {
	for _, name := range []string{"before", "pool"} {
		b.Run(name, func(b *testing.B) {
			ln := fasthttputil.NewInmemoryListener()
			body := []byte(`{"ok":true}`)
			srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
				ctx.SetContentType("application/json")
				ctx.SetBody(body)
			}, NoDefaultDate: true, NoDefaultServerHeader: true}
			go func() { _ = srv.Serve(ln) }()
			defer ln.Close()
			p, err := NewPool([]string{"http://bench"}, Options{Timeout: 5 * time.Second, RequestIDPrefix: "bench-",
				Dial: func(string) (net.Conn, error) { return ln.Dial() }})
			if err != nil {
				b.Fatal(err)
			}
			if name == "before" {
				hc := p.ups[0].hc
				hc.Transport, hc.ReadTimeout, hc.WriteTimeout = nil, 5*time.Second, 5*time.Second
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			b.RunParallel(func(pb *testing.PB) {
				var ctx fasthttp.RequestCtx
				var req fasthttp.Request
				ctx.Init(&req, nil, nil)
				for pb.Next() {
					ctx.Request.Header.SetRequestURI("/api/v1/activities/1")
					ctx.Request.Header.SetHost("bench")
					if err := p.Do(&ctx); err != nil {
						b.Fatal(err)
					}
					if ctx.Response.StatusCode() != fasthttp.StatusOK {
						b.Fatalf("status %d", ctx.Response.StatusCode())
					}
				}
			})
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
