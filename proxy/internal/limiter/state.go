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
// client's per-IP window): leased slots, the negative cache, the last figures
// Redis gave, and the in-process counter used while Redis is unreachable.
type state struct {
	mu          sync.Mutex
	slots       int          // leased slots not yet spent
	leaseUntil  time.Time    // leased slots are spendable until then
	epoch       uint64       // bumped at each new lease
	want        int          // slots to ask for next time (adaptive)
	wasted      bool         // the last lease expired with slots left
	deniedUntil atomic.Int64 // negative cache: full until then (mono ns, exact); read without mu
	remaining   int          // free slots after the last call
	resetAt     time.Time    // when the next slot frees, as of the last call
	inflight    chan struct{}
	lastUse     atomic.Int64 // mono ns; stored under (at least) the table shard's read lock

	// in-process sliding-window counter (two fixed buckets, weighted)
	locStart      time.Time
	locPrev, locN int
}

func newState() *state { return &state{want: 1} }

// newLease stores n further slots (one was spent by the calling request) and
// adapts the next ask: double while leases run out, halve after waste.
func (s *state) newLease(n int, until time.Time) {
	switch {
	case s.wasted:
		s.want = max(1, s.want/2)
	case s.want < MaxLease:
		s.want = min(MaxLease, s.want*2)
	}
	s.wasted = false
	s.slots += n // a concurrent call may have leased too: keep both
	s.leaseUntil = until
	s.epoch++
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
