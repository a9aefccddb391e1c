package forward

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// rawUpstream answers request "/N" with canned[N], byte for byte, on
// keep-alive connections; after one whose close is set it closes the
// connection.
type rawUpstream struct {
	ln     net.Listener
	canned []canned
}

type canned struct {
	name     string
	method   string // "" GET
	raw      string
	close    bool // the upstream closes the connection after writing raw
	streamed bool // the pool's transport streams it (bufferUpTo 16)
	reused   bool // the connection is fit for the next exchange afterwards
	fails    bool // Do fails (502), where DefaultTransport did not
}

var cases = []canned{
	{name: "small", raw: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello", reused: true},
	{name: "at the bound", raw: "HTTP/1.1 201 Created\r\nContent-Length: 16\r\nX-A: 1\r\n\r\n0123456789abcdef", reused: true},
	{name: "large", raw: "HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n0123456789012345678901234567890123456789", streamed: true, reused: true},
	{name: "chunked", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", streamed: true, reused: true},
	{name: "chunked with a trailer", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n", streamed: true, reused: true},
	{name: "no content", raw: "HTTP/1.1 204 No Content\r\nX-B: 2\r\n\r\n", reused: true},
	{name: "not modified", raw: "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\nEtag: \"x\"\r\n\r\n", reused: true},
	{name: "interim", raw: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", reused: true},
	{name: "head", method: "HEAD", raw: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", reused: true},
	{name: "hop-by-hop", raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: X-Gone\r\nX-Gone: 1\r\nKeep-Alive: timeout=5\r\nProxy-Foo: 1\r\n\r\nok", reused: true},
	{name: "small, then close", raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", close: true},
	{name: "until close", raw: "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nthe body ends where the connection does", close: true, streamed: true},
	{name: "cut short, large", raw: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", close: true, streamed: true},
	// fasthttp's stream made this a 200 whose body is its error text
	// ("unexpected EOF"); read whole, it is what it is, an upstream failure.
	{name: "cut short, small", raw: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nonly", close: true, fails: true},
	{name: "length and chunked", raw: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", streamed: true, reused: true},
	{name: "status 502", raw: "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\n\r\nbad", reused: true},
	{name: "garbage", raw: "SMTP ready\r\n\r\n", close: true},
}

func startRaw(t *testing.T) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln, canned: cases}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go u.serve(c)
		}
	}()
	return u
}

func (u *rawUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return
		}
		for { // the rest of the header; the requests have no body
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if l == "\r\n" {
				break
			}
		}
		i, err := strconv.Atoi(strings.TrimPrefix(f[1], "/"))
		if err != nil || i < 0 || i >= len(u.canned) {
			return
		}
		if _, err := io.WriteString(c, u.canned[i].raw); err != nil || u.canned[i].close {
			return
		}
	}
}

// answer is what the edge hands on of one exchange: the header (after
// prepareResponse) and the body, read to its end.
type answer struct {
	header, body string
	streamed     bool
	err          bool
}

func exchange(t *testing.T, p *Pool, c canned, i int) answer {
	t.Helper()
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	ctx.Init(&req, nil, nil)
	ctx.Request.Header.SetRequestURI("/" + strconv.Itoa(i))
	ctx.Request.Header.SetHost("up")
	if c.method != "" {
		ctx.Request.Header.SetMethod(c.method)
	}
	if err := p.Do(&ctx); err != nil {
		return answer{err: true}
	}
	a := answer{header: ctx.Response.Header.String(), streamed: ctx.Response.IsBodyStream()}
	if a.streamed {
		b, err := io.ReadAll(ctx.Response.BodyStream())
		a.body, a.err = string(b), err != nil
		_ = ctx.Response.CloseBodyStream()
	} else {
		a.body = string(ctx.Response.Body())
	}
	ctx.Response.Reset()
	return a
}

func pools(t *testing.T, addr string) (now, before *Pool, nowDials *atomic.Int64) {
	t.Helper()
	nowDials = new(atomic.Int64)
	mk := func(dials *atomic.Int64) *Pool {
		p, err := NewPool([]string{"http://" + addr}, Options{Timeout: 2 * time.Second, BufferUpTo: 16, RequestIDPrefix: "t-",
			Dial: func(a string) (net.Conn, error) {
				if dials != nil {
					dials.Add(1)
				}
				return net.DialTimeout("tcp", a, time.Second)
			}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	now, before = mk(nowDials), mk(nil)
	// The path the pool had: fasthttp's DefaultTransport, every response
	// streamed.
	before.ups[0].hc.Transport = nil
	before.ups[0].hc.ReadTimeout, before.ups[0].hc.WriteTimeout = 2*time.Second, 2*time.Second
	return now, before, nowDials
}

// TestTransportAnswersAsFasthttp: for every framing an upstream may send
// (lengths at and above the bound, chunked with and without trailers, no
// body by status or method, interim answers, until close, cut short,
// contradicting, garbage) the edge gets the same header and body through the
// pool's transport as through fasthttp's DefaultTransport; small ones are
// read whole and the others streamed; and the connection is reused exactly
// when its exchange ended cleanly, never held after the exchange.
func TestTransportAnswersAsFasthttp(t *testing.T) {
	up := startRaw(t)
	now, before, dials := pools(t, up.ln.Addr().String())
	hc := now.ups[0].hc
	for round := 0; round < 2; round++ { // the second round on reused connections
		for i, c := range cases {
			t.Run(fmt.Sprintf("%d %s", round, c.name), func(t *testing.T) {
				d0 := dials.Load()
				got, want := exchange(t, now, c, i), exchange(t, before, c, i)
				if c.fails {
					if !got.err || want.err {
						t.Fatalf("transport error %v (want one), fasthttp error %v", got.err, want.err)
					}
					got, want = answer{}, answer{}
				}
				if got.header != want.header || got.body != want.body || got.err != want.err {
					t.Fatalf("transport answered\n%q %q (error %v)\nfasthttp answered\n%q %q (error %v)",
						got.header, got.body, got.err, want.header, want.body, want.err)
				}
				if got.streamed != c.streamed && !got.err {
					t.Errorf("streamed %v, want %v", got.streamed, c.streamed)
				}
				if n, idle := hc.ConnsCount(), hc.IdleConnsCount(); n != idle || n > 1 {
					t.Errorf("after the exchange %d connections, %d idle: one is held or leaked", n, idle)
				}
				if c.reused != (hc.IdleConnsCount() == 1) {
					t.Errorf("idle connections %d after it; reusable: %v", hc.IdleConnsCount(), c.reused)
				}
				if prev := i - 1; prev >= 0 && cases[prev].reused && dials.Load() != d0 {
					t.Errorf("dialled anew though the previous exchange left its connection idle")
				}
			})
		}
	}
}

// TestTransportStreamClosedEarly: a streamed body closed before its end (the
// client went away) closes the upstream connection instead of pooling one
// with the rest of the body unread.
func TestTransportStreamClosedEarly(t *testing.T) {
	up := startRaw(t)
	now, _, dials := pools(t, up.ln.Addr().String())
	hc := now.ups[0].hc
	for _, partial := range []bool{false, true} {
		var ctx fasthttp.RequestCtx
		var req fasthttp.Request
		ctx.Init(&req, nil, nil)
		ctx.Request.Header.SetRequestURI("/2") // large
		ctx.Request.Header.SetHost("up")
		if err := now.Do(&ctx); err != nil {
			t.Fatal(err)
		}
		if !ctx.Response.IsBodyStream() || hc.ConnsCount() != 1 || hc.IdleConnsCount() != 0 {
			t.Fatalf("streamed %v, %d connections, %d idle: the stream must hold its connection", ctx.Response.IsBodyStream(), hc.ConnsCount(), hc.IdleConnsCount())
		}
		if partial {
			buf := make([]byte, 7)
			if _, err := io.ReadFull(ctx.Response.BodyStream(), buf); err != nil || !bytes.Equal(buf, []byte("0123456")) {
				t.Fatalf("read %q, %v", buf, err)
			}
		}
		_ = ctx.Response.CloseBodyStream()
		if hc.ConnsCount() != 0 {
			t.Fatalf("partial=%v: %d connections after an early close, want it closed", partial, hc.ConnsCount())
		}
		ctx.Response.Reset()
	}
	if dials.Load() != 2 {
		t.Fatalf("%d dials, want 2", dials.Load())
	}
}

// TestTransportTimeout: an upstream that never answers, or stops in the
// middle of a streamed body, runs into the exchange's deadline: 504 for the
// first (ErrTimeout), a read error for the second, and no connection kept.
func TestTransportTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				line, _ := br.ReadString('\n')
				if strings.Contains(line, "/stall-body") {
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst bytes")
				}
				time.Sleep(2 * time.Second)
			}()
		}
	}()
	p, err := NewPool([]string{"http://" + ln.Addr().String()}, Options{ConnectTimeout: time.Second, Timeout: 200 * time.Millisecond, BufferUpTo: 16})
	if err != nil {
		t.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	ctx.Init(&req, nil, nil)
	ctx.Request.Header.SetMethod("POST") // no failover: one try
	ctx.Request.Header.SetRequestURI("/stall-header")
	ctx.Request.Header.SetHost("up")
	start := time.Now()
	if err := p.Do(&ctx); err == nil || !strings.Contains(err.Error(), ErrTimeout.Error()) {
		t.Fatalf("stalled header: %v, want %v", err, ErrTimeout)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("stalled header took %v, bound 200ms", d)
	}
	ctx.Request.Reset()
	ctx.Request.Header.SetRequestURI("/stall-body")
	ctx.Request.Header.SetHost("up")
	if err := p.Do(&ctx); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(ctx.Response.BodyStream())
	if err == nil || string(b) != "first bytes" {
		t.Fatalf("stalled body: read %q, %v; want the first bytes and an error", b, err)
	}
	_ = ctx.Response.CloseBodyStream()
	if n := p.ups[0].hc.ConnsCount(); n != 0 {
		t.Fatalf("%d connections kept after timeouts", n)
	}
}
