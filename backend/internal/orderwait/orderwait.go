// Package orderwait holds the clients waiting for an order's result (long
// polls) and wakes them when the worker settles the order: settle.lua
// announces every settlement on one Redis pub/sub channel, and each backend
// listens with one subscription, whatever the number of waiters.
//
// A waiter costs a small fixed amount of memory (a Waiter, its channel and a
// map slot; see BenchmarkWaiterMemory) and the hub refuses waiters beyond its
// bound, so a flood of waiting clients cannot grow the backend without limit.
package orderwait

import (
	"context"
	"log/slog"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Result is a settlement as announced: the order's final state and reason.
type Result struct {
	Confirmed bool
	Reason    string
	// Recheck: no result known; the subscription was (re)made and events may
	// have been lost, so the waiter reads the order again.
	Recheck bool
}

// Waiter is one client waiting for one order.
type Waiter struct {
	orderID string
	c       chan Result
}

// C delivers the settlement (at most one value is buffered; a second wake of
// a waiter that has not read the first is dropped, the first is enough).
func (w *Waiter) C() <-chan Result { return w.c }

// Hub is the set of waiters of one backend.
type Hub struct {
	max int
	mu  sync.Mutex
	m   map[string][]*Waiter
	n   int
}

// NewHub bounds the waiters at max (≤ 0: 10,000).
func NewHub(max int) *Hub {
	if max <= 0 {
		max = 10_000
	}
	return &Hub{max: max, m: map[string][]*Waiter{}}
}

// Len is the number of waiters now.
func (h *Hub) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// Add registers a waiter for orderID; false when the hub is full. A caller
// adds before it reads the order, so a settlement between its read and its
// wait still reaches it.
func (h *Hub) Add(orderID string) (*Waiter, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n >= h.max {
		return nil, false
	}
	w := &Waiter{orderID: orderID, c: make(chan Result, 1)}
	h.m[orderID] = append(h.m[orderID], w)
	h.n++
	return w, true
}

// Remove unregisters w; safe to call once per Add.
func (h *Hub) Remove(w *Waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.m[w.orderID]
	for i, x := range ws {
		if x == w {
			ws[i] = ws[len(ws)-1]
			ws[len(ws)-1] = nil
			ws = ws[:len(ws)-1]
			h.n--
			break
		}
	}
	if len(ws) == 0 {
		delete(h.m, w.orderID)
	} else {
		h.m[w.orderID] = ws
	}
}

// Wake hands r to every waiter of orderID; it returns how many there were.
func (h *Hub) Wake(orderID string, r Result) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.m[orderID]
	for _, w := range ws {
		select {
		case w.c <- r:
		default:
		}
	}
	return len(ws)
}

// WakeAll asks every waiter to read its order again.
func (h *Hub) WakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ws := range h.m {
		for _, w := range ws {
			select {
			case w.c <- Result{Recheck: true}:
			default:
			}
		}
	}
}

// Deliver wakes the waiters of each settlement in one announcement (lines of
// "order_id|K|" or "order_id|F|reason"); lines it cannot read are skipped
// (their waiters read the order when their wait ends). It returns how many
// waiters it woke.
func (h *Hub) Deliver(payload string) int {
	n := 0
	for line := range strings.SplitSeq(payload, "\n") {
		id, rest, ok := strings.Cut(line, "|")
		if !ok || id == "" {
			continue
		}
		outcome, reason, ok := strings.Cut(rest, "|")
		if !ok || (outcome != "K" && outcome != "F") {
			continue
		}
		n += h.Wake(id, Result{Confirmed: outcome == "K", Reason: reason})
	}
	return n
}

// Watch delivers the announcements of channel until ctx ends; go-redis
// resubscribes after a lost connection, and every (re)subscription wakes all
// waiters to read their order again, since announcements sent meanwhile are
// lost. ready, when not nil, is closed once the first subscription is
// confirmed.
func (h *Hub) Watch(ctx context.Context, rdb redis.UniversalClient, channel string, log *slog.Logger, ready chan<- struct{}) {
	ps := rdb.Subscribe(ctx, channel)
	defer ps.Close()
	msgs := ps.ChannelWithSubscriptions(redis.WithChannelSize(4096))
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind != "subscribe" {
					continue
				}
				h.WakeAll()
				log.Debug("order events subscribed", "channel", m.Channel)
				if ready != nil {
					close(ready)
					ready = nil
				}
			case *redis.Message:
				h.Deliver(m.Payload)
			}
		}
	}
}
