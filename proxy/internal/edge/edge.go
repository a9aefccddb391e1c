// Package edge is the proxy's request path: deny list and user identity
// (JWT), sold-out short cut, client identity, rate limits, then forwarding;
// plus the proxy's own error answers (problem+json) and its admin endpoints.
package edge

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/metrics"
	isoldout "github.com/seckill/seckill/internal/soldout"
	"github.com/seckill/seckill/proxy/internal/forward"
	"github.com/seckill/seckill/proxy/internal/identity"
	"github.com/seckill/seckill/proxy/internal/limiter"
	"github.com/seckill/seckill/proxy/internal/readcache"
	"github.com/seckill/seckill/proxy/internal/room"
	"github.com/seckill/seckill/proxy/internal/soldout"
)

// Handler serves the forwarding listener.
type Handler struct {
	rules    atomic.Pointer[limiter.Rules]
	gate     atomic.Pointer[Gate]
	Security *SecurityMetrics
	Limiter  *limiter.Limiter
	Identity *identity.Resolver
	Pool     *forward.Pool
	SoldOut  *soldout.Cache // nil: disabled
	// Rooms are the rules' waiting rooms; nil: none.
	Rooms *room.Manager
	// ReadCache answers GETs of rules with a read_cache_ttl; nil: disabled.
	ReadCache *readcache.Cache
	Registry  *prometheus.Registry
	// Subscribed, when not nil, is the ready channel of the stock-event
	// subscription: /readyz fails until it is closed.
	Subscribed <-chan struct{}
	metrics    fasthttp.RequestHandler
	pool       sync.Pool
}

// SetRules swaps the rule set atomically (SIGHUP).
func (h *Handler) SetRules(rs *limiter.Rules) {
	h.rules.Store(rs)
	h.Limiter.SetRules(rs)
}

// Rules is the rule set in force.
func (h *Handler) Rules() *limiter.Rules { return h.rules.Load() }

type scratch struct {
	d   limiter.Decision
	key []byte
	buf []byte
}

var (
	hdrIdempotencyKey = []byte("Idempotency-Key")
	ctJSON            = []byte("application/json")
	ctProblem         = []byte("application/problem+json")
)

// Serve is the fasthttp handler of the forwarding listener.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
	if ambiguousFraming(&ctx.Request.Header) {
		ctx.SetConnectionClose() // what follows the body on this connection is not trusted
		problem(ctx, fasthttp.StatusBadRequest, "bad-request", "Bad request", "both Transfer-Encoding and Content-Length")
		return
	}
	method, path := ctx.Method(), requestPath(ctx)
	// Before everything else: a denied path or a refused token costs no
	// limiter slot, and limits key on the identity the gate established.
	verified, jwtTok, ok := h.guard(ctx, method, path)
	if !ok {
		return
	}
	// The waiting room comes before every other answer of the rule: a
	// client in line gets its place, not the sold-out cache's or the read
	// cache's answer; an admitted one goes on to them.
	rres, ok := h.enterRoom(ctx, method, path, verified != nil, ctx.Time())
	if !ok {
		return
	}

	var tok isoldout.Token // only purchases need it (sold-out cache)
	soldID, purchase := int64(0), false
	if h.SoldOut != nil {
		if soldID, purchase = soldout.PurchaseID(method, path); purchase {
			tok = h.SoldOut.Token()
			// A keyed purchase may be the replay of an accepted order: the
			// cache answers it only when its key holds no order of the sale
			// (a replay goes on, and the backend answers it with its order).
			// The headers are read as they go upstream: the gate above has
			// set or dropped X-User-ID already.
			rh := &ctx.Request.Header
			if body, ctype, ok := h.SoldOut.Lookup(soldID, ctx.Time(), rh.PeekBytes(hdrUserID), rh.PeekBytes(hdrIdempotencyKey)); ok {
				ctx.SetStatusCode(fasthttp.StatusConflict)
				ctx.SetContentTypeBytes(ctype)
				ctx.SetBody(body)
				return
			}
		}
	}

	var readTok isoldout.Token
	var readTTL time.Duration
	var readKey string
	if h.ReadCache != nil {
		if readTTL = h.ReadCache.TTL(method, path); readTTL > 0 && readcache.Cacheable(&ctx.Request.Header) {
			if h.ReadCache.Serve(ctx, ctx.Request.Header.RequestURI(), path, ctx.Time()) {
				return
			}
			readTok, readKey = h.ReadCache.Token(), string(ctx.Request.Header.RequestURI())
		} else {
			readTTL = 0
		}
	}

	s, _ := h.pool.Get().(*scratch)
	if s == nil {
		s = &scratch{}
	}
	defer h.pool.Put(s)
	s.d.Reset()
	s.key = h.clientKey(ctx, s.key[:0])
	// Keyed windows read the request's headers as they stand here, when a
	// trusted peer or the gate's verification vouches for them; the token's
	// own header or cookie counts by the token the gate verified.
	h.Limiter.Check(h.rules.Load(), limiter.Request{Method: method, Path: path, Addr: s.key, Header: &ctx.Request.Header,
		Trusted: h.Identity.Trusted(peerAddr(ctx)), Verified: verified, Token: jwtTok}, &s.d)
	switch s.d.Outcome {
	case limiter.Limited:
		h.limited(ctx, &s.d, s)
		return
	case limiter.Unavailable:
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		problem(ctx, fasthttp.StatusServiceUnavailable, "limiter-unavailable", "Rate limiter unavailable",
			"the rate limiter cannot reach its store and this rule fails closed")
		return
	case limiter.Shed:
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		problem(ctx, fasthttp.StatusServiceUnavailable, "limiter-overloaded", "Rate limiter overloaded",
			"the rate limiter could not decide this request in time; retry later")
		return
	}

	h.Pool.PrepareRequest(ctx)
	if err := h.Pool.Do(ctx); err != nil {
		if errors.Is(err, forward.ErrTimeout) {
			problem(ctx, fasthttp.StatusGatewayTimeout, "upstream-timeout", "Upstream timeout", "the upstream did not answer in time")
		} else {
			problem(ctx, fasthttp.StatusBadGateway, "upstream-unavailable", "Upstream unavailable", "no upstream could be reached")
		}
		return
	}
	if len(s.d.Policies) > 0 {
		s.buf = setRateLimitHeaders(&ctx.Response.Header, s.d.Policies, s.buf[:0])
	}
	if rres.Room != nil {
		h.afterRoom(ctx, &rres)
	}
	if purchase && ctx.Response.StatusCode() == fasthttp.StatusConflict {
		resp := &ctx.Response
		if ct := resp.Header.ContentType(); resp.Header.ContentLength() >= 0 && resp.Header.ContentLength() <= 4096 {
			if body := resp.Body(); soldout.IsSoldOut(409, ct, body) {
				if h.SoldOut.Learn(soldID, tok, ct, body) && h.ReadCache != nil {
					h.ReadCache.Changed(soldID) // its cached sale state still shows units
				}
			}
		}
	}
	if readTTL > 0 {
		h.ReadCache.Store([]byte(readKey), path, readTok, &ctx.Response, readTTL, time.Now())
	}
}

// requestPath is the path rules match: ctx.Path() (decoded, dot segments
// and duplicate slashes removed), taken straight from the request line when
// that is already in normal form. Not parsing the URI also spares the client
// re-serializing it towards the upstream.
func requestPath(ctx *fasthttp.RequestCtx) []byte {
	if p, ok := plainPath(ctx.Request.Header.RequestURI()); ok {
		return p
	}
	return ctx.Path()
}

// plainPath returns the path of an origin-form request URI that needs no
// normalization: '/' then unreserved characters and single slashes, no
// segment starting with a dot, no percent-encoding; up to '?'. (With a
// valid Host; with an invalid one fasthttp's parse fails and ctx.Path() is
// "/", and so is the URI it would send upstream; the raw path, which then
// goes upstream unchanged, is the one to match.)
func plainPath(uri []byte) ([]byte, bool) {
	if len(uri) == 0 || uri[0] != '/' {
		return nil, false
	}
	for i := 1; i < len(uri); i++ {
		switch c := uri[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '~':
		case c == '/', c == '.':
			if uri[i-1] == '/' {
				return nil, false
			}
		case c == '?':
			// fasthttp refuses a URI with control bytes (path "/"): leave
			// those to it.
			for _, q := range uri[i+1:] {
				if q < 0x20 || q == 0x7f {
					return nil, false
				}
			}
			return uri[:i], true
		default:
			return nil, false
		}
	}
	return uri, true
}

// clientKey appends the limiter key of the request's client.
func (h *Handler) clientKey(ctx *fasthttp.RequestCtx, dst []byte) []byte {
	return h.Identity.AppendKey(dst, h.clientAddr(ctx, peerAddr(ctx)))
}

// clientAddr is the client's address: the peer, or what a trusted peer's
// forwarding headers name.
func (h *Handler) clientAddr(ctx *fasthttp.RequestCtx, peer netip.Addr) netip.Addr {
	hd := identity.Headers{}
	if h.Identity.Trusted(peer) {
		hd.XForwardedFor = ctx.Request.Header.PeekAll("X-Forwarded-For")
		hd.Forwarded = ctx.Request.Header.PeekAll("Forwarded")
	}
	return h.Identity.Client(peer, hd)
}

func ceilSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Header names as fasthttp normalizes them ("RateLimit-Policy" is sent as
// "Ratelimit-Policy"), for SetCanonical.
var (
	hdrRateLimitPolicy = []byte("Ratelimit-Policy")
	hdrRateLimit       = []byte("Ratelimit")
)

// setRateLimitHeaders writes the draft-ietf-httpapi-ratelimit-headers fields,
// from the policies' precomputed parts where they have them.
func setRateLimitHeaders(rh *fasthttp.ResponseHeader, ps []limiter.Policy, buf []byte) []byte {
	buf = buf[:0]
	for i, p := range ps {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		if p.Item != "" {
			buf = append(buf, p.Item...)
			continue
		}
		buf = append(buf, '"')
		buf = append(buf, p.Name...)
		buf = append(buf, `";q=`...)
		buf = strconv.AppendInt(buf, int64(p.Quota), 10)
		buf = append(buf, ";w="...)
		buf = strconv.AppendInt(buf, ceilSeconds(p.Window), 10)
	}
	rh.SetCanonical(hdrRateLimitPolicy, buf)
	buf = buf[:0]
	for i, p := range ps {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		if p.Prefix != "" {
			buf = append(buf, p.Prefix...)
		} else {
			buf = append(buf, '"')
			buf = append(buf, p.Name...)
			buf = append(buf, `";r=`...)
		}
		buf = strconv.AppendInt(buf, int64(p.Remaining), 10)
		buf = append(buf, ";t="...)
		buf = strconv.AppendInt(buf, ceilSeconds(p.Reset), 10)
	}
	rh.SetCanonical(hdrRateLimit, buf)
	return buf
}

// QuotaExceededType is the problem type of a 429 (IANA HTTP problem types,
// from draft-ietf-httpapi-ratelimit-headers).
const QuotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

func (h *Handler) limited(ctx *fasthttp.RequestCtx, d *limiter.Decision, s *scratch) {
	rh := &ctx.Response.Header
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	rh.SetContentTypeBytes(ctProblem)
	secs := ceilSeconds(d.RetryAfter)
	rh.Set(fasthttp.HeaderRetryAfter, strconv.FormatInt(secs, 10))
	s.buf = setRateLimitHeaders(rh, d.Policies, s.buf)
	b := s.buf[:0]
	b = append(b, `{"type":"`+QuotaExceededType+`","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"retry in `...)
	b = strconv.AppendInt(b, secs, 10)
	b = append(b, ` s","violated-policies":[`...)
	for i, p := range d.Violated {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, p)
	}
	b = append(b, `],"rules":[`...)
	for i, r := range d.Rules {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, r)
	}
	b = append(b, "]}"...)
	ctx.SetBody(b)
	s.buf = b
}

// problem writes an application/problem+json answer made by the proxy.
func problem(ctx *fasthttp.RequestCtx, status int, typ, title, detail string) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(ctProblem)
	ctx.SetBody(problemBody(status, typ, title, detail))
}

// problemBody is the proxy's problem details document.
func problemBody(status int, typ, title, detail string) []byte {
	return append(appendProblemHead(make([]byte, 0, 160), status, typ, title, detail), '}')
}

// appendProblemHead appends the proxy's problem details document to b
// without its closing brace, for extension members to follow.
func appendProblemHead(b []byte, status int, typ, title, detail string) []byte {
	b = append(b, `{"type":"urn:seckill:proxy:`...)
	b = append(b, typ...)
	b = append(b, `","code":"`...)
	b = append(b, typ...)
	b = append(b, `","title":`...)
	b = strconv.AppendQuote(b, title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	return strconv.AppendQuote(b, detail)
}

// ServerError answers errors fasthttp raises before the handler runs:
// oversized headers 431, oversized bodies 413, read timeouts 408, else 400.
func ServerError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small):
		problem(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "header-too-large", "Request header too large", "the request header exceeds the proxy's limit")
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		problem(ctx, fasthttp.StatusRequestEntityTooLarge, "body-too-large", "Request body too large", "the request body exceeds the proxy's limit")
	case isTimeout(err):
		problem(ctx, fasthttp.StatusRequestTimeout, "request-timeout", "Request timeout", "the request was not received in time")
	default:
		problem(ctx, fasthttp.StatusBadRequest, "bad-request", "Bad request", "the request could not be parsed")
	}
	ctx.SetConnectionClose()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Admin serves /healthz, /readyz and /metrics on the admin listener.
func (h *Handler) Admin(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/healthz":
		ctx.SetContentTypeBytes(ctJSON)
		ctx.SetBodyString(`{"status":"ok"}`)
	case "/readyz":
		ctx.SetContentTypeBytes(ctJSON)
		degraded := strconv.FormatBool(h.Limiter.Degraded())
		if !h.Pool.AnyHealthy() {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(`{"status":"no healthy upstream","degraded":` + degraded + `}`)
			return
		}
		if h.Subscribed != nil && isoldout.Subscribed(h.Subscribed) != nil {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(`{"status":"stock events not subscribed yet","degraded":` + degraded + `}`)
			return
		}
		ctx.SetBodyString(`{"status":"ready","degraded":` + degraded + `,"live_instances":` + strconv.Itoa(h.Limiter.Live()) + `}`)
	case "/metrics":
		if h.metrics == nil {
			metrics.Handler(h.Registry)(ctx)
			return
		}
		h.metrics(ctx)
	default:
		problem(ctx, fasthttp.StatusNotFound, "not-found", "Not found", "admin endpoints: /healthz, /readyz, /metrics")
	}
}

// RegisterGauges exports the limiter's degraded state, live instances and
// negative-cache size.
func RegisterGauges(reg prometheus.Registerer, l *limiter.Limiter) {
	gauge := func(name, help string, fn func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn))
	}
	gauge("seckill_proxy_degraded", "1 while the Redis circuit breaker is open and rules use on_redis_error.", func() float64 {
		if l.Degraded() {
			return 1
		}
		return 0
	})
	gauge("seckill_proxy_live_instances", "Live proxy instances as last seen in Redis.", func() float64 { return float64(l.Live()) })
	gauge("seckill_proxy_client_states", "Per-client window states in memory (all rules; each rule keeps at most max_client_states).",
		func() float64 { return float64(l.ClientStates()) })
}
