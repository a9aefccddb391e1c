// Package readcache lets the proxy answer GETs from its own short cache, per
// rule ([[proxy.rules]] read_cache_ttl), so that a read flood of the sale
// state never reaches the backend.
//
// What is kept: a 200 answer to a GET without Authorization or Cookie, whose
// upstream said it may be kept (Cache-Control with max-age and without
// no-store, no-cache or private) and set no cookie, with a Content-Length of
// at most 64 KiB (a chunked answer passes through uncached); keyed by the
// request URI, for the TTL of the first matching rule that has one. The
// origin decides what is cacheable; the rule decides for how long (the
// backend's sale state says max-age in whole seconds, so a sub-second TTL
// needs the rule's own).
//
// What is answered: the kept status, Content-Type, Cache-Control and body,
// with Age grown by the time spent here. Hits are answered before the rate
// limits: they cost the backend nothing.
//
// When it forgets: at the TTL; at once on news about an activity (the
// stock-event channel, or the proxy learning it sold out) for
// /api/v1/activities/{id}; an answer to a request sent before such news is not
// kept (the rule of internal/soldout).
package readcache

import (
	"bytes"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/soldout"
)

// maxBody bounds a kept answer; maxEntries bounds the cache.
const (
	maxBody    = 64 << 10
	maxEntries = 10_000
)

type route struct {
	prefix []byte
	get    bool // the rule matches GET
	ttl    time.Duration
}

// Cache is the proxy's read cache.
type Cache struct {
	routes atomic.Pointer[[]route]
	on     atomic.Bool // some rule has a TTL
	news   *soldout.News
	mu     sync.RWMutex
	// m holds the entries by activity (0: not a sale state), then by URI, so
	// that news drops an activity's entries at once.
	m map[int64]map[string]*entry
	n int

	Hits, Stored prometheus.Counter
}

type entry struct {
	body, ctype  []byte
	cacheControl []byte
	age          time.Duration // the upstream's Age when stored
	stored       time.Time
	until        time.Time
}

// New builds the cache for rules (off until a rule has a read_cache_ttl).
func New(rules []conf.Rule, reg prometheus.Registerer) *Cache {
	c := &Cache{news: soldout.NewNews(), m: map[int64]map[string]*entry{}}
	c.SetRules(rules)
	if reg != nil {
		c.Hits = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_read_cache_hits_total", Help: "GETs answered from the proxy's read cache."})
		c.Stored = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_read_cache_stored_total", Help: "Upstream answers kept in the proxy's read cache."})
		reg.MustRegister(c.Hits, c.Stored)
	}
	return c
}

// SetRules swaps the rules in (a reload); it reports whether any rule has a
// read cache. Entries kept under the old rules expire by their own TTL.
func (c *Cache) SetRules(rules []conf.Rule) bool {
	rs := make([]route, 0, len(rules))
	any := false
	for _, r := range rules {
		get := len(r.Methods) == 0
		for _, m := range r.Methods {
			get = get || m == "GET"
		}
		rs = append(rs, route{prefix: []byte(r.PathPrefix), get: get, ttl: r.ReadCacheTTL.Duration})
		any = any || (get && r.ReadCacheTTL.Duration > 0)
	}
	c.routes.Store(&rs)
	c.on.Store(any)
	return any
}

// TTL is the read-cache TTL for a request (0: not cached): the first rule
// that matches it and has a TTL.
func (c *Cache) TTL(method, path []byte) time.Duration {
	if !c.on.Load() || string(method) != "GET" {
		return 0
	}
	for _, r := range *c.routes.Load() {
		if r.get && r.ttl > 0 && bytes.HasPrefix(path, r.prefix) {
			return r.ttl
		}
	}
	return 0
}

// Token is taken before the request is forwarded; Store needs it.
func (c *Cache) Token() soldout.Token { return c.news.Token() }

// Cacheable reports whether a request may be answered from or kept in the
// cache: no credentials, which would make the answer someone's own.
func Cacheable(h *fasthttp.RequestHeader) bool {
	return len(h.Peek(fasthttp.HeaderAuthorization)) == 0 && len(h.Peek(fasthttp.HeaderCookie)) == 0
}

// Serve answers ctx from the cache if it holds a fresh answer for uri.
func (c *Cache) Serve(ctx *fasthttp.RequestCtx, uri, path []byte, now time.Time) bool {
	id, _ := ActivityOf(path)
	c.mu.RLock()
	e := c.m[id][string(uri)]
	c.mu.RUnlock()
	if e == nil || !now.Before(e.until) {
		return false
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentTypeBytes(e.ctype)
	h := &ctx.Response.Header
	if len(e.cacheControl) > 0 {
		h.SetBytesV(fasthttp.HeaderCacheControl, e.cacheControl)
	}
	var buf [20]byte
	h.SetBytesV(fasthttp.HeaderAge, strconv.AppendInt(buf[:0], int64((e.age+now.Sub(e.stored))/time.Second), 10))
	ctx.SetBody(e.body)
	if c.Hits != nil {
		c.Hits.Inc()
	}
	return true
}

// Store keeps the upstream's answer to a GET of uri for ttl, when it may be
// kept and no news about its activity arrived since tok.
func (c *Cache) Store(uri, path []byte, tok soldout.Token, resp *fasthttp.Response, ttl time.Duration, now time.Time) {
	if resp.StatusCode() != fasthttp.StatusOK || !keepable(resp) {
		return
	}
	for range resp.Header.Cookies() {
		return // someone's own answer
	}
	// Only a body of known, small length is read here: the forwarder
	// streams responses, and Body() would buffer a large or chunked one.
	if n := resp.Header.ContentLength(); n < 0 || n > maxBody {
		return
	}
	body := resp.Body()
	id, _ := ActivityOf(path)
	if id != 0 && c.news.Since(id, tok) {
		return
	}
	e := &entry{
		body: bytes.Clone(body), ctype: bytes.Clone(resp.Header.ContentType()),
		cacheControl: bytes.Clone(resp.Header.Peek(fasthttp.HeaderCacheControl)),
		stored:       now, until: now.Add(ttl),
	}
	if a, err := strconv.Atoi(string(resp.Header.Peek(fasthttp.HeaderAge))); err == nil && a > 0 {
		e.age = time.Duration(a) * time.Second
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if id != 0 && c.news.Since(id, tok) { // news while we built the entry
		return
	}
	if c.n >= maxEntries {
		c.prune(now)
		if c.n >= maxEntries {
			return
		}
	}
	byURI := c.m[id]
	if byURI == nil {
		byURI = map[string]*entry{}
		c.m[id] = byURI
	}
	if _, ok := byURI[string(uri)]; !ok {
		c.n++
	}
	byURI[string(uri)] = e
	if c.Stored != nil {
		c.Stored.Inc()
	}
}

func (c *Cache) prune(now time.Time) {
	for id, byURI := range c.m {
		for k, e := range byURI {
			if !now.Before(e.until) {
				delete(byURI, k)
				c.n--
			}
		}
		if len(byURI) == 0 {
			delete(c.m, id)
		}
	}
}

// keepable: the upstream allows shared caches to keep the answer.
func keepable(resp *fasthttp.Response) bool {
	cc := resp.Header.Peek(fasthttp.HeaderCacheControl)
	if !bytes.Contains(cc, []byte("max-age")) {
		return false
	}
	for _, d := range [][]byte{[]byte("no-store"), []byte("no-cache"), []byte("private")} {
		if bytes.Contains(cc, d) {
			return false
		}
	}
	return true
}

var statePrefix = []byte("/api/v1/activities/")

// ActivityOf returns the activity id of a sale-state path
// (/api/v1/activities/{id}), else 0.
func ActivityOf(path []byte) (int64, bool) {
	if !bytes.HasPrefix(path, statePrefix) {
		return 0, false
	}
	rest := path[len(statePrefix):]
	if i := bytes.IndexByte(rest, '/'); i >= 0 {
		return 0, false
	}
	return soldout.ParseID(rest)
}

// Changed forgets the sale state of activity id (a soldout.Listener).
func (c *Cache) Changed(id int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.news.Add(id, time.Now())
	c.n -= len(c.m[id])
	delete(c.m, id)
}

// Reset forgets every sale state: news may have been missed (a
// soldout.Listener).
func (c *Cache) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.news.Reset()
	for id, byURI := range c.m {
		if id != 0 {
			c.n -= len(byURI)
			delete(c.m, id)
		}
	}
}
