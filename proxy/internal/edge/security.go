package edge

import (
	"errors"
	"net"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/proxy/internal/access"
	"github.com/seckill/seckill/proxy/internal/limiter"
	"github.com/seckill/seckill/proxy/internal/token"
)

// Gate is what the proxy checks before limits: the deny list and the JWT
// identity. Immutable; a reload swaps in a new one.
type Gate struct {
	Policy *access.Policy
	JWT    *token.Verifier // nil: no JWT identity
	// Verified: what a valid token vouches for — the X-User-ID set from it
	// and the header or cookie that carried it — for keyed windows.
	Verified *limiter.Verified
}

// NewGate compiles the access keys of a [proxy] section and reads its JWT key.
func NewGate(c conf.Proxy) (*Gate, error) {
	pol, err := access.Compile(c.DenyPrefixes, c.Rules)
	if err != nil {
		return nil, err
	}
	g := &Gate{Policy: pol}
	if c.Identity.JWT != nil {
		if g.JWT, err = token.New(*c.Identity.JWT); err != nil {
			return nil, err
		}
		g.Verified = &limiter.Verified{Headers: [][]byte{hdrUserID}}
		if name := g.JWT.HeaderName(); name != nil {
			g.Verified.Headers = append(g.Verified.Headers, name)
		} else {
			g.Verified.Cookies = [][]byte{g.JWT.CookieName()}
		}
	}
	return g, nil
}

// SecurityMetrics count what the gate turned away or vouched for.
type SecurityMetrics struct {
	Denied  prometheus.Counter
	Spoofed prometheus.Counter
	JWT     struct{ Valid, Invalid, Missing, Refused prometheus.Counter }
}

// NewSecurityMetrics registers the gate's counters.
func NewSecurityMetrics(reg prometheus.Registerer) *SecurityMetrics {
	m := &SecurityMetrics{}
	m.Denied = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_denied_total",
		Help: "Requests to a deny_prefixes path answered 404 at the edge, never forwarded."})
	m.Spoofed = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_user_header_stripped_total",
		Help: "Client-sent X-User-ID headers removed because the peer is not a trusted proxy."})
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "seckill_proxy_jwt_total",
		Help: "JWT identity: valid and invalid tokens, requests without one, and 401s of rules that require one."}, []string{"result"})
	reg.MustRegister(m.Denied, m.Spoofed, v)
	m.JWT.Valid, m.JWT.Invalid, m.JWT.Missing, m.JWT.Refused = v.WithLabelValues("valid"), v.WithLabelValues("invalid"),
		v.WithLabelValues("missing"), v.WithLabelValues("refused")
	return m
}

var hdrUserID = []byte("X-User-Id") // as fasthttp normalizes X-User-ID

// guard runs the gate on a request: a denied path is answered 404 unless
// a rule allows the client; a client-sent X-User-ID from an untrusted peer is
// dropped; a verified JWT sets X-User-ID to its claim (verified then names
// what it vouches for); a rule that requires one answers 401 without it. ok
// is false when it answered.
func (h *Handler) guard(ctx *fasthttp.RequestCtx, method, path []byte) (verified *limiter.Verified, ok bool) {
	g := h.gate.Load()
	peer := peerAddr(ctx)
	if g.Policy.Denied(path) && !g.Policy.Allowed(method, path, h.clientAddr(ctx, peer)) {
		h.Security.Denied.Inc()
		problem(ctx, fasthttp.StatusNotFound, "not-found", "Not found", "no such resource")
		return nil, false
	}
	rh := &ctx.Request.Header
	if !h.Identity.Trusted(peer) && len(rh.PeekCanonical(hdrUserID)) > 0 {
		h.Security.Spoofed.Inc()
		rh.DelBytes(hdrUserID)
	}
	if g.JWT == nil {
		return nil, true
	}
	src := token.Source{}
	if name := g.JWT.HeaderName(); name != nil {
		src.Header = rh.PeekBytes(name)
	} else {
		src.Cookie = rh.PeekAll(fasthttp.HeaderCookie)
	}
	user, err := g.JWT.Verify(g.JWT.Extract(src))
	switch {
	case err == nil:
		h.Security.JWT.Valid.Inc()
		rh.SetCanonical(hdrUserID, []byte(user))
		return g.Verified, true
	case errors.Is(err, token.ErrMissing):
		h.Security.JWT.Missing.Inc()
	default:
		h.Security.JWT.Invalid.Inc()
	}
	if !g.Policy.RequireJWT(method, path) {
		return nil, true
	}
	h.Security.JWT.Refused.Inc()
	challenge := `Bearer realm="seckill"`
	detail := "this resource requires a bearer token"
	if !errors.Is(err, token.ErrMissing) {
		challenge += `, error="invalid_token"`
		detail = "the bearer token is not valid"
	}
	ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, challenge)
	problem(ctx, fasthttp.StatusUnauthorized, "unauthorized", "Unauthorized", detail)
	return nil, false
}

// peerAddr is the TCP peer's address (0.0.0.0 when unknown).
func peerAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	var peer netip.Addr
	if ta, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		peer, _ = netip.AddrFromSlice(ta.IP)
	}
	if !peer.IsValid() {
		peer = netip.IPv4Unspecified()
	}
	return peer.Unmap()
}

// SetGate swaps the gate atomically (SIGHUP).
func (h *Handler) SetGate(g *Gate) { h.gate.Store(g) }
