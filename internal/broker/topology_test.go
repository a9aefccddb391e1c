package broker

import (
	"context"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/servicetest"
)

// Order ids of one hot sale spread evenly over the partitions, always to
// the same one; with one partition everything is partition 0 and the names
// are those of the single queue.
func TestPartitionSpread(t *testing.T) {
	topo := TopologyFor(conf.RabbitMQ{Prefix: "x", Partitions: 3})
	counts := make([]int, 3)
	const n = 30000
	for range n {
		id := ordermsg.NewOrderID(42)
		p := topo.Partition(id)
		if p != topo.Partition(id) {
			t.Fatalf("order %s: partition not deterministic", id)
		}
		counts[p]++
	}
	for i, c := range counts {
		if c < n/3*95/100 || c > n/3*105/100 {
			t.Errorf("partition %d got %d of %d orders of one sale; want %d ±5%%", i, c, n, n/3)
		}
	}
	if got := topo.OrderQueues(); !reflect.DeepEqual(got, []string{"x.orders", "x.orders.p1", "x.orders.p2"}) {
		t.Errorf("queues %v", got)
	}
	one := TopologyFor(conf.RabbitMQ{Prefix: "x"})
	if one.Partitions != 1 || one.Partition("anything") != 0 || one.PartitionQueue(0) != "x.orders" || one.PartitionKey(0) != "order" {
		t.Errorf("one partition: %+v", one)
	}
}

// A publisher with 3 partitions puts each order into the queue of its
// partition; declaring again changes nothing; with partitions lowered to 1
// the other two queues are found as retired.
func TestPartitionedPublishAndRetired(t *testing.T) {
	t.Parallel()
	prefix := servicetest.AMQPPrefix(t, []string{".orders", ".orders.p1", ".orders.p2", ".orders.dead"}, testExchanges)
	rc := conf.Default().RabbitMQ
	rc.URL, rc.Prefix, rc.Partitions = servicetest.AMQPURL(), prefix, 3
	pub, err := NewPublisher(context.Background(), PublisherConfigFrom(rc, "test-"+prefix), slog.New(slog.DiscardHandler),
		NewPublisherMetrics(prometheus.NewRegistry(), "test"))
	servicetest.Must(t, err, "publisher")
	t.Cleanup(func() { _ = pub.Close() })
	topo := TopologyFor(rc)
	want := make([]int, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 60 {
		o := order(7)
		servicetest.Must(t, pub.Publish(ctx, o), "publish")
		want[topo.Partition(o.OrderID)]++
	}
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	servicetest.Must(t, topo.Declare(ch), "declare again")
	for i := range 3 {
		q, err := ch.QueueDeclarePassive(topo.PartitionQueue(i), true, false, false, false, nil)
		servicetest.Must(t, err, "inspect partition %d", i)
		if q.Messages != want[i] || want[i] == 0 {
			t.Errorf("partition %d holds %d messages, want %d (of 60)", i, q.Messages, want[i])
		}
	}
	rc.Partitions = 1
	retired, err := TopologyFor(rc).Retired(conn)
	servicetest.Must(t, err, "retired")
	if !reflect.DeepEqual(retired, []string{prefix + ".orders.p1", prefix + ".orders.p2"}) {
		t.Errorf("retired %v, want .p1 and .p2", retired)
	}
}
