// Package coalesce gathers concurrent calls of one key into groups that run
// as one (the backend's group commit: the purchases of one sale shard
// reserved in one script call and published as one message).
//
// The linger adapts to the load. A call that finds its key idle runs at
// once, alone, on its own goroutine: idle latency does not grow. Calls that
// arrive while a group of their key is running queue up and go together
// ("natural batching") as soon as that group ends, when the queue holds Max
// calls, or Linger after the first of them queued, whichever comes first —
// so a slow group (a slow Redis) delays the next by Linger at most, and
// groups of one key may then run side by side. A group runs on the
// goroutine of one of its callers: no goroutine is started per group.
package coalesce

import (
	"sync"
	"time"
)

// Coalescer groups calls by key K; T is what one call hands to the group
// (typically a pointer the group's run fills in with the call's result).
type Coalescer[K comparable, T any] struct {
	max    int
	linger time.Duration
	run    func(key K, group []T)

	mu    sync.Mutex
	lanes map[K]*lane[T]
	pool  sync.Pool // of *waiter[T]
}

// lane is the state of one key: groups running, and the calls queued for
// the next group.
type lane[T any] struct {
	running  int
	queue    []*waiter[T]
	queuedAt time.Time // when the first call of queue arrived
	timer    *time.Timer
}

// waiter is one call waiting in a queue: it is sent either nil (its group
// ran: done) or the group it is to run itself (it is in it).
type waiter[T any] struct {
	item T
	ch   chan []*waiter[T]
}

// New returns a coalescer running each group with run(key, group), group in
// the order the calls arrived. max bounds a group (1: every call runs alone);
// linger bounds the wait of a queued call for a running group to end (0: no
// wait: a call arriving while a group runs starts its own).
func New[K comparable, T any](max int, linger time.Duration, run func(key K, group []T)) *Coalescer[K, T] {
	if max < 1 {
		max = 1
	}
	return &Coalescer[K, T]{max: max, linger: max0(linger), run: run, lanes: map[K]*lane[T]{}}
}

func max0(d time.Duration) time.Duration { return max(d, 0) }

// Do runs item in a group of key and returns once that group's run returned.
func (c *Coalescer[K, T]) Do(key K, item T) {
	if c.max == 1 {
		c.run(key, []T{item})
		return
	}
	w, _ := c.pool.Get().(*waiter[T])
	if w == nil {
		w = &waiter[T]{ch: make(chan []*waiter[T], 1)}
	}
	w.item = item
	defer func() {
		var zero T
		w.item = zero
		c.pool.Put(w)
	}()
	c.mu.Lock()
	l := c.lanes[key]
	if l == nil {
		l = &lane[T]{}
		c.lanes[key] = l
	}
	if l.running == 0 && len(l.queue) == 0 {
		// Idle: at once, alone.
		l.running++
		c.mu.Unlock()
		c.lead(key, l, []*waiter[T]{w}, w)
		return
	}
	l.queue = append(l.queue, w)
	if len(l.queue) >= c.max || c.linger == 0 {
		g := c.take(l)
		c.mu.Unlock()
		c.lead(key, l, g, w)
		return
	}
	if len(l.queue) == 1 {
		l.queuedAt = time.Now()
		c.arm(key, l, c.linger)
	}
	c.mu.Unlock()
	if g := <-w.ch; g != nil {
		c.lead(key, l, g, w)
	}
}

// Queued reports how many calls of key wait for a group now.
func (c *Coalescer[K, T]) Queued(key K) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.lanes[key]; l != nil {
		return len(l.queue)
	}
	return 0
}

// arm starts l's linger timer to fire in d. Caller holds mu.
func (c *Coalescer[K, T]) arm(key K, l *lane[T], d time.Duration) {
	if l.timer == nil {
		l.timer = time.AfterFunc(d, func() { c.expire(key, l) })
		return
	}
	l.timer.Reset(d)
}

// expire sends l's queue when its first call has waited linger. A timer of
// a queue taken meanwhile finds the next queue younger: it waits for the rest
// of that one's linger.
func (c *Coalescer[K, T]) expire(key K, l *lane[T]) {
	c.mu.Lock()
	if len(l.queue) == 0 {
		c.mu.Unlock()
		return
	}
	if left := c.linger - time.Since(l.queuedAt); left > 0 {
		c.arm(key, l, left)
		c.mu.Unlock()
		return
	}
	g := c.take(l)
	c.mu.Unlock()
	g[0].ch <- g
}

// take empties l's queue (at most max calls) into a group that is running
// from now on. Caller holds mu.
func (c *Coalescer[K, T]) take(l *lane[T]) []*waiter[T] {
	n := min(len(l.queue), c.max)
	g := make([]*waiter[T], n)
	copy(g, l.queue)
	rest := copy(l.queue, l.queue[n:])
	clear(l.queue[rest:])
	l.queue = l.queue[:rest]
	if rest > 0 {
		l.queuedAt = time.Now()
	}
	l.running++
	return g
}

// lead runs group g (self among it) on this goroutine, wakes its other
// callers, and hands the queue that built up meanwhile to the first of it.
func (c *Coalescer[K, T]) lead(key K, l *lane[T], g []*waiter[T], self *waiter[T]) {
	items := make([]T, len(g))
	for i, w := range g {
		items[i] = w.item
	}
	c.run(key, items)
	for _, w := range g {
		if w != self {
			w.ch <- nil
		}
	}
	c.mu.Lock()
	l.running--
	if len(l.queue) > 0 {
		next := c.take(l)
		if len(l.queue) == 0 && l.timer != nil {
			l.timer.Stop()
		}
		c.mu.Unlock()
		next[0].ch <- next
		return
	}
	if l.running == 0 {
		if l.timer != nil {
			l.timer.Stop()
		}
		delete(c.lanes, key)
	}
	c.mu.Unlock()
}
