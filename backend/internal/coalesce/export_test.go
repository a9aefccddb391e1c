package coalesce

import (
	"testing"
	"time"
)

// WaitQueued waits until n calls of key are queued.
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
