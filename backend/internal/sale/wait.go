package sale

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/soldout"
)

// OrderWaitMax is the longest long-poll this service grants.
func (s *Service) OrderWaitMax() time.Duration { return s.cfg.OrderWaitMax }

// WaitOrder answers like Order, but while the order is pending it waits up to
// wait (bounded by Config.OrderWaitMax) for the worker's settlement, which
// wakes it through the order-event channel (WatchOrders). The settled answer
// is built from the pending record and the announced outcome, so waking
// costs no read; a waiter that cannot be registered (too many) or whose
// events may have been lost reads the order.
func (s *Service) WaitOrder(ctx context.Context, orderID string, wait time.Duration) (OrderView, error) {
	wait = min(wait, s.cfg.OrderWaitMax)
	if wait <= 0 {
		return s.Order(ctx, orderID)
	}
	w, ok := s.waiters.Add(orderID)
	if !ok {
		s.m.waited("full")
		return s.Order(ctx, orderID)
	}
	defer s.waiters.Remove(w)
	v, err := s.Order(ctx, orderID)
	if err != nil || v.Status != "pending" {
		s.m.waited("immediate")
		return v, err
	}
	s.m.waiting(1)
	defer s.m.waiting(-1)
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case r := <-w.C():
			if r.Recheck {
				if v, err = s.Order(ctx, orderID); err != nil || v.Status != "pending" {
					s.m.waited("settled")
					return v, err
				}
				continue
			}
			s.m.waited("settled")
			v.Status, v.Reason = "confirmed", ""
			if !r.Confirmed {
				v.Status, v.Reason = "failed", r.Reason
				if v.Reason == "" {
					v.Reason = "failed"
				}
			}
			return v, nil
		case <-t.C:
			s.m.waited("timeout")
			return s.Order(ctx, orderID)
		}
	}
}

// WatchOrders listens for settlements (one subscription for every waiter of
// this backend) until ctx ends.
func (s *Service) WatchOrders(ctx context.Context, rdb redis.UniversalClient, ready chan<- struct{}) {
	s.waiters.Watch(ctx, rdb, reservation.OrderChannel(s.store.Prefix()), s.log, ready)
}

// WatchStockEvents listens for news about activities (units given back,
// admin changes on any backend) until ctx ends: each clears the activity's
// sold-out flag, negative cache and cached state.
func (s *Service) WatchStockEvents(ctx context.Context, rdb redis.UniversalClient, ready chan<- struct{}) {
	soldout.Watch(ctx, rdb, reservation.Channel(s.store.Prefix()), s.log, ready, s)
}

// Changed forgets what this backend holds about activity id (a
// soldout.Listener).
func (s *Service) Changed(id int64) {
	now := time.Now()
	s.soldOut.Clear(id, now)
	s.missing.Clear(id, now)
	s.state.invalidate(id)
}

// Reset forgets everything: news may have been missed (a soldout.Listener).
func (s *Service) Reset() {
	s.soldOut.ClearAll()
	s.missing.ClearAll()
	s.state.invalidateAll()
}

// Waiters is the number of order long-polls registered now.
func (s *Service) Waiters() int { return s.waiters.Len() }
