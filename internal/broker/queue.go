package broker

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrNoQueue is returned by QueueProbe.Ready for a queue that does not exist.
var ErrNoQueue = errors.New("queue does not exist")

// QueueProbe reads queue depths with passive declares over a connection of
// its own, dialed when first needed and again after a failure (a failed
// declare closes its channel), to the next broker node when URL names
// several. Not safe for concurrent use.
type QueueProbe struct {
	// URL is [rabbitmq] url: one broker URL or several (conf.ParseAMQPURLs).
	URL   string
	nodes *Nodes
	conn  *amqp.Connection
	ch    *amqp.Channel
}

// Ready is the number of messages ready for delivery in queue name (AMQP
// cannot tell the unacknowledged ones).
func (q *QueueProbe) Ready(name string) (int, error) {
	if q.nodes == nil {
		n, err := ParseNodes(q.URL)
		if err != nil {
			return 0, err
		}
		q.nodes = n
	}
	if q.conn == nil || q.conn.IsClosed() {
		conn, err := q.nodes.Dial()
		if err != nil {
			return 0, fmt.Errorf("connect to rabbitmq: %w", err)
		}
		q.conn, q.ch = conn, nil
	}
	if q.ch == nil || q.ch.IsClosed() {
		ch, err := q.conn.Channel()
		if err != nil {
			q.Close()
			return 0, fmt.Errorf("open channel: %w", err)
		}
		q.ch = ch
	}
	st, err := q.ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return 0, fmt.Errorf("%w: %s", ErrNoQueue, name)
		}
		// A node that cannot answer (a queue without a leader, a node
		// paused in a partition): the next call asks the next node.
		q.Close()
		return 0, fmt.Errorf("inspect queue %s: %w", name, err)
	}
	return st.Messages, nil
}

// Close drops the connection; the next Ready dials again.
func (q *QueueProbe) Close() {
	if q.ch != nil {
		_ = q.ch.Close()
		q.ch = nil
	}
	if q.conn != nil {
		_ = q.conn.Close()
		q.conn = nil
	}
}
