package broker

import (
	"context"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ConfirmChannel is an AMQP channel in confirm mode whose publishes are
// mandatory, so that the broker answers each one: acked, nacked, or returned
// as unroutable (the return arrives before the ack of the same message). It
// matches returns to their publish by message id. The order publisher, the
// worker's dead-letterer and the bench's publish ceiling all publish on one.
type ConfirmChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return

	// mu guards pending, strays and every receive from returns, so that a
	// waiter that drains under mu sees every return the broker sent before
	// its ack.
	mu      sync.Mutex
	pending map[string]*inflight
	strays  int // returns of no tracked publish since the last Strays
}

type inflight struct {
	returned bool
	ret      amqp.Return
}

// NewConfirmChannel puts ch in confirm mode; up to returnsBuffer returns
// wait there for their publish's confirm. amqp091 hands a return to its
// listener with a blocking send bounded by 5 s on the connection's reader
// goroutine: every caller that receives its confirm drains the buffer.
func NewConfirmChannel(ch *amqp.Channel, returnsBuffer int) (*ConfirmChannel, error) {
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("amqp confirm mode: %w", err)
	}
	return &ConfirmChannel{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, returnsBuffer)),
		pending: make(map[string]*inflight)}, nil
}

// OpenConfirmChannel opens a channel on conn in confirm mode (NewConfirmChannel).
func OpenConfirmChannel(conn *amqp.Connection, returnsBuffer int) (*ConfirmChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqp channel: %w", err)
	}
	c, err := NewConfirmChannel(ch, returnsBuffer)
	if err != nil {
		_ = ch.Close()
		return nil, err
	}
	return c, nil
}

// Channel is the underlying channel (to declare, or to count a queue).
func (c *ConfirmChannel) Channel() *amqp.Channel { return c.ch }

// IsClosed reports whether the channel is closed.
func (c *ConfirmChannel) IsClosed() bool { return c.ch.IsClosed() }

// Close closes the channel; its unanswered publishes are nacked.
func (c *ConfirmChannel) Close() error { return c.ch.Close() }

// Track records id as a publish awaiting its answer, so that a return of it
// is kept for Done. False when a publish of the same id is awaiting its own:
// the two returns could not be told apart.
func (c *ConfirmChannel) Track(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.pending[id]; dup {
		return false
	}
	c.pending[id] = &inflight{}
	return true
}

// Publish writes msg to exchange with key, mandatory, and hands back the
// broker's deferred answer.
func (c *ConfirmChannel) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) (*amqp.DeferredConfirmation, error) {
	return c.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
}

// Done ends the tracking of id once its confirm arrived and reports whether
// the broker returned it, with the return.
func (c *ConfirmChannel) Done(id string) (amqp.Return, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drainLocked()
	e := c.pending[id]
	delete(c.pending, id)
	if e == nil || !e.returned {
		return amqp.Return{}, false
	}
	return e.ret, true
}

// Forget ends the tracking of id without its answer (the caller gave up);
// a later return of it counts as a stray.
func (c *ConfirmChannel) Forget(id string) {
	c.mu.Lock()
	c.drainLocked()
	delete(c.pending, id)
	c.mu.Unlock()
}

// Strays drains the buffered returns and reports, and resets, how many
// returns belonged to no tracked publish: for a caller that does not track
// ids, any return; for one that does, late returns of publishes given up.
func (c *ConfirmChannel) Strays() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drainLocked()
	n := c.strays
	c.strays = 0
	return n
}

// Pending counts the tracked publishes awaiting their answer.
func (c *ConfirmChannel) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// drainLocked moves every buffered return to its pending entry; returns of
// messages nobody waits for any more are counted as strays. Caller holds mu.
func (c *ConfirmChannel) drainLocked() {
	for {
		select {
		case r, ok := <-c.returns:
			if !ok {
				return
			}
			if e := c.pending[r.MessageId]; e != nil {
				e.returned, e.ret = true, r
			} else {
				c.strays++
			}
		default:
			return
		}
	}
}

// Send publishes msg (its MessageId tracked) and waits for the broker's
// answer within ctx: nil when acked, else ErrDuplicate, ErrReturned,
// ErrNacked, or the error of the write or of the wait. For callers that
// publish a message and wait for it, one at a time per message id.
func (c *ConfirmChannel) Send(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	id := msg.MessageId
	if !c.Track(id) {
		return fmt.Errorf("publish to %s: %w", exchange, ErrDuplicate)
	}
	dc, err := c.Publish(ctx, exchange, key, msg)
	if err != nil {
		c.Forget(id)
		return fmt.Errorf("publish to %s: %w", exchange, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		c.Forget(id)
		return fmt.Errorf("confirm of publish to %s: %w", exchange, err)
	}
	r, returned := c.Done(id)
	switch {
	case !acked:
		return fmt.Errorf("publish to %s: %w", exchange, ErrNacked)
	case returned:
		return fmt.Errorf("publish to %s: %w: %d %s", exchange, ErrReturned, r.ReplyCode, r.ReplyText)
	}
	return nil
}
