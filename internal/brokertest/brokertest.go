// Package brokertest gives a test its own order topology (exchanges and
// queues under a name prefix of its own, deleted when the test ends) on the
// shared RabbitMQ. It is apart from servicetest because it needs
// internal/broker, whose own tests use servicetest.
package brokertest

import (
	"context"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/servicetest"
)

// Prefix returns a [rabbitmq] prefix of the test's own: every queue and
// exchange broker.TopologyFor names under it is deleted when the test ends.
func Prefix(t testing.TB) string {
	t.Helper()
	const probe = "p"
	// Every partition queue a test may declare (rabbitmq.partitions).
	topo := broker.TopologyFor(conf.RabbitMQ{Prefix: probe, Partitions: conf.MaxPartitions})
	suffixes := func(names []string) []string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = strings.TrimPrefix(n, probe)
		}
		return out
	}
	return servicetest.AMQPPrefix(t, suffixes(topo.QueueNames()), suffixes(topo.ExchangeNames()))
}

// Declare declares the test's own topology on the shared broker and returns
// its configuration (the defaults, with the broker's URL and Prefix's
// prefix), the topology and a channel in confirm mode, closed at the end.
func Declare(t testing.TB) (conf.RabbitMQ, broker.Topology, *amqp.Channel) {
	t.Helper()
	rc := conf.Default().RabbitMQ
	rc.URL = servicetest.AMQPURL()
	rc.Prefix = Prefix(t)
	topo := broker.TopologyFor(rc)
	conn, err := amqp.Dial(rc.URL)
	servicetest.Must(t, err, "dial")
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	servicetest.Must(t, topo.Declare(ch), "declare")
	servicetest.Must(t, ch.Confirm(false), "confirm mode")
	return rc, topo, ch
}

// Publish sends n persistent `{}` messages to exchange with key (mandatory)
// and waits for the broker's confirm of each.
func Publish(t testing.TB, ch *amqp.Channel, exchange, key string, n int) {
	t.Helper()
	for range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, true, false,
			amqp.Publishing{Body: []byte(`{}`), DeliveryMode: amqp.Persistent})
		servicetest.Must(t, err, "publish")
		if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}
