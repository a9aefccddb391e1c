package limiter

import (
	"sync"
	"time"
)

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
