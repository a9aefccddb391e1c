// Package limiter enforces the proxy's rules: exact sliding-window logs in
// Redis (lua/ratelimit.lua) behind a local token cache, so that most requests
// cost no Redis round trip. docs/limiter.md states what "exact" means and why
// this design keeps it; in short:
//
//   - every admitted request (or leased slot) is a member of its window's log,
//     scored at the latest moment it may be spent, so no slot slides out of a
//     window before it is spent: in every interval of a window's length the
//     requests admitted by all instances together are at most its limit;
//   - requests of one window that find no local slot share one call: the
//     first asks Redis for itself and for those waiting behind it;
//   - a call may also lease spare slots (k adapts: it doubles while leases
//     run out and halves after waste; the script caps it at free/(2*live));
//     slots not spent in time are given back (removed from the log) in the
//     next call for their key or by the sweeper;
//   - a negative cache answers a window that Redis reported full until the
//     moment its next slot frees, and only that window: a local slot is
//     spent first, and another window's fullness never refuses a request.
//   - a window found full while slots of it are held by requests of this
//     instance still being decided is not full yet: the request puts back
//     what it holds and waits for them (waitSettled).
//
// While Redis is slow or down (per-call timeout, circuit breaker) each rule
// does what its on_redis_error says; see Mode.
package limiter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/metrics"
	"github.com/seckill/seckill/lua"
)

// MaxLease caps the slots one call may take from one window.
const MaxLease = 1024

// liveness: an instance that has not heartbeaten for this long is not live.
// Every instance heartbeats (and sweeps) at a third of it.
const liveness = 3 * time.Second

// Metrics of the limiter.
type Metrics struct {
	decisions *prometheus.CounterVec // rule, outcome: admitted|limited|shadow|degraded
	windows   *prometheus.CounterVec // rule, window kind, outcome: admitted|refused
	calls     *prometheus.CounterVec // result: ok|error|breaker_open
	latency   prometheus.Histogram
	leaseSize prometheus.Histogram

	ok, fail, skipped   prometheus.Counter
	leaseHit, deniedHit prometheus.Counter
	returned            prometheus.Counter
	evicted             counterRef
	decided             atomic.Uint64 // decisions that needed the limiter (for calls per decision)
	called              atomic.Uint64 // script calls
}

// NewMetrics registers the limiter's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v
	}
	m := &Metrics{
		decisions: f("seckill_proxy_decisions_total", "Rate-limit decisions per rule.", "rule", "outcome"),
		windows: f("seckill_proxy_window_decisions_total",
			"Admitted requests per window, and refused ones counted on the full window that refused them.", "rule", "window", "outcome"),
		calls: f("seckill_proxy_redis_calls_total", "Limiter script calls to Redis by result (one per hash tag a decision needs).", "result"),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seckill_proxy_redis_call_seconds",
			Help: "Latency of limiter round trips to Redis.", Buckets: metrics.LatencyBuckets}),
		leaseSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seckill_proxy_lease_slots",
			Help: "Slots granted per window per Redis call.", Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}}),
	}
	hits := f("seckill_proxy_local_cache_hits_total", "Windows decided without Redis: from a leased slot or the negative cache.", "kind")
	returned := prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_lease_returned_slots_total",
		Help: "Leased slots not spent in time and given back to their window (the limiter's under-admission)."})
	evicted := prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_client_states_evicted_total",
		Help: "Per-client window states dropped to keep the table within max_client_states (their leased slots given back)."})
	reg.MustRegister(m.latency, m.leaseSize, returned, evicted)
	m.evicted = counterRef{evicted}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "seckill_proxy_redis_calls_per_decision",
		Help: "Limiter script calls per decision since start."}, func() float64 {
		if d := m.decided.Load(); d > 0 {
			return float64(m.called.Load()) / float64(d)
		}
		return 0
	}))
	m.ok, m.fail, m.skipped = m.calls.WithLabelValues("ok"), m.calls.WithLabelValues("error"), m.calls.WithLabelValues("breaker_open")
	m.leaseHit, m.deniedHit = hits.WithLabelValues("lease"), hits.WithLabelValues("denied")
	m.returned = returned
	return m
}

// Calls is the number of script calls made so far (tests, benchmarks).
func (m *Metrics) Calls() uint64 { return m.called.Load() }

type counterRef struct{ c prometheus.Counter }

func (c counterRef) inc() {
	if c.c != nil {
		c.c.Inc()
	}
}

// Config of a Limiter.
type Config struct {
	Redis     redis.Cmdable
	KeyPrefix string        // [redis] key_prefix
	Timeout   time.Duration // bound of one Redis round trip
	Instance  string        // unique id of this proxy instance
	// MaxClientStates bounds the per-client window states one rule keeps in
	// memory ([proxy] max_client_states; 0: no bound).
	MaxClientStates int
	Metrics         *Metrics
	Log             *slog.Logger
	// Trace, if set, is called for every window of every request admitted
	// by Redis (not by on_redis_error) with the window's client key ("" for
	// a global window) and the admission moment in Redis µs: the time of the
	// deciding call, or an upper bound of the moment the request was
	// admitted, never past the slot's score. Tests check exactness with it.
	Trace func(policy, client string, redisMicros int64)
}

// Limiter decides requests against compiled rules. Safe for concurrent use.
type Limiter struct {
	rdb       redis.Cmdable
	timeout   time.Duration
	maxStates atomic.Int64 // Config.MaxClientStates
	rtt       atomic.Int64 // smoothed round-trip time to Redis, ns
	id        string
	instances string // key of the live-instance set
	seq       atomic.Uint64
	live      atomic.Int64
	br        breaker
	m         *Metrics
	log       *slog.Logger
	trace     func(string, string, int64)

	outstanding atomic.Int64 // leased slots held locally, not yet spent or given back
	batch       batcher

	mu      sync.Mutex
	rules   *Rules    // for the sweeper
	retired []retired // replaced rule sets whose in-flight requests may still lease
}

// retired is a replaced rule set: requests decided against it while the
// reload happened may still lease slots into its states, so the sweeper
// gives them back for a while.
type retired struct {
	rs *Rules
	at time.Time
}

// New builds a Limiter.
func New(c Config) *Limiter {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	l := &Limiter{rdb: c.Redis, timeout: c.Timeout, id: c.Instance, m: c.Metrics, log: c.Log, trace: c.Trace,
		instances: c.KeyPrefix + "{rl}:instances"}
	l.maxStates.Store(int64(c.MaxClientStates))
	l.live.Store(1)
	l.br.init()
	l.batch.queue = make(chan *job, maxQueued)
	return l
}

// Live is the last known number of live proxy instances (at least 1).
func (l *Limiter) Live() int { return int(max(1, l.live.Load())) }

// Outstanding is the number of leased slots held locally and not yet spent.
func (l *Limiter) Outstanding() int64 { return l.outstanding.Load() }

// SetMaxClientStates changes Config.MaxClientStates (a reload); tables
// above the new bound shrink as new clients come.
func (l *Limiter) SetMaxClientStates(n int) { l.maxStates.Store(int64(n)) }

// ClientStates is the number of per-client window states of the current rules.
func (l *Limiter) ClientStates() int64 {
	l.mu.Lock()
	rs := l.rules
	l.mu.Unlock()
	var n int64
	if rs != nil {
		for _, r := range rs.list {
			if r.clients != nil {
				n += r.clients.n.Load()
			}
		}
	}
	return n
}

// Degraded reports whether the circuit breaker keeps Redis out of the path.
func (l *Limiter) Degraded() bool { return l.br.isOpen() }

// SetRules tells the sweeper which rule set is current.
// The slots leased under the rule set it replaces are given back.
func (l *Limiter) SetRules(rs *Rules) {
	l.mu.Lock()
	old := l.rules
	l.rules = rs
	if old != nil && old != rs {
		l.retired = append(l.retired, retired{rs: old, at: time.Now()})
	}
	l.mu.Unlock()
	if old != nil && old != rs {
		l.giveBack(old, math.MaxInt64)
	}
}

// Run heartbeats (which also learns the live-instance count), gives back
// expired leases and drops idle per-client state until ctx ends.
func (l *Limiter) Run(ctx context.Context) {
	t := time.NewTicker(liveness / 3)
	defer t.Stop()
	for {
		l.heartbeat()
		l.Sweep(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (l *Limiter) heartbeat() {
	if !l.br.allow(time.Now()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	n, err := lua.Instances.Run(ctx, l.rdb, []string{l.instances}, l.id, liveness.Milliseconds()).Int64()
	cancel()
	if err != nil {
		l.failed(err)
		l.log.Debug("limiter heartbeat failed", "err", err)
		return
	}
	l.succeeded()
	l.live.Store(n)
}

// Sweep gives back the slots of leases that expired unspent (one call per
// key holding some) and drops idle per-client state.
func (l *Limiter) Sweep(now time.Time) {
	l.mu.Lock()
	rs := l.rules
	// A retired rule set is kept while a request decided against it may
	// still be in flight (bounded by twice the timeout) and a little more.
	keep := max(liveness, 4*l.timeout)
	old := l.retired[:0:0]
	for _, r := range l.retired {
		if now.Sub(r.at) < keep {
			old = append(old, r)
		}
	}
	l.retired = old
	l.mu.Unlock()
	for _, r := range old {
		l.giveBack(r.rs, math.MaxInt64)
	}
	if rs == nil {
		return
	}
	l.giveBack(rs, mono(now))
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
		r.clients.sweep(now, idle)
	}
}

// giveBack returns to Redis the slots of rs's leases that expired by m (mono
// ns), and those of evicted states, one call per key holding some,
// pipelined.
func (l *Limiter) giveBack(rs *Rules, m int64) {
	var calls []call
	// per call: the table and client of an evicted state's give-back, or
	// the zero value
	type from struct {
		t      *table
		client string
	}
	var orphans []from
	collect := func(rs *Rules, w *Window, client string, st *state) {
		st.mu.Lock()
		st.expireAll(m, &l.outstanding)
		if len(st.back) > 0 && st.refill == nil {
			st.deniedUntil.Store(0) // stale once slots are given back
			c := call{tag: w.Policy + "\x00" + client, keys: []string{rs.Key(w, []byte(client))}}
			c.wins = []callWindow{{w: w, st: st, back: st.back}}
			st.back = nil
			calls = append(calls, c)
			orphans = append(orphans, from{})
		}
		st.mu.Unlock()
	}
	for _, r := range rs.list {
		for _, w := range r.Windows {
			if w.Kind == Global {
				collect(rs, w, "", r.global)
				continue
			}
			r.clients.each(func(client string, st *state) { collect(rs, w, client, st) })
			for _, o := range r.clients.takeOrphans() {
				// The state is gone: a stand-in carries the spans.
				calls = append(calls, call{tag: w.Policy + "\x00" + o.client, keys: []string{rs.Key(w, []byte(o.client))},
					wins: []callWindow{{w: w, st: newState(), back: o.back}}})
				orphans = append(orphans, from{r.clients, o.client})
			}
		}
	}
	for len(calls) > 0 {
		// Bounded pipelines, so that each round trip fits the timeout.
		n := min(len(calls), 256)
		batch, of := calls[:n], orphans[:n]
		calls, orphans = calls[n:], orphans[n:]
		l.run(batch, mono(time.Now())+int64(l.timeout))
		for i := range batch {
			c := &batch[i]
			if c.err != nil { // keep them for the next call or sweep (ZREM is idempotent)
				cw := &c.wins[0]
				if o := of[i]; o.t != nil {
					o.t.keepOrphan(orphan{o.client, cw.back})
					continue
				}
				cw.st.mu.Lock()
				cw.st.back = append(cw.st.back, cw.back...)
				cw.st.mu.Unlock()
			} else {
				l.m.returned.Add(float64(spanSlots(c.wins[0].back)))
			}
		}
	}
}

func spanSlots(sp []span) int {
	n := 0
	for _, s := range sp {
		n += s.to - s.from + 1
	}
	return n
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

// Header is what a keyed window reads of a request: *fasthttp.RequestHeader
// has both methods.
type Header interface {
	PeekBytes(name []byte) []byte
	CookieBytes(name []byte) []byte
}

// Request is what the limiter needs of a request.
type Request struct {
	Method, Path []byte
	Addr         []byte // the client address key (identity)
	Header       Header // nil: keyed windows count by address
	// A keyed window counts by its header or cookie only when someone
	// vouches for the value — otherwise a client would make up a new one
	// per request — and by Addr else: Trusted, the peer is a trusted proxy
	// (it vouches for what it forwards); or Verified covers the window.
	Trusted  bool
	Verified *Verified
}

// Verified names the headers and cookies whose values the proxy itself
// verified on a request: the X-User-ID it set from a valid JWT, and the
// header or cookie that carried that token. Built once per identity
// configuration; nil: nothing verified.
type Verified struct {
	Headers [][]byte // any case
	Cookies [][]byte
}

// covers reports whether w reads a value v vouches for.
func (v *Verified) covers(w *Window) bool {
	if v == nil {
		return false
	}
	if w.Source == FromCookie {
		for _, n := range v.Cookies {
			if bytes.Equal(n, w.Name) {
				return true
			}
		}
		return false
	}
	for _, n := range v.Headers {
		if bytes.EqualFold(n, w.Name) {
			return true
		}
	}
	return false
}

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

	entries  []entry // enforced windows
	sentries []entry // shadow windows
	matched  []*Rule
	keys     []byte // client keys of the entries
}

// Reset clears d for reuse.
func (d *Decision) Reset() {
	*d = Decision{Violated: d.Violated[:0], Rules: d.Rules[:0], Policies: d.Policies[:0],
		Shadow: d.Shadow[:0], entries: d.entries[:0], sentries: d.sentries[:0], matched: d.matched[:0], keys: d.keys[:0]}
}

// entry is one window of the request being decided.
type entry struct {
	r   *Rule
	w   *Window
	st  *state
	key []byte // client key (per-client windows)

	own      *refill // the refill this request owns for the window
	waited   *refill // the last refill it waited for (and was counted in)
	took     bool    // holds slot sl (local, or slot 1 of this request's call)
	sl       slot    // valid while mono time < sl.until (unless decisive)
	decisive bool    // sl is slot 1 scored at its call's time: valid as that call's decision only
	lost     bool    // lostSp: slot 1 of a call whose reply was lost (see settle)
	lostSp   span
	violated bool          // this window is full and refused the request
	retry    time.Duration // with violated from a call: until its next slot frees
	stamp    int64         // the admission moment, Redis µs (Trace)

	// figures for the RateLimit headers, as of the last look at st
	rem     int
	resetAt time.Time
}

// snap records st's figures for the RateLimit headers (st.mu held).
func (e *entry) snap() { e.rem, e.resetAt = e.st.remaining+slotsOf(e.st), e.st.resetAt }

func slotsOf(st *state) int {
	n := 0
	for _, b := range st.batches {
		n += b.to - b.from + 1
	}
	return n
}

// Check decides a request, filling d. It blocks at most about twice the
// Redis timeout: the wait for its call to be sent is bounded by the timeout,
// and so is the call.
func (l *Limiter) Check(rs *Rules, req Request, d *Decision) {
	d.matched = rs.Match(d.matched[:0], req.Method, req.Path)
	if len(d.matched) == 0 {
		return
	}
	now := time.Now()
	// Shadow rules are decided first and enforced ones last, so that the
	// enforced decision is the moment the request is admitted (its slots are
	// checked then, and nothing waits after it). Shadow rules still count
	// only requests the enforced ones admit: their slots go back otherwise.
	shadowRan, shadowOK, shadowExact := false, false, false
	if l.collect(req, d, &d.sentries, true, now) {
		shadowRan = true
		shadowOK, shadowExact = l.pass(rs, d, d.sentries, true)
	}
	ok, exact := true, false
	if l.collect(req, d, &d.entries, false, now) {
		ok, exact = l.pass(rs, d, d.entries, false)
	}
	if shadowRan {
		if ok {
			l.recordShadow(d, shadowOK)
			l.spend(d.sentries)
		} else if shadowOK {
			l.settle(d.sentries, false)
		}
	}
	if ok && l.trace != nil {
		if exact {
			l.traceAdmit(d.entries)
		}
		if shadowOK && shadowExact {
			l.traceAdmit(d.sentries)
		}
	}
	releaseAll(d.sentries)
	releaseAll(d.entries)
}

// releaseAll ends the request's use of its per-client states (table.get).
func releaseAll(es []entry) {
	for i := range es {
		if es[i].w.Kind == PerIP {
			release(es[i].st)
		}
	}
}

// pass decides the enforced (or the shadow) entries es; it reports whether
// they admit the request and whether Redis decided (not on_redis_error).
func (l *Limiter) pass(rs *Rules, d *Decision, es []entry, shadow bool) (admitted, exact bool) {
	l.m.decided.Add(1)
	allowed, retry, err := l.evaluate(rs, es, shadow)
	now := time.Now()
	if err != nil {
		allowed, retry = l.fallback(d, es, now, shadow)
		l.settle(es, allowed)
	} else if !shadow {
		l.policies(d, es, now)
	}
	if shadow {
		return allowed, err == nil
	}
	if !allowed {
		l.recordLimited(d, es, retry)
		return false, err == nil
	}
	l.spend(es)
	l.recordAdmitted(d, es)
	return true, err == nil
}

// collect fills *dst with the windows of the matched rules of this pass;
// false when there are none.
func (l *Limiter) collect(req Request, d *Decision, dst *[]entry, shadow bool, now time.Time) bool {
	es := (*dst)[:0]
	for _, r := range d.matched {
		if r.Shadow != shadow {
			continue
		}
		for _, w := range r.Windows {
			e := entry{r: r, w: w, st: r.global}
			if w.Kind == PerIP {
				start := len(d.keys)
				d.keys = appendClientKey(d.keys, w, req)
				e.key = d.keys[start:len(d.keys):len(d.keys)]
				e.st = r.clients.get(e.key, now, int(l.maxStates.Load()), &l.outstanding, l.m.evicted)
			}
			es = append(es, e)
		}
	}
	*dst = es
	return len(es) > 0
}

// policies fills d.Policies from the enforced entries.
func (l *Limiter) policies(d *Decision, es []entry, now time.Time) {
	for i := range es {
		e := &es[i]
		p := Policy{Name: e.w.Policy, Quota: e.w.Limit, Window: e.w.Length,
			Remaining: max(0, e.rem), Reset: max(0, e.resetAt.Sub(now)), Item: e.w.item, Prefix: e.w.prefix}
		if p.Reset == 0 {
			p.Reset = e.w.Length
		}
		d.Policies = append(d.Policies, p)
	}
}

func (l *Limiter) recordShadow(d *Decision, allowed bool) {
	if !allowed {
		for i := range d.sentries {
			e := &d.sentries[i]
			if e.violated && !contains(d.Shadow, e.w.Policy) {
				d.Shadow = append(d.Shadow, e.w.Policy)
				e.r.shadowed.inc()
			}
		}
		return
	}
	for _, r := range d.matched {
		if r.Shadow {
			r.admitted.inc()
		}
	}
}

func (l *Limiter) recordLimited(d *Decision, es []entry, retry time.Duration) {
	if d.Outcome == Admit {
		d.Outcome = Limited
	}
	d.RetryAfter = retry
	for i := range es {
		e := &es[i]
		if !e.violated {
			continue
		}
		e.w.refused.inc()
		if !contains(d.Violated, e.w.Policy) {
			d.Violated = append(d.Violated, e.w.Policy)
		}
		if !contains(d.Rules, e.r.Name) {
			d.Rules = append(d.Rules, e.r.Name)
			e.r.limited.inc()
		}
	}
	for i := range d.Policies {
		if contains(d.Violated, d.Policies[i].Name) {
			d.Policies[i].Remaining = 0
			d.Policies[i].Reset = retry
		}
	}
}

func (l *Limiter) recordAdmitted(d *Decision, es []entry) {
	for _, r := range d.matched {
		if !r.Shadow {
			r.admitted.inc()
		}
	}
	for i := range es {
		es[i].w.admitted.inc()
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

// errTimeout: the request's deadline passed before Redis could decide it
// (its call waited too long to be sent, or its slots ran out while it
// waited); it is decided as on_redis_error says.
var errTimeout = errors.New("limiter: redis timeout passed before a decision")

// evaluate decides the entries: local slots first, then the negative cache,
// then a refill shared with concurrent requests. A refusal names only full
// windows: a window that looks full while slots of it are held by undecided
// requests of this instance is not full yet, and the request waits for them
// (waitSettled). The request is admitted only once every window holds a slot
// that is still valid at that moment (recheck). On an error nothing is
// decided: the slots stay held for settle. A shadow pass does not wait for
// held slots (its slots are held through the enforced pass, and a shadow
// window is advisory): there they count as taken.
func (l *Limiter) evaluate(rs *Rules, es []entry, shadow bool) (bool, time.Duration, error) {
	for i := range es {
		e := &es[i]
		e.own, e.waited, e.took, e.decisive, e.lost, e.violated = nil, nil, false, false, false, false
	}
	deadline := mono(time.Now()) + int64(l.timeout)
	called := false
	lk := look{wait: !shadow}
	var long time.Duration // after a round too slow for its slots: their time at least this
	for {
		m := mono(time.Now())
		missing, retry, held := l.takeLocal(es, m, &lk)
		if missing == 0 {
			if l.recheck(es) {
				if !called {
					l.m.leaseHit.Inc()
				}
				return true, 0, nil
			}
			continue
		}
		if retry > 0 {
			l.m.deniedHit.Inc()
			l.releaseClaims(es)
			l.putBack(es)
			return false, retry, nil
		}
		if held.st != nil {
			if err := l.waitSettled(es, held, deadline); err != nil {
				return false, 0, err
			}
			lk.ordered = true
			continue
		}
		if m >= deadline {
			l.releaseClaims(es)
			l.uncount(es)
			return false, 0, errTimeout
		}
		if st, rf := l.claim(es); rf != nil {
			// Another request's call will ask for this one too: wait for it.
			if !l.wait(st, rf, deadline) {
				return false, 0, errTimeout
			}
			continue
		}
		called = true
		if done, ok, retry, err := l.refillAndDecide(rs, es, deadline, &long, &lk); done {
			return ok, retry, err
		}
	}
}

// heldBy names a window that looks full while slots of it are held by
// undecided requests of this instance, the generation of its decided slots
// when that was seen, and when its negative answer ends (state.awaitSettled).
type heldBy struct {
	st    *state
	gen   uint32
	until int64
}

// look is how a pass looks for slots. wait: a window that looks full while
// slots of it are held is waited for (not in a shadow pass); ordered: after
// such a wait, local slots are taken in entry order, stopping at the first
// missing one (so two requests that waited cannot each hold a slot of the
// other's missing window again).
type look struct{ wait, ordered bool }

// held reports whether st's missing slots may be held by undecided
// requests (when the pass waits for them); the generation is read first, so
// a slot decided meanwhile ends the wait at once. st.mu held.
func (lk *look) held(st *state) (heldBy, bool) {
	if !lk.wait {
		return heldBy{}, false
	}
	gen := st.settled.Load()
	return heldBy{st, gen, st.deniedUntil.Load()}, st.held.Load() > 0
}

// takeLocal takes a leased slot for every entry that has none yet; it
// returns how many still lack one and, when some of those are full per the
// negative cache, the time until the last of them frees — or, when those
// full windows have slots held by undecided requests, one such window.
func (l *Limiter) takeLocal(es []entry, m int64, lk *look) (missing int, retry time.Duration, held heldBy) {
	for i := range es {
		e := &es[i]
		if e.took {
			continue
		}
		e.violated = false
		if lk.ordered && missing > 0 {
			missing++
			continue
		}
		e.st.mu.Lock()
		if sl, ok := e.st.take(m, &l.outstanding); ok {
			e.took, e.sl = true, sl
		} else {
			missing++
			// Slots waiting to be given back make the negative answer
			// stale: the call that gives them back decides.
			if until := e.st.deniedUntil.Load(); m < until && len(e.st.back) == 0 {
				if h, ok := lk.held(e.st); ok {
					if held.st == nil {
						held = h
					}
				} else {
					e.violated = true
					retry = max(retry, time.Duration(max(until, e.st.retryAt)-m))
				}
			}
		}
		e.snap()
		e.st.mu.Unlock()
	}
	return missing, retry, held
}

// waitSettled: a window the request needs looks full, but slots of it are
// held by undecided requests of this instance, which may put them back. The
// request first gives up every slot and claim it holds — two requests each
// holding a slot of the other's missing window must not wait for each other
// — then waits until one of those slots is decided (or the window's
// negative answer ends: a refusal would not be the answer past it either),
// or its deadline.
func (l *Limiter) waitSettled(es []entry, h heldBy, deadline int64) error {
	l.releaseClaims(es)
	l.putBack(es)
	if !h.st.awaitSettled(h.gen, h.until, deadline) {
		l.uncount(es)
		return errTimeout
	}
	return nil
}

// recheck is the admission moment: it admits (and stamps) the request if
// every slot it holds is still valid now. Otherwise it gives back the
// expired slots, and the slots granted as the decision of a call (scored at
// that call's time, so only good for that decision), and the request looks
// again.
func (l *Limiter) recheck(es []entry) bool {
	m := mono(time.Now())
	ok := true
	for i := range es {
		if e := &es[i]; e.took && !e.decisive && m >= e.sl.until {
			ok = false
		}
	}
	if ok {
		for i := range es {
			e := &es[i]
			if e.decisive {
				e.stamp = e.sl.t0
			} else {
				e.stamp = e.sl.t0 + (m-e.sl.sent)/1000
			}
		}
		return true
	}
	for i := range es {
		e := &es[i]
		if !e.took || (!e.decisive && m < e.sl.until) {
			continue
		}
		e.st.mu.Lock()
		e.st.giveBack(span{e.sl.seq, e.sl.idx, e.sl.j, e.sl.j}, nil)
		e.st.decided(true)
		e.snap()
		e.st.mu.Unlock()
		e.took, e.decisive = false, false
	}
	return false
}

// putBack returns the slots held by a request that is refused: a slot keeps
// its time and stays spendable while that lasts, else it is given back.
func (l *Limiter) putBack(es []entry) {
	m := mono(time.Now())
	for i := range es {
		e := &es[i]
		if !e.took {
			continue
		}
		e.st.mu.Lock()
		if e.decisive {
			// Slot 1 of a call scored at the call's time: it cannot be kept
			// for later, so it leaves the log.
			e.st.giveBack(span{e.sl.seq, e.sl.idx, 1, 1}, nil)
		} else {
			e.st.putBack(e.sl, m, &l.outstanding)
		}
		e.st.decided(true)
		e.snap()
		e.st.mu.Unlock()
		e.took, e.decisive = false, false
	}
}

// spend ends the holding of the slots of an admitted request: they are
// spent.
func (l *Limiter) spend(es []entry) {
	for i := range es {
		if e := &es[i]; e.took {
			e.st.decided(false)
			e.took, e.decisive = false, false
		}
	}
}

// settle ends a decision made without Redis (on_redis_error): if it admitted
// the request, the slots it holds are spent and the slot a failed call may
// have written for it stays in the log (the request did happen); if it
// refused, they all go back.
func (l *Limiter) settle(es []entry, admitted bool) {
	if admitted {
		l.spend(es)
	}
	for i := range es {
		e := &es[i]
		if admitted {
			e.lost = false
			continue
		}
		if e.lost {
			e.st.mu.Lock()
			e.st.giveBack(e.lostSp, nil)
			e.st.mu.Unlock()
			e.lost = false
		}
	}
	if !admitted {
		l.putBack(es)
	}
}

// claim makes this request the refill owner of every window still lacking
// a slot. When one of them already has a call in flight, it registers as a
// waiter of that call instead, gives up its claims and returns that window's
// state and refill.
func (l *Limiter) claim(es []entry) (*state, *refill) {
	for i := range es {
		e := &es[i]
		if e.took || e.own != nil {
			continue
		}
		e.st.mu.Lock()
		rf := e.st.refill
		switch {
		case rf == nil:
			e.own = &refill{done: make(chan struct{})}
			e.st.refill = e.own
		case rf.unowned:
			// Made by the last call for the requests that came too late for
			// it (this one may be among them, counted already).
			rf.unowned = false
			if rf.prev != nil && rf.prev == e.waited {
				rf.waiters--
			}
			e.own, rf = rf, nil
		default:
			if rf.prev == nil || rf.prev != e.waited {
				rf.waiters++
			}
			e.waited = rf
		}
		e.st.mu.Unlock()
		if rf != nil {
			l.releaseClaims(es)
			return e.st, rf
		}
	}
	return nil, nil
}

// wait waits for the call of rf (a refill of st that counts this request)
// until the request's deadline, or, once the call is sent, until its answer
// (the call's own timeout bounds that). A request giving up before the call
// is sent takes itself out of it, so that no slot is asked for it.
func (l *Limiter) wait(st *state, rf *refill, deadline int64) bool {
	t := time.NewTimer(time.Duration(deadline - mono(time.Now())))
	defer t.Stop()
	select {
	case <-rf.done:
		return true
	case <-t.C:
	}
	st.mu.Lock()
	sent := rf.sent != 0
	if !sent {
		rf.waiters--
	}
	st.mu.Unlock()
	if !sent {
		return false
	}
	<-rf.done
	return true
}

// uncount takes a request that gives up out of the refills made for the
// late waiters of a call it waited for.
func (l *Limiter) uncount(es []entry) {
	for i := range es {
		e := &es[i]
		if e.waited == nil {
			continue
		}
		e.st.mu.Lock()
		if rf := e.st.refill; rf != nil && rf.prev == e.waited && rf.sent == 0 && rf.waiters > 0 {
			rf.waiters--
		}
		e.st.mu.Unlock()
		e.waited = nil
	}
}

// releaseClaims gives up the refills this request owns but will not make
// (their waiters wake and try again).
func (l *Limiter) releaseClaims(es []entry) {
	for i := range es {
		e := &es[i]
		if e.own == nil {
			continue
		}
		e.st.mu.Lock()
		if e.st.refill == e.own {
			e.st.refill = nil
		}
		e.st.mu.Unlock()
		close(e.own.done)
		e.own = nil
	}
}

// callWindow is one window of one script call.
type callWindow struct {
	w     *Window
	st    *state
	e     *entry // nil for a give-back only
	need  int
	extra int
	back  []span
	own   *refill
	res   windowResult
}

// shortTime is the spending time of slots asked for waiting requests: they
// are woken when the reply is in, which is a round trip after the call was
// sent (their deadline counts from then). A few smoothed round trips, at
// least 50ms; kept short because such a slot counts in its window that much
// longer than a slot spent at once.
func (l *Limiter) shortTime() time.Duration {
	return max(50*time.Millisecond, 4*time.Duration(l.rtt.Load())).Round(time.Millisecond)
}

// call is one script invocation: windows of one hash tag.
type call struct {
	short time.Duration // see shortTime; as prepared: a lower bound
	first bool          // slot 1 scored at now+short: the request needs other calls too
	tag   string
	keys  []string
	wins  []callWindow
	seq   uint64 // 0: not sent
	sent  int64  // mono ns
	res   callResult
	err   error
}

type windowResult struct {
	granted, remaining int
	full               bool
	reset              time.Duration
	back               time.Duration // -1: no leased slot may come back
}

type callResult struct {
	allowed  bool
	now      int64 // Redis µs
	admitted int   // slots 1..admitted of each window: this request and its waiters
}

// refillAndDecide asks Redis for every window still lacking a slot (one call
// per hash tag, pipelined), keeps the slots asked for waiters and leases,
// arms the negative cache of windows left full, and decides. done is false
// when the request must look again (a window of a refused call had room,
// or a slot it held ran out meanwhile).
//
// long: when the round took longer than the slots it held stay valid, the
// next round's slots are given at least twice its duration.
func (l *Limiter) refillAndDecide(rs *Rules, es []entry, deadline int64, long *time.Duration, lk *look) (done, allowed bool, retry time.Duration, err error) {
	calls := l.prepare(rs, es)
	for i := range calls {
		calls[i].first = len(calls) > 1
		calls[i].short = *long
	}
	start := time.Now()
	l.run(calls, deadline)
	m := mono(time.Now())
	for i := range calls {
		c := &calls[i]
		if c.err != nil && err == nil {
			err = c.err
		}
		for j := range c.wins {
			l.apply(c, &c.wins[j], m)
		}
	}
	if err != nil {
		return true, false, 0, err
	}
	// A window found full: a concurrent call may have left a slot meanwhile
	// (its waiters' slots, or a lease); and it is not full yet while slots
	// of it are held by undecided requests of this instance.
	full := false
	var held heldBy
	for i := range es {
		e := &es[i]
		if e.took || !e.violated {
			continue
		}
		e.st.mu.Lock()
		if sl, ok := e.st.take(m, &l.outstanding); ok {
			e.took, e.sl, e.violated = true, sl, false
		} else if h, ok := lk.held(e.st); ok {
			e.violated = false
			if held.st == nil {
				held = h
			}
		} else {
			full = true
			retry = max(retry, e.retry)
		}
		e.snap()
		e.st.mu.Unlock()
	}
	if full {
		l.putBack(es)
		return true, false, max(retry, time.Millisecond), nil
	}
	if held.st != nil {
		if err := l.waitSettled(es, held, deadline); err != nil {
			return true, false, 0, err
		}
		lk.ordered = true
		return false, false, 0, nil
	}
	for i := range es {
		if !es[i].took {
			return false, false, 0, nil
		}
	}
	if l.recheck(es) {
		return true, true, 0, nil
	}
	*long = max(*long, 2*time.Since(start))
	return false, false, 0, nil
}

// prepare groups the entries lacking a slot into calls by hash tag (the
// request's refill claims go with them).
func (l *Limiter) prepare(rs *Rules, es []entry) []call {
	var calls []call
	for i := range es {
		e := &es[i]
		if e.took {
			continue
		}
		tag := e.w.Policy
		if e.w.Kind == PerIP {
			tag = string(e.key)
		}
		ci := -1
		for k := range calls {
			if calls[k].tag == tag {
				ci = k
				break
			}
		}
		if ci < 0 {
			calls = append(calls, call{tag: tag})
			ci = len(calls) - 1
		}
		cw := callWindow{w: e.w, st: e.st, e: e, need: 1, own: e.own}
		e.own = nil
		e.st.mu.Lock()
		cw.back, e.st.back = e.st.back, nil
		if len(cw.back) > 0 {
			// Slots are being given back: a negative answer is stale.
			e.st.deniedUntil.Store(0)
		}
		switch {
		case e.st.wasted:
			e.st.want = max(1, e.st.want/2)
		case e.st.want < MaxLease:
			e.st.want = min(MaxLease, e.st.want*2)
		}
		e.st.wasted = false
		cw.extra = min(e.st.want-1, e.w.Limit-1)
		e.st.mu.Unlock()
		calls[ci].keys = append(calls[ci].keys, rs.Key(e.w, e.key))
		calls[ci].wins = append(calls[ci].wins, cw)
	}
	return calls
}

// maxFlushers: round trips in flight at once; maxBatch: calls per round
// trip; maxQueued: requests waiting for their calls to be sent (more: the
// limiter is overloaded, and the request is decided as on_redis_error says);
// flusherIdle: how long the flushers stay without work.
const (
	maxFlushers = 4
	maxBatch    = 256
	maxQueued   = 4096
	flusherIdle = 10 * time.Second
)

// batcher pipelines the calls of concurrent requests: requests queue their
// calls and wait; a pool of at most maxFlushers goroutines (started on
// demand, all ended when idle) sends what is queued, up to maxBatch calls per
// round trip. So a crowd of new clients costs a round trip per batch, not
// per client, never waits on a free connection of the pool, and a request
// never sends others' calls.
type batcher struct {
	queue    chan *job
	mu       sync.Mutex // guards flushers and the start and end of flushers
	flushers int
}

// Job states: queued until a flusher takes it or its request gives up.
const (
	jobQueued int32 = iota
	jobTaken
	jobCancelled
)

type job struct {
	calls []call
	state atomic.Int32
	done  chan struct{}
}

var errQueue = errors.New("limiter: call not sent before the request's deadline")

// run makes the calls through the batcher and returns when they are done,
// or with errQueue on every call when none was sent by deadline (mono ns).
func (l *Limiter) run(calls []call, deadline int64) {
	j := &job{calls: calls, done: make(chan struct{})}
	b := &l.batch
	b.mu.Lock()
	queued := false
	select {
	case b.queue <- j:
		queued = true
	default:
	}
	for queued && b.flushers < maxFlushers {
		b.flushers++
		go l.flusher()
	}
	b.mu.Unlock()
	if queued {
		t := time.NewTimer(time.Duration(deadline - mono(time.Now())))
		select {
		case <-j.done:
			t.Stop()
			return
		case <-t.C:
		}
		if !j.state.CompareAndSwap(jobQueued, jobCancelled) {
			<-j.done // being sent: the call's timeout bounds the wait
			return
		}
	}
	for i := range calls {
		calls[i].err = errQueue
	}
}

// flusher sends queued jobs until it has been idle for flusherIdle.
func (l *Limiter) flusher() {
	b := &l.batch
	idle := time.NewTimer(flusherIdle)
	defer idle.Stop()
	var jobs []*job
	var cs []*call
	var next *job // taken, but did not fit the last round trip
	for {
		j := next
		next = nil
		if j == nil {
			select {
			case j = <-b.queue:
			case <-idle.C:
				b.mu.Lock()
				if len(b.queue) == 0 {
					b.flushers--
					b.mu.Unlock()
					return
				}
				b.mu.Unlock()
				idle.Reset(flusherIdle)
				continue
			}
			if !j.state.CompareAndSwap(jobQueued, jobTaken) {
				continue
			}
		}
		jobs, cs = append(jobs[:0], j), cs[:0]
		for i := range j.calls {
			cs = append(cs, &j.calls[i])
		}
	more:
		for len(cs) < maxBatch {
			select {
			case j := <-b.queue:
				if !j.state.CompareAndSwap(jobQueued, jobTaken) {
					continue
				}
				if len(cs)+len(j.calls) > maxBatch {
					next = j
					break more
				}
				jobs = append(jobs, j)
				for i := range j.calls {
					cs = append(cs, &j.calls[i])
				}
			default:
				break more
			}
		}
		l.send(cs)
		for _, j := range jobs {
			close(j.done)
		}
		idle.Reset(flusherIdle)
	}
}

// maxNeed caps the requests one call admits for one window (a give-back
// range of a lost reply must stay within what the script accepts).
const maxNeed = 16384

// send makes the calls, pipelined in one round trip when there are several.
// Each call's waiters are counted in just before it is sent.
func (l *Limiter) send(calls []*call) {
	start := time.Now()
	if !l.br.allow(start) {
		l.m.skipped.Add(float64(len(calls)))
		for i := range calls {
			calls[i].err = errBreakerOpen
		}
		return
	}
	live := l.Live()
	argv := make([][]any, len(calls))
	short := l.shortTime()
	sent := mono(start)
	for i := range calls {
		c := calls[i]
		c.seq = l.seq.Add(1)
		c.short = max(short, c.short)
		first := 0
		if c.first {
			first = 1
		}
		args := make([]any, 0, 4+7*len(c.wins))
		args = append(args, l.id, c.seq, live, first)
		for j := range c.wins {
			cw := &c.wins[j]
			if cw.own != nil {
				cw.st.mu.Lock()
				cw.need = min(cw.need+cw.own.waiters, cw.w.Limit, maxNeed)
				cw.own.waiters = 0
				cw.own.sent = sent
				cw.st.mu.Unlock()
			}
			if cw.e == nil {
				cw.need, cw.extra = 0, 0
			}
			args = append(args, cw.w.Limit, max(1, cw.w.Length.Milliseconds()), cw.need, max(0, cw.extra),
				c.short.Milliseconds(), cw.w.Lease.Milliseconds(), formatSpans(cw.back))
		}
		argv[i] = args
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	cmds := make([]*redis.Cmd, len(calls))
	if len(calls) == 1 {
		cmds[0] = lua.RateLimit.Run(ctx, l.rdb, calls[0].keys, argv[0]...)
	} else {
		pipe := l.rdb.Pipeline()
		for i := range calls {
			cmds[i] = lua.RateLimit.EvalSha(ctx, pipe, calls[i].keys, argv[i]...)
		}
		_, _ = pipe.Exec(ctx)
		for i := range calls {
			// A flushed script cache: these calls did nothing, run them again.
			if err := cmds[i].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				cmds[i] = lua.RateLimit.Run(ctx, l.rdb, calls[i].keys, argv[i]...)
			}
		}
	}
	took := time.Since(start)
	l.m.latency.Observe(took.Seconds())
	if old := l.rtt.Load(); old == 0 {
		l.rtt.Store(int64(took))
	} else {
		l.rtt.Store(old + (int64(took)-old)/8)
	}
	var failed error
	for i := range calls {
		c := calls[i]
		c.sent = sent
		l.m.called.Add(1)
		vals, err := cmds[i].Int64Slice()
		if err == nil && len(vals) != 3+5*len(c.wins) {
			err = fmt.Errorf("%d values for %d windows", len(vals), len(c.wins))
		}
		if err != nil {
			c.err = fmt.Errorf("ratelimit call: %w", err)
			l.m.fail.Inc()
			if failed == nil {
				failed = c.err
			}
			continue
		}
		l.m.ok.Inc()
		c.res = callResult{allowed: vals[0] == 1, now: vals[1], admitted: int(vals[2])}
		for j := range c.wins {
			b := 3 + 5*j
			c.wins[j].res = windowResult{granted: int(vals[b]), full: vals[b+1] == 1, remaining: int(vals[b+2]),
				reset: time.Duration(vals[b+3]) * time.Millisecond, back: time.Duration(vals[b+4]) * time.Millisecond}
		}
	}
	if failed != nil {
		l.failed(failed)
	} else {
		l.succeeded()
	}
}

func (l *Limiter) failed(err error) {
	if l.br.failure(time.Now()) {
		l.log.Warn("redis limiter degraded: circuit open, rules fall back to on_redis_error", "err", err)
	}
}

func (l *Limiter) succeeded() {
	if l.br.success() {
		l.log.Info("redis limiter recovered: circuit closed")
	}
}

// formatSpans renders give-back ranges as the script reads them.
func formatSpans(sp []span) string {
	if len(sp) == 0 {
		return ""
	}
	var b strings.Builder
	for i, s := range sp {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatUint(s.seq, 10))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(s.idx))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(s.from))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(s.to))
	}
	return b.String()
}

// apply stores one window's answer: the request's own slot, the slots for
// waiters and the lease, the figures for the headers, the negative cache;
// then wakes the waiters. m is the local time after the reply.
func (l *Limiter) apply(c *call, cw *callWindow, m int64) {
	st := cw.st
	st.mu.Lock()
	defer st.mu.Unlock()
	idx := 1 + indexOf(c.wins, cw)
	if c.err != nil {
		// Nothing was decided: what was to be given back stays queued, and
		// so do the slots this call may have taken if only its reply was
		// lost (ZREM of members that do not exist is harmless) — except
		// slot 1, the request's own: if on_redis_error admits the request
		// it stays in the log (settle).
		st.back = append(cw.back, st.back...)
		if n := cw.need + cw.extra; c.seq != 0 && n > 0 {
			from := 1
			if e := cw.e; e != nil {
				e.lost, e.lostSp, from = true, span{c.seq, idx, 1, 1}, 2
			}
			if n >= from {
				st.back = append(st.back, span{c.seq, idx, from, n})
			}
		}
	} else {
		l.m.returned.Add(float64(spanSlots(cw.back)))
		g := cw.res
		st.remaining = g.remaining
		st.resetAt = time.Now().Add(g.reset)
		if g.reset == 0 {
			st.resetAt = time.Now().Add(cw.w.Length)
		}
		if g.remaining == 0 && g.reset > 0 {
			// Full as of the call: refused locally until the next slot frees,
			// measured from before the call was sent (never later than
			// Redis), and not past the earliest leased slot that its
			// instance may give back. Retry-After counts from the reply.
			until := c.sent + int64(g.reset)
			if g.back >= 0 {
				until = min(until, c.sent+int64(g.back))
			}
			st.deniedUntil.Store(until)
			st.retryAt = m + int64(g.reset)
		}
		if e := cw.e; e != nil {
			if g.granted > 0 {
				l.m.leaseSize.Observe(float64(g.granted))
				e.took, e.violated = true, false
				st.held.Add(1)
				// Slot 1 scored at the call's time is valid as this call's
				// decision only; scored at now+short it is valid that long.
				e.decisive = !c.first
				e.sl = slot{seq: c.seq, idx: idx, j: 1, until: c.sent, t0: c.res.now, sent: c.sent}
				if c.first {
					e.sl.until = c.sent + int64(c.short)
				}
				gn := min(c.res.admitted, g.granted)
				if gn >= 2 {
					st.addBatch(batch{seq: c.seq, idx: idx, from: 2, to: gn, until: c.sent + int64(c.short), t0: c.res.now, sent: c.sent})
				}
				if g.granted > gn {
					st.addBatch(batch{seq: c.seq, idx: idx, from: gn + 1, to: g.granted, until: c.sent + int64(cw.w.Lease), t0: c.res.now, sent: c.sent})
				}
				l.outstanding.Add(int64(g.granted - 1))
			} else if g.full {
				e.violated = true
				e.retry = g.reset
			}
		}
	}
	if cw.e != nil {
		cw.e.snap()
	}
	if cw.own != nil && st.refill == cw.own {
		st.refill = nil
		// Requests that began waiting after the call was sent were not asked
		// for: the next call (made by the first of them to look, or by any
		// newcomer) asks for all of them at once, unless the window is full.
		if late := cw.own.waiters; late > 0 && c.err == nil && cw.res.remaining > 0 {
			st.refill = &refill{done: make(chan struct{}), waiters: late, prev: cw.own, unowned: true}
		}
		close(cw.own.done)
	}
}

func indexOf(ws []callWindow, cw *callWindow) int {
	for i := range ws {
		if &ws[i] == cw {
			return i
		}
	}
	return -1
}

// traceAdmit reports the admitted request's windows to Config.Trace with
// the stamps of the admission moment (recheck).
func (l *Limiter) traceAdmit(es []entry) {
	for i := range es {
		e := &es[i]
		l.trace(e.w.Policy, string(e.key), e.stamp)
	}
}

var errBreakerOpen = errors.New("redis circuit breaker open")

// fallback decides es without Redis, rule by rule, as on_redis_error says.
// Slots still held are real and count (settle keeps them if it admits).
func (l *Limiter) fallback(d *Decision, es []entry, now time.Time, shadow bool) (bool, time.Duration) {
	live := l.Live()
	allowed := true
	var retry time.Duration
	for i := range es {
		e := &es[i]
		e.violated = false
		switch e.r.Mode {
		case ModeOpen:
		case ModeClosed:
			if !shadow {
				d.Outcome = Unavailable
			}
			e.violated = true
			allowed = false
			retry = max(retry, time.Second)
		case ModeLocal:
			lim := max(1, e.w.Limit/live)
			ok, wait := e.st.local(now, e.w.Length, lim)
			if !ok {
				e.violated = true
				allowed = false
				retry = max(retry, wait)
			}
		}
	}
	if !shadow {
		d.Degraded = true
		// Once per rule; a rule's windows are adjacent in es.
		for i := range es {
			if r := es[i].r; i == 0 || es[i-1].r != r {
				r.degraded.inc()
			}
		}
	}
	if allowed {
		// Count the admitted request in every local window (local() above only
		// checked): commit.
		for i := range es {
			e := &es[i]
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
