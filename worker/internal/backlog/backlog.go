// Package backlog exports, at scrape time, what waits to be done: order and
// dead-letter messages ready in RabbitMQ and reservations past their
// deadline (the sweeper's backlog). Dashboards and alert rules read these;
// nothing in the purchase path depends on them.
package backlog

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/reservation"
)

var (
	queueDesc = prometheus.NewDesc("seckill_queue_messages_ready",
		"Messages ready for delivery in a queue (orders, dead letters), read with a passive declare at scrape time.",
		[]string{"queue"}, nil)
	overdueDesc = prometheus.NewDesc("seckill_reservations_overdue",
		"Reservations past their deadline (Redis TIME) over all warmed sales: the sweeper's backlog.", nil, nil)
	upDesc = prometheus.NewDesc("seckill_backlog_up",
		"1 when the last scrape could read the source (rabbitmq, redis).", []string{"source"}, nil)
)

// Collector reads the backlog on every scrape, within Timeout.
type Collector struct {
	rdb     redis.Cmdable
	store   *reservation.Store
	queues  []string
	timeout time.Duration

	mu    sync.Mutex // one scrape at a time shares the probe
	probe *broker.QueueProbe
}

// New returns a collector for the sales of store (on rdb) and the queues,
// read over its own AMQP connection to amqpURL.
func New(rdb redis.Cmdable, store *reservation.Store, amqpURL string, queues []string, timeout time.Duration) *Collector {
	return &Collector{rdb: rdb, store: store, queues: queues, timeout: timeout, probe: &broker.QueueProbe{URL: amqpURL}}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueDesc
	ch <- overdueDesc
	ch <- upDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	up := 1.0
	for _, q := range c.queues {
		n, err := c.probe.Ready(q)
		if err != nil {
			c.probe.Close()
			up = 0
			break
		}
		ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, float64(n), q)
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up, "rabbitmq")

	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	n, err := c.overdue(ctx)
	up = 1
	if err != nil {
		up = 0
	} else {
		ch <- prometheus.MustNewConstMetric(overdueDesc, prometheus.GaugeValue, float64(n))
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up, "redis")
}

// overdue counts deadlines at or before Redis's clock over every warmed sale.
func (c *Collector) overdue(ctx context.Context) (int64, error) {
	now, err := c.rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	ids, err := c.store.Activities(ctx)
	if err != nil {
		return 0, err
	}
	max := strconv.FormatInt(now.UnixMilli(), 10)
	var cmds []*redis.IntCmd
	shards := make([]int, len(ids))
	for i, id := range ids {
		if shards[i], err = c.store.Shards(ctx, id); err != nil {
			return 0, err
		}
	}
	// Each shard's keys share one hash tag; separate commands, pipelined.
	_, err = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			for k := 0; k < shards[i]; k++ {
				cmds = append(cmds, p.ZCount(ctx, c.store.ShardKeys(id, k, shards[i]).Deadlines, "-inf", max))
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var n int64
	for _, cmd := range cmds {
		n += cmd.Val()
	}
	return n, nil
}

// Close drops the AMQP connection.
func (c *Collector) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.probe.Close()
}
