// Package backoff is the one retry loop (Retry, with each call site's
// Policy) and the one retry delay of every reconnect and retry loop:
// exponential from a minimum to a maximum, each wait jittered into [d/2, d]
// so that a fleet that lost its broker or database at the same moment does
// not come back in lockstep.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff doubles a delay from Min up to Max. The zero value is not usable;
// use New.
type Backoff struct {
	min, max, cur time.Duration
}

// New returns a back-off between min and max (max below min is raised to it).
func New(min, max time.Duration) *Backoff {
	if min <= 0 {
		min = time.Millisecond
	}
	if max < min {
		max = min
	}
	return &Backoff{min: min, max: max}
}

// Next is the next wait: the first is about min, each later one doubles up
// to max, all jittered into [d/2, d].
func (b *Backoff) Next() time.Duration {
	switch {
	case b.cur == 0:
		b.cur = b.min
	case b.cur < b.max:
		b.cur = min(2*b.cur, b.max)
	}
	half := b.cur / 2
	return half + rand.N(b.cur-half+1)
}

// Reset starts again from min (after a success).
func (b *Backoff) Reset() { b.cur = 0 }

// Sleep waits d or until ctx is done; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
