package limiter

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/internal/metrics"
)

// Metrics holds the limiter's Prometheus series (docs/limiter.md lists
// them) and the counts behind the per-decision gauge.
type Metrics struct {
	decisions *prometheus.CounterVec // rule, outcome: admitted|limited|shadow|degraded|shed
	windows   *prometheus.CounterVec // rule, window kind, outcome: admitted|refused
	fallbacks *prometheus.CounterVec // reason: timeout|error|breaker_open
	shed      *prometheus.CounterVec // reason: queue_full|wait_timeout
	latency   prometheus.Histogram
	batch     prometheus.Histogram

	ok, fail, skipped prometheus.Counter
	deniedHit         prometheus.Counter
	leaseHits         prometheus.Counter // windows decided from a lease
	leased, returned  prometheus.Counter // lease slots granted, given back unspent
	backDropped       prometheus.Counter // unspent lease slots left to slide out
	evicted           prometheus.Counter
	lateWaits         prometheus.Counter // bounds extended: this host woke the waiter late
	decided           atomic.Uint64      // decisions that needed the limiter
	called            atomic.Uint64      // script calls
	queued            atomic.Int64       // decisions waiting for a call
}

// NewMetrics registers the limiter's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v
	}
	m := &Metrics{
		decisions: vec("seckill_proxy_decisions_total", "Rate-limit decisions per rule.", "rule", "outcome"),
		windows: vec("seckill_proxy_window_decisions_total",
			"Admitted requests per window, and refused ones counted on the full window that refused them.", "rule", "window", "outcome"),
		fallbacks: vec("seckill_proxy_limiter_fallbacks_total",
			"Decisions made by on_redis_error, by why Redis could not decide: timeout, error, breaker_open.", "reason"),
		shed: vec("seckill_proxy_limiter_shed_total",
			"Decisions shed (503) because the limiter was overloaded: queue_full, wait_timeout (no answer within twice redis_timeout while Redis answered others or a PING).", "reason"),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seckill_proxy_redis_call_seconds",
			Help: "Latency of limiter round trips to Redis.", Buckets: metrics.LatencyBuckets}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seckill_proxy_limiter_batch_decisions",
			Help: "Decisions carried by one Redis round trip.", Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_client_states_evicted_total",
			Help: "Per-client negative-cache entries dropped to keep each rule within max_client_states."}),
	}
	calls := vec("seckill_proxy_redis_calls_total", "Limiter script calls to Redis by result.", "result")
	hits := vec("seckill_proxy_local_cache_hits_total", "Windows decided without Redis: denied (the negative cache), lease (a slot of this instance's lease).", "kind")
	reg.MustRegister(m.latency, m.batch, m.evicted)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "seckill_proxy_redis_calls_per_decision",
		Help: "Limiter script calls per decision since start."}, func() float64 {
		if d := m.decided.Load(); d > 0 {
			return float64(m.called.Load()) / float64(d)
		}
		return 0
	}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "seckill_proxy_limiter_queued",
		Help: "Decisions waiting for a Redis call now."}, func() float64 { return float64(m.queued.Load()) }))
	m.ok, m.fail, m.skipped = calls.WithLabelValues("ok"), calls.WithLabelValues("error"), calls.WithLabelValues("breaker_open")
	m.deniedHit, m.leaseHits = hits.WithLabelValues("denied"), hits.WithLabelValues("lease")
	m.leased = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_limiter_lease_slots_total",
		Help: "Window slots Redis leased to this instance (spent locally within 50ms, or left to slide out)."})
	m.returned = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_limiter_lease_slots_returned_total",
		Help: "Lease slots this instance gave back to Redis unspent."})
	m.backDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_limiter_lease_slots_unreturned_total",
		Help: "Unspent lease slots this instance could not give back (Redis failed, or too many queued): they count until they slide out."})
	m.lateWaits = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_limiter_late_waits_total",
		Help: "Decisions whose wait for Redis was extended because this host woke them more than redis_timeout late (a saturated host, not a slow Redis)."})
	reg.MustRegister(m.leased, m.returned, m.backDropped, m.lateWaits)
	return m
}

// Calls is the number of script calls made so far (tests, benchmarks).
func (m *Metrics) Calls() uint64 { return m.called.Load() }

// counterRef is a counter that may be absent (rules compiled without
// metrics, in tests).
type counterRef struct{ c prometheus.Counter }

func (c counterRef) inc() {
	if c.c != nil {
		c.c.Inc()
	}
}
