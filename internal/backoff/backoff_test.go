package backoff

import (
	"context"
	"testing"
	"time"
)

func TestNextDoublesWithinJitterUpToMax(t *testing.T) {
	b := New(100*time.Millisecond, time.Second)
	for i, top := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		top *= time.Millisecond
		if top > time.Second {
			top = time.Second
		}
		d := b.Next()
		if d < top/2 || d > top {
			t.Errorf("wait %d: %s outside [%s, %s]", i, d, top/2, top)
		}
	}
	b.Reset()
	if d := b.Next(); d > 100*time.Millisecond {
		t.Errorf("after Reset: %s", d)
	}
}

// Jitter spreads a fleet: 100 back-offs started together do not all pick
// the same wait.
func TestNextIsJittered(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		seen[New(time.Second, 5*time.Second).Next()] = true
	}
	if len(seen) < 50 {
		t.Errorf("only %d distinct first waits of 100", len(seen))
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep ran past a cancelled context")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep did not report a full wait")
	}
}
