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
//
// A run that panics is recovered: every call of its group gets a
// *PanicError (the run may have done any part of its work), and the key's
// later calls go on as usual.
package coalesce

import (
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// PanicError is what Do returns to every call of a group whose run
// panicked.
type PanicError struct {
	Value any    // what the run panicked with
	Stack []byte // the run's stack at the panic
}

func (e *PanicError) Error() string { return fmt.Sprintf("coalesce: group run panicked: %v", e.Value) }

// Coalescer groups calls by key K; T is what one call hands to the group
// (typically a pointer the group's run fills in with the call's result).
type Coalescer[K comparable, T any] struct {
	max    int
	linger time.Duration
	run    func(key K, group []T)
	// panicked, when set (OnPanic), learns of each run that panicked, once.
	panicked func(key K, err *PanicError)

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
// ran: done, with err) or the group it is to run itself (it is in it).
type waiter[T any] struct {
	item T
	err  error // set by the group's leader before it sends nil
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
	if linger < 0 {
		linger = 0
	}
	return &Coalescer[K, T]{max: max, linger: linger, run: run, lanes: map[K]*lane[T]{}}
}

// OnPanic sets f to learn of every group run that panicked (once per
// group, on the goroutine that ran it); set it before the first Do.
func (c *Coalescer[K, T]) OnPanic(f func(key K, err *PanicError)) { c.panicked = f }

// Do runs item in a group of key and returns once that group's run returned:
// nil, or a *PanicError when the run panicked.
func (c *Coalescer[K, T]) Do(key K, item T) error {
	if c.max == 1 {
		return c.safeRun(key, []T{item})
	}
	w, _ := c.pool.Get().(*waiter[T])
	if w == nil {
		w = &waiter[T]{ch: make(chan []*waiter[T], 1)}
	}
	w.item = item
	defer func() {
		var zero T
		w.item, w.err = zero, nil
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
		return c.lead(key, l, []*waiter[T]{w}, w)
	}
	l.queue = append(l.queue, w)
	if len(l.queue) >= c.max || c.linger == 0 {
		g := c.take(l)
		c.mu.Unlock()
		return c.lead(key, l, g, w)
	}
	if len(l.queue) == 1 {
		l.queuedAt = time.Now()
		c.arm(key, l, c.linger)
	}
	c.mu.Unlock()
	if g := <-w.ch; g != nil {
		return c.lead(key, l, g, w)
	}
	return w.err
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

// safeRun runs one group, recovering a panic of run as a *PanicError.
func (c *Coalescer[K, T]) safeRun(key K, items []T) (err error) {
	defer func() {
		if v := recover(); v != nil {
			pe := &PanicError{Value: v, Stack: debug.Stack()}
			c.notify(key, pe)
			err = pe
		}
	}()
	c.run(key, items)
	return nil
}

// notify hands pe to OnPanic's function; a panic of that one is dropped,
// so the group's callers are still woken.
func (c *Coalescer[K, T]) notify(key K, pe *PanicError) {
	if c.panicked == nil {
		return
	}
	defer func() { _ = recover() }()
	c.panicked(key, pe)
}

// lead runs group g (self among it) on this goroutine, wakes its other
// callers, and hands the queue that built up meanwhile to the first of it.
// It returns the run's error (every caller of g gets it).
func (c *Coalescer[K, T]) lead(key K, l *lane[T], g []*waiter[T], self *waiter[T]) error {
	items := make([]T, len(g))
	for i, w := range g {
		items[i] = w.item
	}
	err := c.safeRun(key, items)
	for _, w := range g {
		if w != self {
			w.err = err
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
		return err
	}
	if l.running == 0 {
		if l.timer != nil {
			l.timer.Stop()
		}
		delete(c.lanes, key)
	}
	c.mu.Unlock()
	return err
}
