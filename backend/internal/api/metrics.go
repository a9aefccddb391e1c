package api

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/internal/metrics"
)

// Metrics of the HTTP edge. A nil *Metrics records nothing.
type Metrics struct {
	requests      *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	adminFailures *prometheus.CounterVec
}

// NewMetrics registers the HTTP metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "seckill_backend", Subsystem: "http", Name: "requests_total",
			Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "seckill_backend", Subsystem: "http", Name: "request_seconds",
			Help: "Handler latency by route.", Buckets: metrics.LatencyBuckets,
		}, []string{"route"}),
		adminFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "seckill_backend", Subsystem: "admin", Name: "auth_failures_total",
			Help: "Admin requests refused: reason missing or invalid token, or limited (the source failed too often).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.requests, m.latency, m.adminFailures)
	return m
}

func (m *Metrics) adminFailure(reason string) {
	if m != nil {
		m.adminFailures.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) request(route string, status int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	if d > 0 {
		m.latency.WithLabelValues(route).Observe(d.Seconds())
	}
}
