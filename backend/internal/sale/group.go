package sale

import (
	"context"
	"fmt"
	"sync"

	"github.com/seckill/seckill/backend/internal/coalesce"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
)

// The group commit: concurrent purchases of one sale shard (equal
// reservation.Keys, as the purchase path computed them) are reserved in one
// script call (package coalesce gathers them; reserve_multi.lua checks each
// request on its own) and, with GroupBatch, the group's new reservations are
// published as one message; every purchase is answered only once the broker
// confirmed the message that carries its order. What follows a group's
// reserve is each purchase's own, as without groups: a failed publish of the
// batch is the failed publish of each of its orders (refused in MySQL when
// the message may have arrived, else undone in Redis), so exactly the orders
// of that message are released, each with its key, and a 503 keeps nothing.

// groupCall is one purchase's reserve in a group of its shard; runGroup
// fills in res and err, and msg when the order goes in the group's message.
type groupCall struct {
	r   PurchaseRequest
	req reservation.Request
	res reservation.Result
	err error
	msg *groupMessage
}

// groupMessage is the one message carrying the new orders of a group: the
// first of its purchases to publish sends it, the others wait for the same
// confirm.
type groupMessage struct {
	orders []ordermsg.Order
	once   sync.Once
	err    error
	// Once confirmed, the queued mark of each order (in one round trip).
	marked   []bool
	markErrs []error
}

// reserveIn reserves req through the group of its shard and returns its
// result, and the group's message when its order is carried by one.
func (s *Service) reserveIn(r PurchaseRequest, req reservation.Request) (reservation.Result, *groupMessage, error) {
	c := &groupCall{r: r, req: req}
	if err := s.groups.Do(req.Keys, c); err != nil {
		// The group's run panicked (a bug, logged once by groupPanicked):
		// any of its requests may have been reserved, so each is an error
		// its caller undoes, never a message sent.
		return reservation.Result{}, nil, err
	}
	return c.res, c.msg, c.err
}

// groupPanicked logs a group run that panicked (coalesce.OnPanic).
func (s *Service) groupPanicked(keys reservation.Keys, err *coalesce.PanicError) {
	s.log.Error("group reserve panicked; its purchases are answered 503 and undone", "meta", keys.Meta, "panic", err.Value, "stack", string(err.Stack))
}

// runGroup reserves a group of one shard in one call with its own Redis
// timeout. A group of one is reserve.lua as without groups. An error of the
// call is each request's: any of them may have been reserved (the caller
// undoes its own order id).
func (s *Service) runGroup(_ reservation.Keys, g []*groupCall) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RedisTimeout)
	defer cancel()
	s.m.grouped(len(g))
	if len(g) == 1 {
		g[0].res, g[0].err = s.store.Reserve(ctx, g[0].req)
		return
	}
	reqs := make([]reservation.Request, len(g))
	for i, c := range g {
		reqs[i] = c.req
	}
	res, errs, err := s.store.ReserveMulti(ctx, reqs)
	if s.afterGroupReserve != nil {
		s.afterGroupReserve(len(g))
	}
	for i, c := range g {
		if err != nil {
			c.err = err
			continue
		}
		c.res, c.err = res[i], errs[i]
	}
	if err != nil || !s.cfg.GroupBatch {
		return
	}
	var orders []ordermsg.Order
	for _, c := range g {
		if c.err == nil && c.res.Outcome == reservation.Reserved {
			orders = append(orders, s.orderOf(c.r, c.res.OrderID, c.r.Quantity, c.res.Deadline))
		}
	}
	if len(orders) < 2 {
		return // one order: its own message, as ever
	}
	m := &groupMessage{orders: orders}
	for _, c := range g {
		if c.err == nil && c.res.Outcome == reservation.Reserved {
			c.msg = m
		}
	}
}

// send publishes the group's message once, bounded by PublishTimeout, and
// returns its outcome to every purchase it carries; once confirmed, every
// order is marked queued in one round trip (mark has each one's outcome).
func (m *groupMessage) send(ctx context.Context, s *Service) error {
	m.once.Do(func() {
		if s.beforeGroupPublish != nil {
			s.beforeGroupPublish(m.orders)
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PublishTimeout)
		m.err = s.pub.PublishBatch(pctx, m.orders)
		cancel()
		if m.err != nil {
			return
		}
		ids := make([]string, len(m.orders))
		for i, o := range m.orders {
			ids[i] = o.OrderID
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RedisTimeout)
		defer cancel()
		m.marked, m.markErrs = s.store.MarkQueuedMany(rctx, m.orders[0].ActivityID, ids)
	})
	return m.err
}

// mark is the queued mark of order id of a confirmed message (send).
func (m *groupMessage) mark(id string) (bool, error) {
	for i, o := range m.orders {
		if o.OrderID == id {
			return m.marked[i], m.markErrs[i]
		}
	}
	return false, fmt.Errorf("order %s is not in its group's message", id)
}
