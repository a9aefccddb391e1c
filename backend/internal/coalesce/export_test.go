package coalesce

import (
	"testing"
	"time"
)

// Queued reports how many calls of key wait in its queue.
func (c *Coalescer[K, T]) Queued(key K) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.lanes[key]; l != nil {
		return len(l.queue)
	}
	return 0
}

func WaitQueued[K comparable, T any](t *testing.T, c *Coalescer[K, T], key K, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.Queued(key) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", c.Queued(key), n)
		}
		time.Sleep(time.Millisecond)
	}
}
