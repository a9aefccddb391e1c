package ratecrowd

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/servicetest"
)

// Plan shapes a crowd: Clients distinct source addresses, each with one
// keep-alive connection to every target, sending for Duration at a steady
// pace (a random phase each, so the crowd does not start as one burst).
// Every HotEvery-th client sends at HotRate, the others at ColdRate
// (requests per second per client, spread over its connections); a
// connection whose answer is late sends its next request as soon as the
// answer comes (one request in flight per connection).
type Plan struct {
	Clients           int
	Duration          time.Duration
	HotEvery          int
	HotRate, ColdRate float64
	// Hang: an answer not read this long after its request was sent counts
	// as hung (the connection is then closed).
	Hang time.Duration
	// Path of every request (the limited rule's).
	Path string
	// DegradedHeader, when set, is a response header by which the proxy
	// marks an answer decided without Redis (on_redis_error); such
	// requests are left out of the windows' judgment.
	DegradedHeader string
}

// Request is one request of the crowd as the test saw it: offsets on the
// test's monotonic clock from the upstream's epoch; Answered and Reached
// are -1 when it never got an answer or never reached the upstream.
type Request struct {
	Client                  int32
	Via                     int8 // index of the target (proxy) it went through
	Status                  int16
	Hung                    bool // no answer within Plan.Hang
	Degraded                bool // the answer carried Plan.DegradedHeader
	Sent, Answered, Reached time.Duration
	ID                      uint64 // its X-Crowd-Id
}

// Upstream is the crowd's upstream: it answers 200 to everything and stamps
// the arrival of every crowd request (by its X-Crowd-Id) on the test's
// clock, before it answers.
type Upstream struct {
	Addr  string
	epoch time.Time

	mu       sync.Mutex
	arrivals map[uint64]time.Duration
	other    atomic.Int64 // requests without an id (health probes)
}

const idHeader = "X-Crowd-Id"

// StartUpstream serves the crowd's upstream until the test ends.
func StartUpstream(t testing.TB) *Upstream {
	t.Helper()
	u := &Upstream{epoch: time.Now(), arrivals: map[uint64]time.Duration{}}
	body := []byte(`{"ok":true}`)
	u.Addr = servicetest.Serve(t, &fasthttp.Server{
		NoDefaultDate: true, NoDefaultServerHeader: true, Concurrency: 1 << 20,
		Handler: func(ctx *fasthttp.RequestCtx) {
			at := time.Since(u.epoch)
			if id, err := strconv.ParseUint(string(ctx.Request.Header.Peek(idHeader)), 10, 64); err == nil {
				u.mu.Lock()
				if _, dup := u.arrivals[id]; !dup {
					u.arrivals[id] = at
				}
				u.mu.Unlock()
			} else {
				u.other.Add(1)
			}
			ctx.SetContentType("application/json")
			ctx.SetBody(body)
		}})
	return u
}

func (u *Upstream) reached(id uint64) (time.Duration, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	at, ok := u.arrivals[id]
	return at, ok
}

// Arrivals is the number of crowd requests that reached the upstream.
func (u *Upstream) Arrivals() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.arrivals)
}

func requestID(client, via, seq int) uint64 {
	return uint64(client)<<32 | uint64(via)<<28 | uint64(seq)
}

// SourceAddr is client i's source address: 127.64.0.1 upwards (every
// 127/8 address is local on Linux; 127.64/16 keeps clear of the 127.0.0.x
// addresses servers and other tests use).
func SourceAddr(i int) net.IP {
	a := uint32(127)<<24 | uint32(64)<<16 | uint32(i+1)
	return net.IPv4(byte(a>>24), byte(a>>16), byte(a>>8), byte(a))
}

// RaiseNoFile raises the open-file soft limit to at least want (the proxy
// processes this test starts inherit it), or fails the test saying why the
// crowd cannot fit: the hard limit cannot be raised without privileges.
func RaiseNoFile(t testing.TB, want int, why string) {
	t.Helper()
	var r syscall.Rlimit
	servicetest.Must(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r), "getrlimit")
	if r.Cur >= uint64(want) {
		return
	}
	if r.Max < uint64(want) {
		t.Fatalf("%s needs %d open files, the hard limit (ulimit -Hn) is %d and soft %d: the crowd does not fit; run a smaller one or raise the hard limit", why, want, r.Max, r.Cur)
	}
	r.Cur = uint64(want)
	servicetest.Must(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r), "setrlimit NOFILE to %d", want)
}

// Result is a finished crowd run.
type Result struct {
	Plan     Plan
	Targets  int
	Requests []Request
	// Start and End are the first and last send.
	Start, End time.Duration
}

// Run dials every client's connections (from its own source address) to
// each target, then runs the plan and waits for every answer (at most
// Plan.Hang past the end), and stamps each request with its arrival at up.
func Run(t testing.TB, p Plan, targets []string, up *Upstream) *Result {
	t.Helper()
	if p.Hang <= 0 {
		p.Hang = 10 * time.Second
	}
	type conn struct {
		client, via int
		c           net.Conn
	}
	conns := make([]conn, 0, p.Clients*len(targets))
	for i := range p.Clients {
		for v := range targets {
			conns = append(conns, conn{client: i, via: v})
		}
	}
	// Dial in parallel: thousands of connections one after the other take
	// seconds of the test's budget.
	var dialErr atomic.Pointer[error]
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= len(conns) || dialErr.Load() != nil {
					return
				}
				cn := &conns[k]
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: SourceAddr(cn.client)}, Timeout: 10 * time.Second}
				c, err := d.Dial("tcp", targets[cn.via])
				if err != nil {
					err = fmt.Errorf("connection %d of %d (client %d from %s to %s): %w", k+1, len(conns), cn.client, SourceAddr(cn.client), targets[cn.via], err)
					dialErr.CompareAndSwap(nil, &err)
					return
				}
				cn.c = c
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, cn := range conns {
			if cn.c != nil {
				_ = cn.c.Close()
			}
		}
	}()
	if e := dialErr.Load(); e != nil {
		t.Fatalf("crowd: %v", *e)
	}

	res := &Result{Plan: p, Targets: len(targets)}
	var mu sync.Mutex
	start := time.Since(up.epoch) + 100*time.Millisecond // after every goroutine started
	for _, cn := range conns {
		rate := p.ColdRate
		if p.HotEvery > 0 && cn.client%p.HotEvery == 0 {
			rate = p.HotRate
		}
		period := time.Duration(float64(time.Second) * float64(len(targets)) / rate)
		phase := time.Duration(rand.Int64N(int64(period)))
		wg.Go(func() {
			var mine []Request
			defer func() {
				mu.Lock()
				res.Requests = append(res.Requests, mine...)
				mu.Unlock()
			}()
			br := bufio.NewReaderSize(cn.c, 4096)
			var resp fasthttp.Response
			req := make([]byte, 0, 128)
			for seq := 0; ; seq++ {
				at := start + phase + time.Duration(seq)*period
				if at >= start+p.Duration {
					return
				}
				if d := at - time.Since(up.epoch); d > 0 {
					time.Sleep(d)
				}
				req = append(req[:0], "GET "...)
				req = append(req, p.Path...)
				req = append(req, " HTTP/1.1\r\nHost: crowd\r\n"+idHeader+": "...)
				id := requestID(cn.client, cn.via, seq)
				req = strconv.AppendUint(req, id, 10)
				req = append(req, "\r\n\r\n"...)
				r := Request{Client: int32(cn.client), Via: int8(cn.via), Answered: -1, Reached: -1, ID: id}
				r.Sent = time.Since(up.epoch)
				_ = cn.c.SetDeadline(up.epoch.Add(r.Sent + p.Hang))
				_, err := cn.c.Write(req)
				if err == nil {
					err = resp.Read(br)
				}
				if err != nil {
					var ne net.Error
					r.Hung = errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
					r.Status = -1
					mine = append(mine, r)
					_ = cn.c.Close()
					return
				}
				r.Answered = time.Since(up.epoch)
				r.Status = int16(resp.StatusCode())
				r.Degraded = p.DegradedHeader != "" && len(resp.Header.Peek(p.DegradedHeader)) > 0
				mine = append(mine, r)
			}
		})
	}
	wg.Wait()
	res.Start, res.End = -1, 0
	for i := range res.Requests {
		r := &res.Requests[i]
		if at, ok := up.reached(r.ID); ok {
			r.Reached = at
		}
		if res.Start < 0 || r.Sent < res.Start {
			res.Start = r.Sent
		}
		res.End = max(res.End, r.Sent)
	}
	return res
}
