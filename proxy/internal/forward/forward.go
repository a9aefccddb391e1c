// Package forward sends admitted requests to the upstreams over keep-alive
// connections: round-robin over healthy upstreams, hop-by-hop headers
// stripped both ways, X-Forwarded-For appended, X-Request-ID set when absent,
// small responses read whole (their connection back in the pool at once),
// large ones streamed.
package forward

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
	"net"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/metrics"
)

// Options of a Pool.
type Options struct {
	ConnectTimeout time.Duration
	Timeout        time.Duration // whole exchange; exceeded: 504
	MaxConns       int           // per upstream; 0: 4096
	// DownFor is how long an upstream that refused a connection is skipped.
	DownFor time.Duration
	// BufferUpTo: responses with a known length up to this are read whole
	// (freeing the upstream connection at once); larger or unknown ones stream.
	BufferUpTo int
	// RequestIDPrefix makes generated X-Request-IDs unique per instance.
	RequestIDPrefix string
	Metrics         *Metrics
	// Dial replaces the TCP dialer (tests, benchmarks); nil: TCP with
	// ConnectTimeout.
	Dial fasthttp.DialFunc
}

// Metrics of the forward path.
type Metrics struct {
	Responses *prometheus.CounterVec // upstream, code (2xx.. or 502/504 for proxy errors)
	Latency   *prometheus.HistogramVec
}

// NewMetrics registers the forwarding metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Responses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "seckill_proxy_upstream_responses_total",
			Help: "Upstream answers by status class; error: 502/504 made by the proxy."}, []string{"upstream", "code"}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "seckill_proxy_upstream_seconds",
			Help: "Upstream latency up to the response header.", Buckets: metrics.LatencyBuckets}, []string{"upstream"}),
	}
	reg.MustRegister(m.Responses, m.Latency)
	return m
}

// Upstream is one backend server.
type Upstream struct {
	Name      string
	hc        *fasthttp.HostClient
	downUntil atomic.Int64 // unix nanos
	codes     [6]prometheus.Counter
	timeouts  prometheus.Counter
	refused   prometheus.Counter
	latency   prometheus.Observer
}

// Healthy reports whether the upstream is not being skipped.
func (u *Upstream) Healthy(now time.Time) bool { return now.UnixNano() >= u.downUntil.Load() }

// Pool is the set of upstreams.
type Pool struct {
	ups   []*Upstream
	rr    atomic.Uint64
	reqID atomic.Uint64
	o     Options
}

// Errors the edge maps to statuses.
var (
	ErrUnavailable = errors.New("upstream unavailable") // 502
	ErrTimeout     = errors.New("upstream timeout")     // 504
)

// NewPool builds a pool over http:// URLs.
func NewPool(urls []string, o Options) (*Pool, error) {
	if len(urls) == 0 {
		return nil, errors.New("no upstream")
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 4096
	}
	if o.DownFor <= 0 {
		o.DownFor = time.Second
	}
	if o.BufferUpTo <= 0 {
		o.BufferUpTo = 64 << 10
	}
	p := &Pool{o: o}
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("upstream %q: not a URL", raw)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return nil, fmt.Errorf("upstream %q: scheme must be http or https", raw)
		}
		addr := u.Host
		if u.Port() == "" {
			addr = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
		}
		connect := o.ConnectTimeout
		dial := o.Dial
		if dial == nil {
			dial = func(addr string) (net.Conn, error) {
				return fasthttp.DialTimeout(addr, connect)
			}
		}
		up := &Upstream{Name: u.Host, hc: &fasthttp.HostClient{
			Addr:                addr,
			IsTLS:               u.Scheme == "https",
			Dial:                dial,
			MaxConns:            o.MaxConns,
			MaxIdleConnDuration: 30 * time.Second,
			// No ReadTimeout, and WriteTimeout for TLS only (it bounds the
			// handshake at dial): Do bounds every exchange with DoTimeout's
			// deadline (at most Timeout from the first try), which fasthttp
			// sets on the connection for the write, the response and a
			// streamed body alike. A client timeout beside it is never the
			// nearer bound and costs two clock reads per exchange.
			WriteTimeout:              tlsOnly(u.Scheme == "https", o.Timeout),
			MaxIdemponentCallAttempts: 1, // retries are ours, on another upstream
			// Small responses read whole, the others streamed (transport).
			StreamResponseBody:       true,
			Transport:                &transport{bufferUpTo: o.BufferUpTo},
			DisablePathNormalizing:   true,
			NoDefaultUserAgentHeader: true,
			MaxConnWaitTimeout:       o.Timeout,
		}}
		if m := o.Metrics; m != nil {
			for i := 1; i <= 5; i++ {
				up.codes[i] = m.Responses.WithLabelValues(up.Name, strconv.Itoa(i)+"xx")
			}
			up.timeouts = m.Responses.WithLabelValues(up.Name, "error_504")
			up.refused = m.Responses.WithLabelValues(up.Name, "error_502")
			up.latency = m.Latency.WithLabelValues(up.Name)
		}
		p.ups = append(p.ups, up)
	}
	return p, nil
}

func tlsOnly(tls bool, d time.Duration) time.Duration {
	if tls {
		return d
	}
	return 0
}

// Upstreams lists the pool's upstreams.
func (p *Pool) Upstreams() []*Upstream { return p.ups }

// AnyHealthy reports whether some upstream is not being skipped.
func (p *Pool) AnyHealthy() bool {
	now := time.Now()
	for _, u := range p.ups {
		if u.Healthy(now) {
			return true
		}
	}
	return false
}

// pick returns the next healthy upstream after skip tries, round-robin; when
// none is healthy, the next one anyway.
func (p *Pool) pick(now time.Time) *Upstream {
	n := uint64(len(p.ups))
	start := p.rr.Add(1)
	for i := uint64(0); i < n; i++ {
		if u := p.ups[(start+i)%n]; u.Healthy(now) {
			return u
		}
	}
	return p.ups[start%n]
}

var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding", "Upgrade"}

// headers is what stripHop needs of a request or response header.
type headers interface {
	PeekKeys() [][]byte
	PeekTrailerKeys() [][]byte
	PeekAll(key string) [][]byte
	Del(key string)
	All() iter.Seq2[[]byte, []byte]
}

// stripHop removes the hop-by-hop headers, those Connection names, and any
// Proxy-* header. The common case (none present, no trailers) is one
// allocation-free pass over the header names; it allocates only when a
// Proxy-* header is present.
func stripHop(h headers) {
	if len(h.PeekTrailerKeys()) == 0 && !anyHop(h.PeekKeys()) {
		return
	}
	for _, v := range h.PeekAll("Connection") {
		for _, tok := range bytes.Split(v, []byte{','}) {
			if tok = bytes.TrimSpace(tok); len(tok) > 0 {
				h.Del(string(tok))
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
	var proxyKeys []string
	for k := range h.All() {
		if len(k) >= 6 && bytes.EqualFold(k[:6], []byte("proxy-")) {
			proxyKeys = append(proxyKeys, string(k))
		}
	}
	for _, k := range proxyKeys {
		h.Del(k)
	}
}

// anyHop reports whether a header name is hop-by-hop (Connection included,
// which may name others) or Proxy-*; stripHop has nothing to do otherwise.
func anyHop(keys [][]byte) bool {
	for _, k := range keys {
		if len(k) < 2 {
			continue
		}
		switch k[0] | 0x20 {
		case 'c', 'k', 't', 'u':
			for _, name := range hopHeaders {
				if len(k) == len(name) && bytes.EqualFold(k, []byte(name)) {
					return true
				}
			}
		case 'p':
			if len(k) >= 6 && bytes.EqualFold(k[:6], []byte("proxy-")) {
				return true
			}
		}
	}
	return false
}

// Header names in fasthttp's normalized form (the server normalizes the
// names it reads), for the allocation- and normalization-free *Canonical calls.
var (
	hdrXFF       = []byte("X-Forwarded-For")
	hdrRequestID = []byte("X-Request-Id")
	commaSpace   = []byte(", ")
)

// PrepareRequest rewrites ctx.Request for the upstream: hop-by-hop headers
// stripped, the peer appended to X-Forwarded-For, X-Request-ID set if absent.
func (p *Pool) PrepareRequest(ctx *fasthttp.RequestCtx) {
	h := &ctx.Request.Header
	stripHop(h)
	h.ResetConnectionClose()
	var buf [64]byte
	ip := appendIP(buf[:0], ctx.RemoteIP())
	if prior := h.PeekAll("X-Forwarded-For"); len(prior) > 0 {
		var jb [256]byte
		joined := jb[:0]
		for _, v := range prior {
			joined = append(append(joined, v...), commaSpace...)
		}
		joined = append(joined, ip...)
		h.DelBytes(hdrXFF)
		h.SetBytesKV(hdrXFF, joined)
	} else {
		h.SetCanonical(hdrXFF, ip)
	}
	if len(h.PeekCanonical(hdrRequestID)) == 0 {
		id := append(buf[:0], p.o.RequestIDPrefix...)
		id = strconv.AppendUint(id, p.reqID.Add(1), 36)
		h.SetCanonical(hdrRequestID, id)
	}
}

func appendIP(dst []byte, ip net.IP) []byte {
	if v4 := ip.To4(); v4 != nil {
		for i, b := range v4 {
			if i > 0 {
				dst = append(dst, '.')
			}
			dst = strconv.AppendUint(dst, uint64(b), 10)
		}
		return dst
	}
	return append(dst, ip.String()...)
}

// Do forwards ctx.Request (already prepared) and leaves the upstream's answer
// in ctx.Response, streamed when large. Connection errors fail over to
// another upstream for idempotent methods; the error says 502 or 504.
func (p *Pool) Do(ctx *fasthttp.RequestCtx) error {
	req, resp := &ctx.Request, &ctx.Response
	idempotent := req.Header.IsGet() || req.Header.IsHead() || req.Header.IsPut() ||
		req.Header.IsDelete() || req.Header.IsOptions() || req.Header.IsTrace()
	now := time.Now()
	deadline := now.Add(p.o.Timeout)
	tries := 1
	if idempotent {
		tries = len(p.ups)
	}
	var last error
	for try := 0; try < tries; try++ {
		if try > 0 {
			now = time.Now()
		}
		left := deadline.Sub(now)
		if left <= 0 {
			return ErrTimeout
		}
		up := p.pick(now)
		err := up.hc.DoTimeout(req, resp, left)
		if up.latency != nil {
			up.latency.Observe(time.Since(now).Seconds())
		}
		if err == nil {
			if c := resp.StatusCode() / 100; c >= 1 && c <= 5 && up.codes[c] != nil {
				up.codes[c].Inc()
			}
			p.prepareResponse(resp)
			return nil
		}
		if isTimeout(err) {
			if up.timeouts != nil {
				up.timeouts.Inc()
			}
			resp.Reset()
			return fmt.Errorf("%w: %s: %v", ErrTimeout, up.Name, err)
		}
		if up.refused != nil {
			up.refused.Inc()
		}
		if isConnError(err) {
			up.downUntil.Store(time.Now().Add(p.o.DownFor).UnixNano())
		}
		resp.Reset()
		last = fmt.Errorf("%w: %s: %v", ErrUnavailable, up.Name, err)
		if !isConnError(err) {
			break
		}
	}
	return last
}

func isTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) {
		return !errors.Is(err, fasthttp.ErrDialTimeout) // a dial timeout is "down"
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, fasthttp.ErrDialTimeout)
}

// isConnError: the request did not reach an upstream that answered (refused,
// reset, closed before the first response byte, dial timeout): safe to try
// another upstream for an idempotent method.
func isConnError(err error) bool {
	if errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		errors.Is(err, fasthttp.ErrNoFreeConns) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe)
}

func (p *Pool) prepareResponse(resp *fasthttp.Response) {
	h := &resp.Header
	stripHop(h)
	h.ResetConnectionClose()
	if n := h.ContentLength(); n >= 0 && n <= p.o.BufferUpTo {
		// Small: the pool's transport read it whole already (this is then
		// free); a streamed one is read now, which hands the connection back.
		resp.Body()
	}
}
