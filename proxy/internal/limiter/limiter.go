// Package limiter enforces the proxy's rules: exact sliding-window logs in
// Redis (lua/ratelimit.lua, one atomic call for every window a request needs)
// behind a local token cache so that most requests cost no Redis round trip:
//
//   - leases: a call takes up to k slots of a window at once and the instance
//     spends them locally for a short while (min(window/2, 1s)). k adapts: it
//     doubles while leases run out and halves when they expire unspent, and
//     the script caps it at free/(2*live instances), so it is 1 near the limit.
//     Leased slots are real log entries, so a window never admits more than its
//     limit plus the slots outstanding when older entries slide out (that
//     bound is exported as seckill_proxy_lease_outstanding_slots);
//   - a negative cache: a window found full is answered locally until the
//     exact time the script says its next slot frees, not longer.
//
// While Redis is slow or down (per-call timeout, circuit breaker) each rule
// does what its on_redis_error says; see Mode.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/lua"
	"github.com/seckill/seckill/proxy/internal/metrics"
)

// MaxLease caps the slots one call may take from one window.
const MaxLease = 1024

// liveness: an instance that has not called Redis for this long is not live.
// Every instance heartbeats at a third of it.
const liveness = 3 * time.Second

// Metrics of the limiter.
type Metrics struct {
	Decisions    *metrics.CounterVec // rule, outcome: admitted|limited|shadow|degraded
	RedisCalls   *metrics.CounterVec // result: ok|error|breaker_open
	RedisLatency *metrics.Histogram
	CacheHits    *metrics.CounterVec // kind: lease|denied
	LeaseSize    *metrics.Histogram

	ok, fail, skipped   *metrics.Counter
	leaseHit, deniedHit *metrics.Counter
}

// NewMetrics registers the limiter's metrics.
func NewMetrics(r *metrics.Registry) *Metrics {
	m := &Metrics{
		Decisions:    r.NewCounterVec("seckill_proxy_decisions_total", "Rate-limit decisions per rule.", "rule", "outcome"),
		RedisCalls:   r.NewCounterVec("seckill_proxy_redis_calls_total", "Limiter calls to Redis by result.", "result"),
		RedisLatency: r.NewHistogramVec("seckill_proxy_redis_call_seconds", "Latency of limiter calls to Redis.", metrics.LatencyBuckets).With(),
		CacheHits:    r.NewCounterVec("seckill_proxy_local_cache_hits_total", "Requests decided without Redis: from a lease or the negative cache.", "kind"),
		LeaseSize:    r.NewHistogramVec("seckill_proxy_lease_slots", "Slots granted per window per Redis call.", []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}).With(),
	}
	m.ok, m.fail, m.skipped = m.RedisCalls.With("ok"), m.RedisCalls.With("error"), m.RedisCalls.With("breaker_open")
	m.leaseHit, m.deniedHit = m.CacheHits.With("lease"), m.CacheHits.With("denied")
	return m
}

type counterRef struct{ c *metrics.Counter }

func (c counterRef) inc() {
	if c.c != nil {
		c.c.Inc()
	}
}

// Config of a Limiter.
type Config struct {
	Redis     redis.Scripter
	KeyPrefix string        // [redis] key_prefix
	Timeout   time.Duration // bound of one Redis call
	Instance  string        // unique id of this proxy instance
	Metrics   *Metrics
	Log       *slog.Logger
}

// Limiter decides requests against compiled rules. Safe for concurrent use.
type Limiter struct {
	rdb       redis.Scripter
	timeout   time.Duration
	id        string
	instances string // key of the live-instance set
	seq       atomic.Uint64
	live      atomic.Int64
	br        breaker
	m         *Metrics
	log       *slog.Logger

	outstanding atomic.Int64 // leased slots not yet spent or found expired

	mu    sync.Mutex
	rules *Rules // for the sweeper
}

// New builds a Limiter.
func New(c Config) *Limiter {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{rdb: c.Redis, timeout: c.Timeout, id: c.Instance, m: c.Metrics, log: c.Log,
		instances: c.KeyPrefix + KeyTag + ":instances"}
	l.live.Store(1)
	l.br.init()
	return l
}

// Live is the last known number of live proxy instances (at least 1).
func (l *Limiter) Live() int { return int(max(1, l.live.Load())) }

// Outstanding is the number of leased slots held locally and not yet spent.
func (l *Limiter) Outstanding() int64 { return l.outstanding.Load() }

// Degraded reports whether the circuit breaker keeps Redis out of the path.
func (l *Limiter) Degraded() bool { return l.br.isOpen() }

// SetRules tells the sweeper which rule set is current.
func (l *Limiter) SetRules(rs *Rules) {
	l.mu.Lock()
	l.rules = rs
	l.mu.Unlock()
}

// Run heartbeats (which also learns the live-instance count) and sweeps idle
// per-client state until ctx ends.
func (l *Limiter) Run(ctx context.Context) {
	t := time.NewTicker(liveness / 3)
	defer t.Stop()
	for {
		l.heartbeat()
		l.sweep(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (l *Limiter) heartbeat() {
	if _, err := l.call(nil, nil); err != nil && !errors.Is(err, errBreakerOpen) {
		l.log.Debug("limiter heartbeat failed", "err", err)
	}
}

func (l *Limiter) sweep(now time.Time) {
	l.mu.Lock()
	rs := l.rules
	l.mu.Unlock()
	if rs == nil {
		return
	}
	for _, r := range rs.list {
		if r.clients == nil {
			continue
		}
		idle := liveness
		for _, w := range r.Windows {
			if w.Kind == PerIP && w.Length > idle {
				idle = w.Length
			}
		}
		_, slots := r.clients.sweep(now, idle)
		l.outstanding.Add(-int64(slots))
	}
}

// Policy is the state of one window for the RateLimit headers.
type Policy struct {
	Name      string
	Quota     int
	Window    time.Duration
	Remaining int
	Reset     time.Duration
	// Item is this policy's RateLimit-Policy list member, `"name";q=Quota;w=W`
	// with W the window in whole seconds (rounded up, at least 1), and Prefix
	// the start of its RateLimit member, `"name";r=`; both precomputed.
	Item, Prefix string
}

// Outcome of a decision.
type Outcome uint8

// Outcomes.
const (
	Admit       Outcome = iota
	Limited             // 429
	Unavailable         // 503: a closed rule could not ask Redis
)

// Decision is the verdict on one request. Reuse one per request (Reset) to
// avoid allocations.
type Decision struct {
	Outcome    Outcome
	RetryAfter time.Duration
	Violated   []string // policies that refused, for violated-policies
	Rules      []string // rules that refused
	Policies   []Policy // every enforced policy, for RateLimit headers
	Shadow     []string // shadow policies that would have refused
	Degraded   bool

	entries []entry
	matched []*Rule
}

// Reset clears d for reuse.
func (d *Decision) Reset() {
	*d = Decision{Violated: d.Violated[:0], Rules: d.Rules[:0], Policies: d.Policies[:0],
		Shadow: d.Shadow[:0], entries: d.entries[:0], matched: d.matched[:0]}
}

type entry struct {
	r     *Rule
	w     *Window
	st    *state
	took  bool
	epoch uint64
	want  int
	// figures for the RateLimit headers, as of evaluate's last look at st
	rem     int
	resetAt time.Time
}

// snap records st's figures for the RateLimit headers (st.mu held).
func (e *entry) snap() { e.rem, e.resetAt = e.st.remaining+e.st.slots, e.st.resetAt }

// Check decides a request of the given method and path from the client key,
// filling d. It never blocks longer than about the Redis timeout.
func (l *Limiter) Check(rs *Rules, method, path, client []byte, d *Decision) {
	l.CheckAt(rs, method, path, client, time.Now(), d)
}

// CheckAt is Check with the current time supplied by the caller (a time.Now
// taken at most moments ago, e.g. fasthttp's RequestCtx.Time).
func (l *Limiter) CheckAt(rs *Rules, method, path, client []byte, now time.Time, d *Decision) {
	d.matched = rs.Match(d.matched[:0], method, path)
	if len(d.matched) == 0 {
		return
	}
	// Enforced rules first; shadow rules only see requests the others admit.
	for pass := 0; pass < 2; pass++ {
		shadow := pass == 1
		d.entries = d.entries[:0]
		for _, r := range d.matched {
			if r.Shadow != shadow {
				continue
			}
			for _, w := range r.Windows {
				st := r.global
				if w.Kind == PerIP {
					st = r.clients.get(client, now)
				}
				d.entries = append(d.entries, entry{r: r, w: w, st: st})
			}
		}
		if len(d.entries) == 0 {
			continue
		}
		allowed, retry, err := l.evaluate(d.entries, client, now)
		if err != nil {
			allowed, retry = l.fallback(d, now, shadow)
		} else if !shadow {
			for i := range d.entries {
				e := &d.entries[i]
				p := Policy{Name: e.w.Policy, Quota: e.w.Limit, Window: e.w.Length,
					Remaining: max(0, e.rem), Reset: max(0, e.resetAt.Sub(now)), Item: e.w.item, Prefix: e.w.prefix}
				if p.Reset == 0 {
					p.Reset = e.w.Length
				}
				d.Policies = append(d.Policies, p)
			}
		}
		if shadow {
			for i := range d.entries {
				e := &d.entries[i]
				if !allowed && e.violated() && !contains(d.Shadow, e.w.Policy) {
					d.Shadow = append(d.Shadow, e.w.Policy)
					e.r.shadowed.inc()
				}
			}
			if allowed {
				for _, r := range d.matched {
					if r.Shadow {
						r.admitted.inc()
					}
				}
			}
			continue
		}
		if !allowed {
			if d.Outcome == Admit {
				d.Outcome = Limited
			}
			d.RetryAfter = retry
			for i := range d.entries {
				e := &d.entries[i]
				if e.violated() {
					if !contains(d.Violated, e.w.Policy) {
						d.Violated = append(d.Violated, e.w.Policy)
					}
					if !contains(d.Rules, e.r.Name) {
						d.Rules = append(d.Rules, e.r.Name)
						e.r.limited.inc()
					}
				}
			}
			for i := range d.Policies {
				if contains(d.Violated, d.Policies[i].Name) {
					d.Policies[i].Remaining = 0
					d.Policies[i].Reset = retry
				}
			}
			return
		}
		for _, r := range d.matched {
			if !r.Shadow {
				r.admitted.inc()
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// violated: the window refused this request (set by evaluate/fallback).
func (e *entry) violated() bool { return e.want < 0 }

// evaluate decides the entries against their windows: negative cache, leases,
// then one Redis call for the windows without a local slot. On a Redis error
// nothing is decided (slots taken locally are given back).
func (l *Limiter) evaluate(es []entry, client []byte, now time.Time) (bool, time.Duration, error) {
	// Negative cache: a full window until its exact retry time.
	var retry time.Duration
	mnow := mono(now)
	for i := range es {
		e := &es[i]
		e.want, e.took = 0, false
		if until := e.st.deniedUntil.Load(); mnow < until {
			e.want = -1
			retry = max(retry, time.Duration(until-mnow))
		}
	}
	if retry > 0 {
		for i := range es {
			e := &es[i]
			e.st.mu.Lock()
			e.snap()
			e.st.mu.Unlock()
		}
		l.hit(l.m, false)
		return false, retry, nil
	}
	for attempt := 0; ; attempt++ {
		missing := 0
		var wait chan struct{}
		for i := range es {
			e := &es[i]
			if e.took {
				continue
			}
			e.st.mu.Lock()
			if e.st.slots > 0 && now.Before(e.st.leaseUntil) {
				e.st.slots--
				e.took, e.epoch = true, e.st.epoch
				l.outstanding.Add(-1)
			} else {
				l.expire(e.st)
				missing++
				if e.st.inflight != nil {
					wait = e.st.inflight
				}
			}
			e.snap()
			e.st.mu.Unlock()
		}
		if missing == 0 {
			l.hit(l.m, true)
			return true, 0, nil
		}
		if wait == nil || attempt > 0 {
			break
		}
		// Another request is refilling a window we need: wait for it rather
		// than stampede Redis, at most one Redis timeout.
		t := time.NewTimer(l.timeout)
		select {
		case <-wait:
		case <-t.C:
		}
		t.Stop()
		now = time.Now()
	}

	// One Redis call for every window without a local slot.
	var own []chan struct{}
	ws := make([]*entry, 0, len(es))
	keys := make([]string, 0, len(es))
	for i := range es {
		e := &es[i]
		if e.took {
			continue
		}
		e.st.mu.Lock()
		e.want = e.st.want
		if e.st.inflight == nil {
			ch := make(chan struct{})
			e.st.inflight = ch
			own = append(own, ch)
		}
		e.st.mu.Unlock()
		ws = append(ws, e)
		k := e.w.key
		if e.w.Kind == PerIP {
			k += string(client)
		}
		keys = append(keys, k)
	}
	res, err := l.call(ws, keys)
	now = time.Now()
	allowed := err == nil && res.allowed
	for i, e := range ws {
		e.st.mu.Lock()
		if err == nil {
			g := res.windows[i]
			e.st.remaining = g.remaining
			if g.reset > 0 {
				e.st.resetAt = now.Add(g.reset)
			} else if allowed {
				e.st.resetAt = now.Add(e.w.Length)
			}
			switch {
			case allowed:
				l.m.lease(g.granted)
				e.st.newLease(g.granted-1, now.Add(e.w.lease))
				l.outstanding.Add(int64(g.granted - 1))
			case g.granted == 0:
				e.want = -1
				e.st.deniedUntil.Store(mono(now) + int64(g.reset))
				retry = max(retry, g.reset)
			default:
				e.want = 0
			}
		}
		if len(own) > 0 && e.st.inflight != nil {
			for _, ch := range own {
				if e.st.inflight == ch {
					close(ch)
					e.st.inflight = nil
					break
				}
			}
		}
		e.snap()
		e.st.mu.Unlock()
	}
	if !allowed {
		// Give back the slots taken locally for windows that did not refuse.
		for i := range es {
			e := &es[i]
			if e.took {
				e.st.mu.Lock()
				if e.st.epoch == e.epoch && now.Before(e.st.leaseUntil) {
					e.st.slots++
					l.outstanding.Add(1)
				}
				e.snap()
				e.st.mu.Unlock()
				e.took = false
			}
		}
	}
	if err != nil {
		return false, 0, err
	}
	if !allowed && retry <= 0 {
		retry = time.Millisecond
	}
	return allowed, retry, nil
}

func (l *Limiter) hit(m *Metrics, lease bool) {
	if m == nil {
		return
	}
	if lease {
		m.leaseHit.Inc()
	} else {
		m.deniedHit.Inc()
	}
}

func (m *Metrics) lease(n int) {
	if m != nil {
		m.LeaseSize.Observe(float64(n))
	}
}

// expire drops a lease whose time is up (st.mu held).
func (l *Limiter) expire(st *state) {
	if st.slots > 0 {
		l.outstanding.Add(-int64(st.slots))
		st.slots = 0
		st.wasted = true
	}
}

var errBreakerOpen = errors.New("redis circuit breaker open")

type windowResult struct {
	granted, remaining int
	reset              time.Duration
}

type callResult struct {
	live    int
	allowed bool
	windows []windowResult
}

// call runs the script for the given windows (none: a pure heartbeat).
func (l *Limiter) call(ws []*entry, keys []string) (callResult, error) {
	now := time.Now()
	if !l.br.allow(now) {
		if l.m != nil {
			l.m.skipped.Inc()
		}
		return callResult{}, errBreakerOpen
	}
	allKeys := make([]string, 0, len(keys)+1)
	allKeys = append(allKeys, l.instances)
	allKeys = append(allKeys, keys...)
	args := make([]any, 0, 3+3*len(ws))
	args = append(args, l.id, l.seq.Add(1), liveness.Milliseconds())
	for _, e := range ws {
		args = append(args, e.w.Limit, max(1, e.w.Length.Milliseconds()), max(1, min(e.want, MaxLease, e.w.Limit)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	vals, err := lua.RateLimit.Run(ctx, l.rdb, allKeys, args...).Int64Slice()
	cancel()
	if l.m != nil {
		l.m.RedisLatency.Since(now)
	}
	if err == nil && len(vals) != 2+3*len(ws) {
		err = fmt.Errorf("ratelimit: %d values for %d windows", len(vals), len(ws))
	}
	if err != nil {
		if l.m != nil {
			l.m.fail.Inc()
		}
		if l.br.failure(time.Now()) {
			l.log.Warn("redis limiter degraded: circuit open, rules fall back to on_redis_error", "err", err)
		}
		return callResult{}, fmt.Errorf("ratelimit call: %w", err)
	}
	if l.m != nil {
		l.m.ok.Inc()
	}
	if l.br.success() {
		l.log.Info("redis limiter recovered: circuit closed")
	}
	res := callResult{live: int(vals[0]), allowed: vals[1] == 1, windows: make([]windowResult, len(ws))}
	l.live.Store(vals[0])
	for i := range ws {
		b := 2 + 3*i
		res.windows[i] = windowResult{granted: int(vals[b]), remaining: int(vals[b+1]),
			reset: time.Duration(vals[b+2]) * time.Millisecond}
	}
	return res, nil
}

// fallback decides d.entries without Redis, rule by rule, as on_redis_error
// says. Slots still leased locally are real and are spent first.
func (l *Limiter) fallback(d *Decision, now time.Time, shadow bool) (bool, time.Duration) {
	live := l.Live()
	allowed := true
	var retry time.Duration
	for i := range d.entries {
		e := &d.entries[i]
		e.want = 0
		switch e.r.Mode {
		case ModeOpen:
		case ModeClosed:
			if !shadow {
				d.Outcome = Unavailable
			}
			e.want = -1
			allowed = false
			retry = max(retry, time.Second)
		case ModeLocal:
			lim := max(1, e.w.Limit/live)
			ok, wait := e.st.local(now, e.w.Length, lim)
			if !ok {
				e.want = -1
				allowed = false
				retry = max(retry, wait)
			}
		}
	}
	if !shadow {
		d.Degraded = true
		// Once per rule; a rule's windows are adjacent in d.entries.
		for i := range d.entries {
			if r := d.entries[i].r; i == 0 || d.entries[i-1].r != r {
				r.degraded.inc()
			}
		}
	}
	if allowed {
		// Count the admitted request in every local window (local() above only
		// checked): commit.
		for i := range d.entries {
			e := &d.entries[i]
			if e.r.Mode == ModeLocal {
				e.st.localCommit(now, e.w.Length)
			}
		}
	}
	return allowed, retry
}

// FormatInstance builds a unique instance id from a host name and a random part.
func FormatInstance(host string, random uint64) string {
	return host + "-" + strconv.FormatUint(random, 36)
}
