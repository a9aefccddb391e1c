package api

import (
	"fmt"
	"log/slog"
	"testing"
	"time"
)

// The fixed window: limit attempts, then blocked until the window's end,
// then limit again; a success gives its slot back; a full table makes new
// sources share one bucket instead of growing without bound.
func TestFailWindowTurnsOver(t *testing.T) {
	a := newAdminAuth("tok", 3, time.Minute, slog.New(slog.DiscardHandler), nil)
	t0 := time.Unix(1_000_000, 0)
	for i := 1; i <= 3; i++ {
		if n, wait := a.take("1.2.3.4", t0); n != i || wait != 0 {
			t.Fatalf("attempt %d: n=%d wait=%v", i, n, wait)
		}
	}
	if _, wait := a.take("1.2.3.4", t0.Add(10*time.Second)); wait != 50*time.Second {
		t.Fatalf("4th attempt: wait %v, want 50s", wait)
	}
	if n, wait := a.take("5.6.7.8", t0); n != 1 || wait != 0 {
		t.Fatalf("another source: n=%d wait=%v", n, wait)
	}
	a.refund("5.6.7.8")
	if n, _ := a.take("5.6.7.8", t0); n != 1 {
		t.Fatalf("after a refund: n=%d, want 1", n)
	}
	if n, wait := a.take("1.2.3.4", t0.Add(time.Minute)); n != 1 || wait != 0 {
		t.Fatalf("next window: n=%d wait=%v", n, wait)
	}

	b := newAdminAuth("tok", 2, time.Minute, slog.New(slog.DiscardHandler), nil)
	for i := range maxFailSources {
		b.take(fmt.Sprintf("src-%d", i), t0)
	}
	for i := range 2 {
		if _, wait := b.take(fmt.Sprintf("new-%d", i), t0); wait != 0 {
			t.Fatalf("overflow attempt %d blocked", i)
		}
	}
	if _, wait := b.take("new-9", t0); wait == 0 {
		t.Fatal("new sources beyond a full table are not limited together")
	}
	if len(b.sources) != maxFailSources+1 {
		t.Fatalf("table grew to %d", len(b.sources))
	}
	// Expired entries make room again.
	if n, wait := b.take("late", t0.Add(time.Minute)); n != 1 || wait != 0 || len(b.sources) > 2 {
		t.Fatalf("after expiry: n=%d wait=%v table=%d", n, wait, len(b.sources))
	}
}
