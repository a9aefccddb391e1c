package backlog

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/brokertest"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	servicetest.Must(t, err, "gather")
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetValue() + "}"
			}
			out[key] = m.GetGauge().GetValue()
		}
	}
	return out
}

// Real RabbitMQ and Redis: 3 orders queued, 1 dead letter, 2 of 3
// reservations past their deadline.
func TestCollectorReadsQueuesAndOverdueReservations(t *testing.T) {
	rc, topo, ch := brokertest.Declare(t)
	brokertest.Publish(t, ch, topo.Exchange, topo.RoutingKey, 3)
	brokertest.Publish(t, ch, "", topo.DeadQueue, 1)

	rdb, prefix := servicetest.Redis(t)
	store := reservation.New(rdb, prefix)
	ctx := context.Background()
	now := time.Now()
	for _, id := range []int64{7, 8} {
		servicetest.Must(t, rdb.SAdd(ctx, reservation.ActiveSet(prefix), id).Err(), "sadd")
	}
	rdb.ZAdd(ctx, store.Keys(7).Deadlines, redis.Z{Score: float64(now.Add(-time.Minute).UnixMilli()), Member: "a"},
		redis.Z{Score: float64(now.Add(time.Hour).UnixMilli()), Member: "b"})
	rdb.ZAdd(ctx, store.Keys(8).Deadlines, redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: "c"})

	c := New(rdb, store, rc.URL, []string{topo.Queue, topo.DeadQueue}, 2*time.Second)
	t.Cleanup(c.Close)
	got := gather(t, c)
	want := map[string]float64{
		"seckill_queue_messages_ready{" + topo.Queue + "}":     3,
		"seckill_queue_messages_ready{" + topo.DeadQueue + "}": 1,
		"seckill_reservations_overdue":                         2,
		"seckill_backlog_up{rabbitmq}":                         1,
		"seckill_backlog_up{redis}":                            1,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}

	// A broker that cannot be reached is reported, not a failed scrape.
	bad := New(rdb, store, "amqp://guest:guest@127.0.0.1:1/", []string{topo.Queue}, time.Second)
	if got := gather(t, bad); got["seckill_backlog_up{rabbitmq}"] != 0 || got["seckill_reservations_overdue"] != 2 {
		t.Errorf("unreachable broker: %v", got)
	}
}
