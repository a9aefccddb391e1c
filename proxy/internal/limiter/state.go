package limiter

import (
	"sync"
	"sync/atomic"
	"time"
)

// clockBase anchors mono: times kept in atomics are monotonic nanoseconds
// since process start, so wall-clock steps cannot shift them.
var clockBase = time.Now()

// mono is t (taken with time.Now) as monotonic nanoseconds since clockBase.
func mono(t time.Time) int64 { return int64(t.Sub(clockBase)) }

// state is the local view of one window (a rule's global window, or one
// client's per-client window): leased slots, slots to give back, the negative
// cache, the last figures Redis gave, the refill in flight, and the
// in-process counter used while Redis is unreachable. mu guards all but the
// atomics.
type state struct {
	mu          sync.Mutex
	batches     []batch      // leased slots not yet spent
	back        []span       // slots not spent: removed from the log in the next call for this key
	want        int          // speculative slots to ask for next time (adaptive)
	wasted      bool         // a lease expired with slots left since the last call
	refill      *refill      // the call in flight for this window, if any
	deniedUntil atomic.Int64 // negative cache: full until then (mono ns); read without mu
	retryAt     int64        // when the next slot frees as of the last reply (mono ns): Retry-After
	remaining   int          // free slots after the last call
	resetAt     time.Time    // when the next slot frees, as of the last call
	lastUse     atomic.Int64 // mono ns; stored under (at least) the table shard's read lock
	users       atomic.Int32 // requests between table.get and the end of their Check

	// Slots of this window taken by requests of this instance that are not
	// decided yet: each is spent or put back soon. A window Redis reports
	// full while some are held is not full yet (awaitSettled).
	held    atomic.Int32
	settled atomic.Uint32 // held slots decided so far (a generation)
	waiting atomic.Int32  // requests in awaitSettled
	wake    chan struct{} // closed when a held slot is decided while some wait; under mu

	// in-process sliding-window counter (two fixed buckets, weighted)
	locStart      time.Time
	locPrev, locN int
}

// batch is a run of leased slots of one call: members seq:idx:from..to are
// in the window's log, scored at the end of their spending time; until is
// that end in local monotonic time (measured from before the call was sent,
// so never later than the score). t0 and sent map local time to Redis time
// for Trace.
type batch struct {
	seq           uint64
	idx, from, to int
	until         int64 // mono ns
	t0            int64 // Redis time of the granting call, µs
	sent          int64 // mono ns when that call was sent
}

// span names members seq:idx:from..to of this instance.
type span struct {
	seq           uint64
	idx, from, to int
}

// refill is one call for a window; requests that need the same window wait
// for it instead of calling too, and the caller asks for their slots.
type refill struct {
	done    chan struct{}
	waiters int
	sent    int64 // mono ns when the call was sent (waiters counted in); 0 before
	// unowned: made by the call before (prev) for its late waiters; the
	// first request to find it makes the call.
	unowned bool
	prev    *refill
}

func newState() *state { return &state{want: 1} }

// take takes one leased slot valid at m (mono ns), earliest deadline first;
// expired batches move to back. The request is admitted later (recheck),
// while the slot is still valid, or it puts the slot back. st.mu held.
func (s *state) take(m int64, out *atomic.Int64) (slot, bool) {
	best := -1
	for i := 0; i < len(s.batches); {
		b := &s.batches[i]
		if m >= b.until {
			s.giveBack(span{b.seq, b.idx, b.from, b.to}, out)
			s.wasted = true
			s.batches = append(s.batches[:i], s.batches[i+1:]...)
			continue
		}
		if best < 0 || b.until < s.batches[best].until {
			best = i
		}
		i++
	}
	if best < 0 {
		return slot{}, false
	}
	b := &s.batches[best]
	sl := slot{seq: b.seq, idx: b.idx, j: b.to, until: b.until, t0: b.t0, sent: b.sent}
	b.to--
	out.Add(-1)
	if b.to < b.from {
		s.batches = append(s.batches[:best], s.batches[best+1:]...)
	}
	s.held.Add(1)
	return sl, true
}

// decided records that a held slot was spent or put back, and wakes the
// requests waiting for that. locked: s.mu is held by the caller. Without
// waiters (the hot path) it is two atomic adds.
func (s *state) decided(locked bool) {
	s.held.Add(-1)
	s.settled.Add(1)
	if s.waiting.Load() == 0 {
		return
	}
	if !locked {
		s.mu.Lock()
		defer s.mu.Unlock()
	}
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
}

// awaitSettled waits until a held slot of s is decided after generation gen
// (settled, read before held was seen > 0), or until the window's negative
// answer ends (until, if later than now: then a call decides), or until
// deadline (mono ns); false at the deadline. The caller holds no slot while
// it waits.
func (s *state) awaitSettled(gen uint32, until, deadline int64) bool {
	s.mu.Lock()
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	// decided adds to settled before it reads waiting, and this reads
	// settled after adding to waiting: one of the two sees the other.
	if s.settled.Load() != gen {
		s.mu.Unlock()
		return true
	}
	if s.wake == nil {
		s.wake = make(chan struct{})
	}
	ch := s.wake
	s.mu.Unlock()
	end := deadline
	if now := mono(time.Now()); until > now && until < end {
		end = until
	}
	t := time.NewTimer(time.Duration(end - mono(time.Now())))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return end < deadline
	}
}

// putBack returns a slot taken by a request that was then refused: it stays
// spendable while its time lasts, else it is given back. st.mu held.
func (s *state) putBack(sl slot, m int64, out *atomic.Int64) {
	if m >= sl.until {
		s.giveBack(span{sl.seq, sl.idx, sl.j, sl.j}, nil)
		return
	}
	s.addBatch(batch{seq: sl.seq, idx: sl.idx, from: sl.j, to: sl.j, until: sl.until, t0: sl.t0, sent: sl.sent})
	out.Add(1)
}

// addBatch stores leased slots, merging with the batch they continue.
func (s *state) addBatch(b batch) {
	for i := range s.batches {
		c := &s.batches[i]
		if c.seq == b.seq && c.idx == b.idx && c.until == b.until && c.to+1 == b.from {
			c.to = b.to
			return
		}
	}
	s.batches = append(s.batches, b)
}

// giveBack queues unspent slots for removal from the log; out (if not nil)
// loses them from the outstanding count.
func (s *state) giveBack(sp span, out *atomic.Int64) {
	if out != nil {
		out.Add(-int64(sp.to - sp.from + 1))
	}
	s.back = append(s.back, sp)
}

// expireAll moves every batch that expired by m to back. st.mu held.
func (s *state) expireAll(m int64, out *atomic.Int64) {
	for i := 0; i < len(s.batches); {
		b := s.batches[i]
		if m >= b.until {
			s.giveBack(span{b.seq, b.idx, b.from, b.to}, out)
			s.wasted = true
			s.batches = append(s.batches[:i], s.batches[i+1:]...)
			continue
		}
		i++
	}
}

// slot is one slot held by a request: member seq:idx:j, spendable while
// mono time < until; t0 (Redis µs) and sent (mono ns) map local time to
// Redis time: Redis time at mono m is at most t0 + (m-sent)/1000.
type slot struct {
	seq      uint64
	idx, j   int
	until    int64
	t0, sent int64
}

// roll advances the local buckets to now (s.mu held).
func (s *state) roll(now time.Time, win time.Duration) {
	if s.locStart.IsZero() {
		s.locStart = now
		return
	}
	el := now.Sub(s.locStart)
	switch {
	case el < win:
	case el < 2*win:
		s.locPrev, s.locN = s.locN, 0
		s.locStart = s.locStart.Add(win)
	default:
		s.locPrev, s.locN = 0, 0
		s.locStart = now
	}
}

// local checks the in-process window with the given limit; it does not count.
func (s *state) local(now time.Time, win time.Duration, limit int) (bool, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.roll(now, win)
	el := now.Sub(s.locStart)
	weight := 1 - float64(el)/float64(win)
	est := float64(s.locPrev)*weight + float64(s.locN)
	if est < float64(limit) {
		return true, 0
	}
	// Wait until the current bucket ends (a safe upper bound of the free time).
	return false, max(time.Millisecond, win-el)
}

// localCommit counts an admitted request in the in-process window.
func (s *state) localCommit(now time.Time, win time.Duration) {
	s.mu.Lock()
	s.roll(now, win)
	s.locN++
	s.mu.Unlock()
}

// breaker keeps Redis out of the request path after consecutive failures:
// open for a back-off (250ms doubling to 5s), then one probe at a time.
type breaker struct {
	mu        sync.Mutex
	failures  int
	open      bool
	openUntil time.Time
	backoff   time.Duration
	probing   bool
}

const (
	breakerThreshold  = 5
	breakerMinBackoff = 250 * time.Millisecond
	breakerMaxBackoff = 5 * time.Second
)

func (b *breaker) init() { b.backoff = breakerMinBackoff }

func (b *breaker) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true
	}
	if now.Before(b.openUntil) || b.probing {
		return false
	}
	b.probing = true
	return true
}

// failure records a failed call; it reports whether the breaker just opened.
func (b *breaker) failure(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if b.open {
		b.probing = false
		b.backoff = min(breakerMaxBackoff, b.backoff*2)
		b.openUntil = now.Add(b.backoff)
		return false
	}
	if b.failures >= breakerThreshold {
		b.open = true
		b.backoff = breakerMinBackoff
		b.openUntil = now.Add(b.backoff)
		return true
	}
	return false
}

// success records a good call; it reports whether the breaker just closed.
func (b *breaker) success() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.open
	b.failures, b.open, b.probing = 0, false, false
	b.backoff = breakerMinBackoff
	return was
}

func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}
