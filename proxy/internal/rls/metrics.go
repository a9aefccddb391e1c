package rls

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/internal/metrics"
)

// Metrics are the rate-limit service's series (docs/envoy.md lists them);
// the Redis calls, batches, sheds and breaker are the limiter's, shared
// with the HTTP edge.
type Metrics struct {
	requests    *prometheus.CounterVec // outcome: ok|over_limit|shadow|invalid|unavailable
	descriptors *prometheus.CounterVec // domain, descriptor, outcome
	unmatched   *prometheus.CounterVec // kind: domain|descriptor
	fallbacks   *prometheus.CounterVec // mode: local|open|closed|envoy
	nearLimit   *prometheus.CounterVec // domain, descriptor
	cached      prometheus.Counter

	unmatchedDomain, unmatchedDescriptor prometheus.Counter
	reloads                              *prometheus.CounterVec // result: ok|error
	domains                              prometheus.Gauge
	latency                              prometheus.Histogram
}

// NewMetrics registers the service's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v
	}
	m := &Metrics{
		requests: vec("seckill_proxy_rls_requests_total",
			"ShouldRateLimit calls by answer: ok, over_limit, shadow (over the limit, answered OK by rls_shadow_mode), invalid (InvalidArgument), unavailable (UNAVAILABLE: shed, or rls_on_redis_error = envoy).", "outcome"),
		descriptors: vec("seckill_proxy_rls_descriptors_total",
			"Descriptors with a limit, by the limit's path in the file (request values with detailed_metric) and outcome: within, over, shadow_over, unlimited, replaced, degraded.", "domain", "descriptor", "outcome"),
		unmatched: vec("seckill_proxy_rls_unmatched_total",
			"Answered OK with no limit: an unknown domain (per call) or a descriptor no limit matches.", "kind"),
		nearLimit: vec("seckill_proxy_rls_near_limit_hits_total",
			"Admitted hits that took a window past rls_near_limit_ratio of its limit (the reference server's near_limit), by the limit's path as in seckill_proxy_rls_descriptors_total.", "domain", "descriptor"),
		fallbacks: vec("seckill_proxy_rls_fallbacks_total",
			"Descriptor groups decided by rls_on_redis_error because the store failed.", "mode"),
		cached: prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_rls_cached_over_total",
			Help: "Descriptor groups refused from the negative cache, without a store call."}),
		reloads: vec("seckill_proxy_rls_config_reloads_total", "Configuration loads by result: ok, error (the running one kept).", "result"),
		domains: prometheus.NewGauge(prometheus.GaugeOpts{Name: "seckill_proxy_rls_config_domains",
			Help: "Domains in the running configuration."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seckill_proxy_rls_decision_seconds",
			Help: "Time to answer one ShouldRateLimit call.", Buckets: metrics.LatencyBuckets}),
	}
	reg.MustRegister(m.cached, m.domains, m.latency)
	m.unmatchedDomain, m.unmatchedDescriptor = m.unmatched.WithLabelValues("domain"), m.unmatched.WithLabelValues("descriptor")
	return m
}
