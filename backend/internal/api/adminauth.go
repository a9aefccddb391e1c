package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// CodeTooManyFailures answers admin requests from a source that failed to
// authenticate too often in the current window.
const CodeTooManyFailures = "too_many_failures"

// adminAuth checks admin bearer tokens and slows down guessing: each source
// address (an IPv6 client by its /64) may fail limit times per fixed
// window; past that its admin requests get 429 until the window ends,
// without the token being looked at. Failures are counted and logged,
// never with the token.
type adminAuth struct {
	hash   atomic.Pointer[[32]byte]
	limit  int
	window time.Duration
	log    *slog.Logger
	m      *Metrics
	now    func() time.Time

	mu      sync.Mutex
	sources map[string]*failWindow
}

type failWindow struct {
	start time.Time
	n     int
}

// maxFailSources bounds the table; when every entry is live, new sources
// share one bucket (so a flood of addresses is limited together).
const maxFailSources = 10000

const overflowSource = "*"

func newAdminAuth(token string, limit int, window time.Duration, log *slog.Logger, m *Metrics) *adminAuth {
	if limit <= 0 {
		limit = 10
	}
	if window <= 0 {
		window = time.Minute
	}
	a := &adminAuth{limit: limit, window: window, log: log, m: m, now: time.Now, sources: map[string]*failWindow{}}
	a.set(token)
	return a
}

// set replaces the token (SIGHUP). Only its digest is kept: the compare
// then runs over equal-length values, so not even the length leaks.
func (a *adminAuth) set(token string) {
	h := sha256.Sum256([]byte(token))
	a.hash.Store(&h)
}

// check authorizes an admin request, or writes the 401/429 and returns false.
// An attempt takes a slot of its source's window before the token is
// looked at, and a success gives it back: so however many requests race,
// at most limit wrong tokens per window are ever compared.
func (a *adminAuth) check(ctx *fasthttp.RequestCtx) bool {
	src := sourceKey(ctx)
	n, wait := a.take(src, a.now())
	if wait > 0 {
		a.m.adminFailure("limited")
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10))
		writeError(ctx, fasthttp.StatusTooManyRequests, CodeTooManyFailures, "too many failed admin authentications from this address; retry later")
		return false
	}
	reason := a.verify(ctx.Request.Header.Peek("Authorization"))
	if reason == "" {
		a.refund(src)
		return true
	}
	a.m.adminFailure(reason)
	a.log.Warn("admin authentication failed", "source", src, "reason", reason, "failures", n,
		"limit", a.limit, "window", a.window.String(), "blocked", n == a.limit)
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="seckill-admin"`)
	writeError(ctx, fasthttp.StatusUnauthorized, CodeUnauthorized, "a valid bearer token is required")
	return false
}

// verify returns "" for the right token, else why not: "missing" or "invalid".
func (a *adminAuth) verify(header []byte) string {
	scheme, token, ok := strings.Cut(string(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "missing"
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "missing"
	}
	got := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(got[:], a.hash.Load()[:]) != 1 {
		return "invalid"
	}
	return ""
}

// take counts an attempt of src and returns its count in the window, or,
// when the window is full, how long until it ends.
func (a *adminAuth) take(src string, now time.Time) (int, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.sources[src]
	if w == nil {
		if len(a.sources) >= maxFailSources {
			for k, v := range a.sources {
				if now.Sub(v.start) >= a.window {
					delete(a.sources, k)
				}
			}
		}
		if len(a.sources) >= maxFailSources {
			w = a.sources[overflowSource]
		}
		if w == nil {
			w = &failWindow{start: now}
			if len(a.sources) >= maxFailSources {
				src = overflowSource
			}
			a.sources[src] = w
		}
	}
	if now.Sub(w.start) >= a.window {
		w.start, w.n = now, 0
	}
	if w.n >= a.limit {
		return w.n, w.start.Add(a.window).Sub(now)
	}
	w.n++
	return w.n, 0
}

// refund gives back the slot of an attempt that authenticated.
func (a *adminAuth) refund(src string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.sources[src]
	if w == nil {
		w = a.sources[overflowSource]
	}
	if w != nil && w.n > 0 {
		w.n--
	}
}

// sourceKey is the peer address the failure limit keys on: IPv4 as is,
// IPv6 by its /64 (one host usually holds a whole /64).
func sourceKey(ctx *fasthttp.RequestCtx) string {
	var a netip.Addr
	if ta, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		a, _ = netip.AddrFromSlice(ta.IP)
	}
	a = a.Unmap()
	if a.Is6() {
		if p, err := a.Prefix(64); err == nil {
			return p.String()
		}
	}
	return a.String()
}
