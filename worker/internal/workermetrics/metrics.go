// Package workermetrics is the metrics struct of the worker: one instance per
// process, built on the process's registry by main and handed to the packages
// that count.
package workermetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/internal/backoff"
	"github.com/seckill/seckill/internal/metrics"
)

// Outcome labels of Orders.
const (
	OutcomeConfirmed   = "confirmed"
	OutcomeRedelivered = "redelivered" // already in MySQL: skipped, stored outcome reported
	// Failed orders are labelled with their reason (sold_out, limit_exceeded,
	// released, activity_not_found).
)

// Retry causes.
const (
	CauseDeadlock  = "deadlock"
	CauseLockWait  = "lock_wait_timeout"
	CauseDuplicate = "duplicate_key"
	CauseMySQL     = "mysql"
	CauseRedis     = "redis"
	CauseSettle    = "settle"
)

// Dead-letter routes.
const (
	DeadPublished = "published" // republished to the dead exchange with a reason, confirmed
	DeadRejected  = "rejected"  // that publish failed: nack(requeue=false), the queue's DLX took it
)

// Metrics of one worker process.
type Metrics struct {
	Deliveries   prometheus.Counter
	Batches      prometheus.Counter
	BatchSize    prometheus.Histogram
	Orders       *prometheus.CounterVec // outcome
	TxSeconds    prometheus.Histogram
	Splits       prometheus.Counter
	Retries      *prometheus.CounterVec // cause
	DeadLettered *prometheus.CounterVec // route
	Reconnects   prometheus.Counter
	Node         *prometheus.GaugeVec // node: 1 for the broker node consumed from
	Retry        *backoff.Metrics     // every retry loop's waits, by site
}

// New registers the worker's metrics on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Deliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seckill_worker_deliveries_total",
			Help: "Messages received from the order queue, redeliveries included.",
		}),
		Batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seckill_worker_batches_total",
			Help: "Per-activity batches committed to MySQL.",
		}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seckill_worker_batch_size",
			Help:    "Orders per committed per-activity batch.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000},
		}),
		Orders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seckill_worker_orders_total",
			Help: "Orders decided, by outcome (confirmed, redelivered, or the failure reason).",
		}, []string{"outcome"}),
		TxSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seckill_worker_tx_seconds",
			Help:    "Latency of one MySQL batch transaction attempt, begin to commit or rollback.",
			Buckets: metrics.LatencyBuckets,
		}),
		Splits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seckill_worker_batch_splits_total",
			Help: "Batches rolled back and split because the stock guard failed.",
		}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seckill_worker_retries_total",
			Help: "Retried transactions and Redis calls, by cause.",
		}, []string{"cause"}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seckill_worker_dead_lettered_total",
			Help: "Messages that could not be parsed or were invalid, sent to the dead-letter queue.",
		}, []string{"route"}),
		Reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seckill_worker_amqp_reconnects_total",
			Help: "AMQP sessions started after a lost connection or failed dial.",
		}),
		Node: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seckill_worker_amqp_node",
			Help: "1 for the broker node (host:port of [rabbitmq] url) the consumer is connected to; none between sessions.",
		}, []string{"node"}),
	}
	m.Retry = backoff.NewMetrics(reg)
	reg.MustRegister(m.Deliveries, m.Batches, m.BatchSize, m.Orders, m.TxSeconds, m.Splits,
		m.Retries, m.DeadLettered, m.Reconnects, m.Node)
	return m
}
