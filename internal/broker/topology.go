// Package broker holds what publishers and consumers of orders share: the
// RabbitMQ topology and its idempotent declaration.
package broker

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
)

// Topology names the exchanges and queues of one stack.
type Topology struct {
	// Exchange receives orders; Queue (quorum, durable) holds them for
	// workers: partition 0 of Partitions (Queue and RoutingKey are the
	// names of the one queue of Partitions = 1, unchanged).
	Exchange, Queue, RoutingKey string
	// Partitions is the number of order queues; PartitionQueue(i) and
	// PartitionKey(i) name each.
	Partitions int
	// DeadExchange and DeadQueue hold messages that can never be processed, and
	// those redelivered more than DeliveryLimit times.
	DeadExchange, DeadQueue, DeadRoutingKey string
	DeliveryLimit                           int
}

// TopologyFor derives the names from the [rabbitmq] section.
func TopologyFor(c conf.RabbitMQ) Topology {
	return Topology{
		Exchange:       c.Prefix + ".orders",
		Queue:          c.Prefix + ".orders",
		RoutingKey:     "order",
		Partitions:     max(1, c.Partitions),
		DeadExchange:   c.Prefix + ".orders.dlx",
		DeadQueue:      c.Prefix + ".orders.dead",
		DeadRoutingKey: "dead",
		DeliveryLimit:  c.DeliveryLimit,
	}
}

// PartitionQueue names the queue of partition i.
func (t Topology) PartitionQueue(i int) string {
	if i == 0 {
		return t.Queue
	}
	return t.Queue + ".p" + strconv.Itoa(i)
}

// PartitionKey is the routing key that binds partition i's queue.
func (t Topology) PartitionKey(i int) string {
	if i == 0 {
		return t.RoutingKey
	}
	return t.RoutingKey + ".p" + strconv.Itoa(i)
}

// Partition is the partition of an order: by its id, so that one hot sale's
// orders spread over every queue (by activity, a hot sale would be stuck on
// one queue's ceiling). Any partition is correct for any order: workers
// process each order on its own, idempotently, so a re-publish that lands
// in another partition after a change of Partitions is one more duplicate
// delivery, absorbed like the others.
func (t Topology) Partition(orderID string) int {
	if t.Partitions <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(orderID))
	return int(h.Sum32() % uint32(t.Partitions))
}

// OrderQueues lists the queues of every partition.
func (t Topology) OrderQueues() []string {
	out := make([]string, t.Partitions)
	for i := range out {
		out[i] = t.PartitionQueue(i)
	}
	return out
}

// QueueNames and ExchangeNames list what Declare creates (tests delete them).
func (t Topology) QueueNames() []string    { return append(t.OrderQueues(), t.DeadQueue) }
func (t Topology) ExchangeNames() []string { return []string{t.Exchange, t.DeadExchange} }

// Retired lists the partition queues beyond Partitions that exist (left
// from a larger Partitions), up to conf.MaxPartitions. It uses a channel of its own: a passive declare of a
// missing queue closes the channel.
func (t Topology) Retired(conn *amqp.Connection) ([]string, error) {
	var out []string
	for i := t.Partitions; i < conf.MaxPartitions; i++ {
		ch, err := conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("open channel: %w", err)
		}
		q, err := ch.QueueDeclarePassive(t.PartitionQueue(i), true, false, false, false, nil)
		var ae *amqp.Error
		switch {
		case err == nil:
			_ = ch.Close()
			out = append(out, q.Name)
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			// closed by the broker
		default:
			return nil, fmt.Errorf("inspect queue %s: %w", t.PartitionQueue(i), err)
		}
	}
	return out, nil
}

// Declare creates the topology; it is idempotent, so whichever process starts
// first creates it and the others find it as it is.
func (t Topology) Declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(t.DeadExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", t.DeadExchange, err)
	}
	if _, err := ch.QueueDeclare(t.DeadQueue, true, false, false, false, amqp.Table{
		amqp.QueueTypeArg: amqp.QueueTypeQuorum,
	}); err != nil {
		return fmt.Errorf("declare queue %s: %w", t.DeadQueue, err)
	}
	if err := ch.QueueBind(t.DeadQueue, t.DeadRoutingKey, t.DeadExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", t.DeadQueue, err)
	}
	if err := ch.ExchangeDeclare(t.Exchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", t.Exchange, err)
	}
	for i := range t.Partitions {
		q := t.PartitionQueue(i)
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
			amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
			"x-delivery-limit":          t.DeliveryLimit,
			"x-dead-letter-exchange":    t.DeadExchange,
			"x-dead-letter-routing-key": t.DeadRoutingKey,
		}); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
		if err := ch.QueueBind(q, t.PartitionKey(i), t.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", q, err)
		}
	}
	return nil
}

// DeadReasonHeader carries why a worker dead-lettered a message.
const DeadReasonHeader = "x-seckill-reason"
