package limiter

import (
	"sync"
	"time"

	"github.com/seckill/seckill/internal/backoff"
)

// breaker keeps Redis out of the request path after breakerThreshold
// failed calls in a row: open for a back-off (internal/backoff: 250 ms
// doubling to 5 s, jittered so instances that opened together do not probe
// together), then one probe at a time; a good call closes it. A probe that
// tells nothing (its decision shed before or after the call) frees the
// probe slot after the back-off, or the longest a probe takes if longer.
type breaker struct {
	mu            sync.Mutex
	failures      int
	open, probing bool
	openUntil     time.Time
	probeUntil    time.Time
	delay         time.Duration // the current back-off
	probeFor      time.Duration // how long a probe may take (queue, call or PING)
	bo            *backoff.Backoff
}

const (
	breakerThreshold  = 5
	breakerMinBackoff = 250 * time.Millisecond
	breakerMaxBackoff = 5 * time.Second
)

func (b *breaker) init(probeFor time.Duration) {
	b.bo, b.probeFor = backoff.New(breakerMinBackoff, breakerMaxBackoff), probeFor
}

// allow reports whether a call may go to Redis now.
func (b *breaker) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true
	}
	if now.Before(b.openUntil) || b.probing && now.Before(b.probeUntil) {
		return false
	}
	b.probing, b.probeUntil = true, now.Add(max(b.delay, b.probeFor))
	return true
}

// failure records a failed call; it reports whether the breaker just opened.
func (b *breaker) failure(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	opened := !b.open && b.failures >= breakerThreshold
	switch {
	case b.open:
		b.probing = false
	case opened:
		b.open = true
		b.bo.Reset()
	default:
		return false
	}
	b.delay = b.bo.Next()
	b.openUntil = now.Add(b.delay)
	return opened
}

// success records a good call; it reports whether the breaker just closed.
func (b *breaker) success() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.open
	b.failures, b.open, b.probing = 0, false, false
	return was
}

func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}
