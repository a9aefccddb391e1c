// Package broker holds what publishers and consumers of orders share: the
// RabbitMQ topology and its idempotent declaration.
package broker

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
)

// Topology names the exchanges and queues of one stack.
type Topology struct {
	// Exchange receives orders; Queue (quorum, durable) holds them for workers.
	Exchange, Queue, RoutingKey string
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
		DeadExchange:   c.Prefix + ".orders.dlx",
		DeadQueue:      c.Prefix + ".orders.dead",
		DeadRoutingKey: "dead",
		DeliveryLimit:  c.DeliveryLimit,
	}
}

// QueueNames and ExchangeNames list what Declare creates (tests delete them).
func (t Topology) QueueNames() []string    { return []string{t.Queue, t.DeadQueue} }
func (t Topology) ExchangeNames() []string { return []string{t.Exchange, t.DeadExchange} }

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
	if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, amqp.Table{
		amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
		"x-delivery-limit":          t.DeliveryLimit,
		"x-dead-letter-exchange":    t.DeadExchange,
		"x-dead-letter-routing-key": t.DeadRoutingKey,
	}); err != nil {
		return fmt.Errorf("declare queue %s: %w", t.Queue, err)
	}
	if err := ch.QueueBind(t.Queue, t.RoutingKey, t.Exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", t.Queue, err)
	}
	return nil
}

// DeadReasonHeader carries why a worker dead-lettered a message.
const DeadReasonHeader = "x-seckill-reason"
