package sale

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/internal/backoff"
	"github.com/seckill/seckill/internal/metrics"
)

// Metrics of the purchase path. A nil *Metrics records nothing.
type Metrics struct {
	reservations *prometheus.CounterVec
	reserveTime  prometheus.Histogram
	purchases    *prometheus.CounterVec
	rebuilds     *prometheus.CounterVec
	stateReads   map[string]prometheus.Counter
	waits        *prometheus.CounterVec
	waiters      prometheus.Gauge
	undos        *prometheus.CounterVec
	groupSize    prometheus.Histogram
	retry        *backoff.Metrics // the background retries, by site
}

// stateReadResults label the sale-state reads: answered from the cache,
// joined a flight, started one, fell back to MySQL, answered stale.
var stateReadResults = []string{"hit", "joined", "miss", "fallback", "stale"}

// NewMetrics registers the service's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reservations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "seckill_backend", Name: "reservations_total",
			Help: "Reservation attempts by result (reserve.lua outcome, or sold_out_cached / not_found_cached / error).",
		}, []string{"result"}),
		reserveTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "seckill_backend", Name: "reserve_seconds",
			Help: "Latency of one reserve.lua call.", Buckets: metrics.LatencyBuckets,
		}),
		purchases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "seckill_backend", Name: "publish_outcomes_total",
			Help: "Reserved purchases by what followed the publish: accepted, adopted (a replay published an unconfirmed order), adopted_in_flight (its first request is still publishing it), queued_mark_failed (accepted; the queued mark is retried in the background: queued_mark_gave_up, queued_mark_skipped), released (nothing queued, undone: 503), released_later (nothing queued, Redis down: 503, undone in the background), failed_in_mysql (the message may have arrived: refused in MySQL first, 503), accepted_claimed (a worker or a replay had it: 202), accepted_unsettled (the message may have arrived and MySQL is unreachable: 202, a worker or the sweeper decides)",
		}, []string{"outcome"}),
		rebuilds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "seckill_backend", Name: "rebuilds_total",
			Help: "Rebuilds of a sale missing in Redis, by warm outcome (or not_found, error).",
		}, []string{"result"}),
		undos: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "seckill_backend", Name: "undos_total",
			Help: "Background undos of reserves that failed (the reserve may have run), by the answer: released, claimed/confirmed/failed (a keyed retry took the order over), gave_up (deadline reached or shutdown; the sweeper expires it), skipped (too many at once; the sweeper expires it).",
		}, []string{"result"}),
	}
	m.groupSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "seckill_backend", Name: "reserve_group_size",
		Help:    "Purchases of one sale shard reserved in one script call (the group commit; 1: a purchase that found its shard idle).",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
	})
	reads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "seckill_backend", Name: "sale_state_reads_total",
		Help: "Sale-state reads by result: hit (local cache), joined (a flight in progress), miss (started a flight), fallback (the flight read MySQL), stale (answered the last known state).",
	}, []string{"result"})
	m.stateReads = map[string]prometheus.Counter{}
	for _, r := range stateReadResults {
		m.stateReads[r] = reads.WithLabelValues(r)
	}
	m.waits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "seckill_backend", Name: "order_waits_total",
		Help: "Order long-polls by how they ended: settled (woken with a final status), timeout (still pending at the end of the wait), immediate (not pending when asked), full (too many waiters: answered at once).",
	}, []string{"outcome"})
	m.waiters = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "seckill_backend", Name: "order_waiters",
		Help: "Order long-polls waiting now.",
	})
	m.retry = backoff.NewMetrics(reg)
	reg.MustRegister(m.reservations, m.reserveTime, m.purchases, m.rebuilds, reads, m.waits, m.waiters, m.undos, m.groupSize)
	return m
}

func (m *Metrics) reserved(result string, d time.Duration) {
	if m == nil {
		return
	}
	m.reservations.WithLabelValues(result).Inc()
	if d > 0 {
		m.reserveTime.Observe(d.Seconds())
	}
}

func (m *Metrics) purchased(outcome string) {
	if m != nil {
		m.purchases.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) rebuilt(result string, err error) {
	if m == nil {
		return
	}
	if err != nil {
		result = "error"
	}
	m.rebuilds.WithLabelValues(result).Inc()
}

func (m *Metrics) stateRead(result string) {
	if m != nil {
		m.stateReads[result].Inc()
	}
}

func (m *Metrics) waited(outcome string) {
	if m != nil {
		m.waits.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) waiting(delta float64) {
	if m != nil {
		m.waiters.Add(delta)
	}
}

func (m *Metrics) undone(result string) {
	if m != nil {
		m.undos.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) grouped(n int) {
	if m != nil {
		m.groupSize.Observe(float64(n))
	}
}

// retries counts the service's background retries (nil: not counted).
func (m *Metrics) retries() *backoff.Metrics {
	if m == nil {
		return nil
	}
	return m.retry
}
