// Package limiter enforces the proxy's rules with exact sliding windows:
// a Store decides every window of a request at one moment, all or nothing
// (Redis, batched, for every instance; Memory for one); a negative cache
// answers windows known full; a decision that cannot be made in time is
// shed, and only a failing Redis hands it to on_redis_error.
// docs/limiter.md says what "exact" means and why this keeps it.
package limiter

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Config of a Limiter.
type Config struct {
	Redis           redis.Cmdable // the windows' store; nil: this process ([proxy] limiter = "memory")
	KeyPrefix       string        // [redis] key_prefix
	Timeout         time.Duration // bound of one Redis call, and of the wait for one
	Instance        string        // unique id of this proxy instance
	MaxClientStates int           // negative-cache entries per rule (0: no bound)
	Metrics         *Metrics
	Log             *slog.Logger
	// Trace, if set, gets every window of every request the store admitted
	// (not on_redis_error): its client key ("" for a global window) and the
	// admission moment (µs, the store's clock). Tests check exactness by it.
	Trace func(policy, client string, micros int64)
}

// Limiter decides requests against compiled rules. Safe for concurrent use.
type Limiter struct {
	store     Store
	redis     *Redis  // the store, when it is Redis
	local     *Memory // on_redis_error = "local"
	maxStates atomic.Int64
	m         *Metrics
	log       *slog.Logger
	trace     func(string, string, int64)
	instances string                // the live-instance set (Redis)
	rules     atomic.Pointer[Rules] // for the sweeper
}

// New builds a Limiter.
func New(c Config) *Limiter {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	l := &Limiter{local: NewMemory(), m: c.Metrics, log: c.Log, trace: c.Trace, instances: c.KeyPrefix + "{rl}:instances"}
	if c.Redis != nil {
		l.redis = NewRedis(c.Redis, c.Instance, c.Timeout, c.Metrics, c.Log)
		l.store = l.redis
	} else {
		l.store = NewMemory()
	}
	l.maxStates.Store(int64(c.MaxClientStates))
	return l
}

// Live is the last known number of live proxy instances (at least 1).
func (l *Limiter) Live() int {
	if l.redis == nil {
		return 1
	}
	return l.redis.Live()
}

// Degraded reports whether the circuit breaker keeps Redis out of the path.
func (l *Limiter) Degraded() bool { return l.redis != nil && l.redis.Degraded() }

// SetMaxClientStates changes Config.MaxClientStates (a reload).
func (l *Limiter) SetMaxClientStates(n int) { l.maxStates.Store(int64(n)) }

// SetRules tells the sweeper which rule set is current.
func (l *Limiter) SetRules(rs *Rules) { l.rules.Store(rs) }

// eachDenied calls fn with the negative cache of every per-client window
// of the current rules.
func (l *Limiter) eachDenied(fn func(*Denied)) {
	if rs := l.rules.Load(); rs != nil {
		for _, r := range rs.list {
			for _, w := range r.Windows {
				if w.denied != nil {
					fn(w.denied)
				}
			}
		}
	}
}

// ClientStates is the number of per-client negative-cache entries.
func (l *Limiter) ClientStates() (n int64) {
	l.eachDenied(func(d *Denied) { n += d.n.Load() })
	return n
}

// Run heartbeats (Redis: the live-instance count) and sweeps the negative
// caches and in-process logs until ctx ends.
func (l *Limiter) Run(ctx context.Context) {
	if l.redis != nil {
		go l.redis.Run(ctx, l.instances)
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.Sweep(now)
		}
	}
}

// Sweep drops negative-cache entries that ran out, idle leases and idle
// in-process logs.
func (l *Limiter) Sweep(now time.Time) {
	l.eachDenied(func(d *Denied) { d.Sweep(mono(now)) })
	l.local.Sweep()
	if l.redis != nil {
		l.redis.leases.sweep(mono(now))
	}
	if m, ok := l.store.(*Memory); ok {
		m.Sweep()
	}
}

// Check decides a request, filling d: the enforced rules first, then,
// for an admitted request, the shadow rules (which so count only what is
// admitted, and are advisory). It takes at most about twice the Redis
// timeout (Redis).
func (l *Limiter) Check(rs *Rules, req Request, d *Decision) {
	d.matched = rs.Match(d.matched[:0], req.Method, req.Path)
	if len(d.matched) == 0 {
		return
	}
	l.m.decided.Add(1)
	if l.collect(req, d, false) {
		if !l.decide(d, false) {
			return
		}
		for _, r := range d.matched {
			if !r.Shadow {
				r.admitted.inc()
			}
		}
	}
	if l.collect(req, d, true) && l.decide(d, true) {
		for _, r := range d.matched {
			if r.Shadow {
				r.admitted.inc()
			}
		}
	}
}

// collect fills d.ents with the windows of the matched rules of one pass;
// false when there are none.
func (l *Limiter) collect(req Request, d *Decision, shadow bool) bool {
	d.ents, d.keys = d.ents[:0], d.keys[:0]
	for _, r := range d.matched {
		if r.Shadow != shadow {
			continue
		}
		for _, w := range r.Windows {
			e := entry{r: r, w: w}
			if w.Kind == PerIP {
				start := len(d.keys)
				d.keys = appendClientKey(d.keys, w, req)
				e.key = d.keys[start:len(d.keys):len(d.keys)]
			}
			d.ents = append(d.ents, e)
		}
	}
	return len(d.ents) > 0
}

// decide decides d.ents: from the negative cache when a window is known
// full, else through the store (or on_redis_error when it fails). It
// reports whether the windows admitted the request (a shadow pass only
// records: its refusal lets the request pass).
func (l *Limiter) decide(d *Decision, shadow bool) bool {
	now := time.Now()
	m := mono(now)
	var retry time.Duration
	for _, e := range d.ents {
		if u := e.w.deniedUntil(e.key); u > m {
			l.m.deniedHit.Inc()
			retry = max(retry, time.Duration(u-m))
			d.refuse(e, shadow)
		}
	}
	if retry > 0 {
		// The windows not asked are left out of the RateLimit headers.
		for _, e := range d.ents {
			if contains(d.Violated, e.w.Policy) {
				d.policy(e, Got{Remaining: 0, Reset: retry})
			}
		}
		return d.limited(retry, shadow)
	}

	d.wants, d.gots = d.wants[:0], d.gots[:0]
	for _, e := range d.ents {
		d.wants = append(d.wants, Want{Key: e.w.Key(e.key), Limit: e.w.Limit, Length: e.w.Length})
		d.gots = append(d.gots, Got{})
	}
	ok, err := l.store.Take(d.wants, 1, d.gots)
	switch {
	case errors.Is(err, ErrShed):
		if !shadow {
			d.Outcome, d.RetryAfter = Shed, time.Second
			for i, e := range d.ents {
				if i == 0 || d.ents[i-1].r != e.r { // once per rule
					e.r.shed.inc()
				}
			}
		}
		return false
	case err != nil:
		if shadow { // advisory: no verdict without the store
			return false
		}
		return l.fallback(d, err)
	}
	for i, e := range d.ents {
		g := d.gots[i]
		if g.Remaining == 0 && g.Reset > 0 {
			// Full until its oldest hit slides out, counted from before the
			// call left (never later than the store's own clock says).
			e.w.setDenied(e.key, m+int64(g.Reset), m, int(l.maxStates.Load()), counterRef{l.m.evicted})
		}
		if !shadow && g.Remaining >= 0 {
			d.policy(e, g)
		}
		if g.Full {
			retry = max(retry, g.Reset)
			d.refuse(e, shadow)
		}
	}
	if !ok {
		return d.limited(max(retry, time.Millisecond), shadow)
	}
	for i, e := range d.ents {
		if !shadow {
			e.w.admitted.inc()
		}
		if l.trace != nil {
			l.trace(e.w.Policy, string(e.key), d.gots[i].At)
		}
	}
	return true
}

// fallback decides d.ents without Redis, rule by rule, as on_redis_error
// says: "closed" refuses (503), "open" admits, "local" limits in-process at
// limit / live instances.
func (l *Limiter) fallback(d *Decision, err error) bool {
	reason := "error"
	switch {
	case errors.Is(err, errBreakerOpen):
		reason = "breaker_open"
	case isTimeout(err):
		reason = "timeout"
	}
	l.m.fallbacks.WithLabelValues(reason).Inc()
	l.log.Debug("limiter decision fell back to on_redis_error", "reason", reason, "err", err)
	d.Degraded = true
	live := l.Live()
	d.wants, d.gots = d.wants[:0], d.gots[:0]
	var local []entry
	closed := false
	for i, e := range d.ents {
		if i == 0 || d.ents[i-1].r != e.r {
			e.r.degraded.inc()
		}
		switch e.r.Mode {
		case ModeClosed:
			closed = true
		case ModeLocal:
			d.wants = append(d.wants, Want{Key: e.w.Key(e.key), Limit: max(1, e.w.Limit/live), Length: e.w.Length})
			d.gots = append(d.gots, Got{})
			local = append(local, e)
		}
	}
	if closed {
		d.Outcome, d.RetryAfter = Unavailable, time.Second
		return false
	}
	if len(local) == 0 {
		return true
	}
	if ok, _ := l.local.Take(d.wants, 1, d.gots); ok {
		return true
	}
	var retry time.Duration
	for i, e := range local {
		if d.gots[i].Full {
			retry = max(retry, d.gots[i].Reset)
			d.refuse(e, false)
		}
	}
	return d.limited(retry, false)
}

// isTimeout: the call's deadline, or a network timeout.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &t) && t.Timeout()
}

// refuse names e's window among those that refused.
func (d *Decision) refuse(e entry, shadow bool) {
	if shadow {
		if !contains(d.Shadow, e.w.Policy) {
			d.Shadow = append(d.Shadow, e.w.Policy)
			e.r.shadowed.inc()
		}
		return
	}
	if contains(d.Violated, e.w.Policy) {
		return
	}
	e.w.refused.inc()
	d.Violated = append(d.Violated, e.w.Policy)
	if !contains(d.Rules, e.r.Name) {
		d.Rules = append(d.Rules, e.r.Name)
		e.r.limited.inc()
	}
}

// limited ends an enforced pass refused (429) after retry.
func (d *Decision) limited(retry time.Duration, shadow bool) bool {
	if !shadow {
		d.Outcome, d.RetryAfter = Limited, retry
	}
	return false
}

// policy adds e's window to the RateLimit headers.
func (d *Decision) policy(e entry, g Got) {
	p := Policy{Name: e.w.Policy, Quota: e.w.Limit, Window: e.w.Length, Remaining: max(0, g.Remaining), Reset: g.Reset,
		Item: e.w.item, Prefix: e.w.prefix}
	if p.Reset <= 0 {
		p.Reset = e.w.Length
	}
	d.Policies = append(d.Policies, p)
}

// FormatInstance builds a unique instance id from a host name and a random part.
func FormatInstance(host string, random uint64) string {
	return host + "-" + strconv.FormatUint(random, 36)
}
