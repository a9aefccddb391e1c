package orderwait

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/servicetest"
)

func TestHubWakeRemoveBound(t *testing.T) {
	h := NewHub(3)
	a, _ := h.Add("o1")
	b, _ := h.Add("o1")
	c, _ := h.Add("o2")
	if _, ok := h.Add("o3"); ok {
		t.Fatal("a fourth waiter was admitted by a hub bounded at 3")
	}
	if n := h.Deliver("o1|K|\nbad line\no9|F|x\no2|F|sold_out|odd\n|K|"); n != 3 {
		t.Errorf("woke %d, want 3", n)
	}
	for _, w := range []*Waiter{a, b} {
		if r := <-w.C(); !r.Confirmed || r.Recheck {
			t.Errorf("o1 waiter got %+v", r)
		}
	}
	if r := <-c.C(); r.Confirmed || r.Reason != "sold_out|odd" {
		t.Errorf("o2 waiter got %+v (the reason is the rest of the line)", r)
	}
	h.Remove(a)
	h.Remove(b)
	h.Remove(c)
	if h.Len() != 0 || len(h.m) != 0 {
		t.Errorf("after removing all: len %d, map %d", h.Len(), len(h.m))
	}
	d, ok := h.Add("o1")
	if !ok {
		t.Fatal("hub still full after removals")
	}
	h.WakeAll()
	h.WakeAll() // a second wake of an unread waiter is dropped, not blocking
	if r := <-d.C(); !r.Recheck {
		t.Errorf("WakeAll delivered %+v", r)
	}
}

func TestHubConcurrent(t *testing.T) {
	h := NewHub(1 << 20)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				id := fmt.Sprintf("o%d", (g*500+i)%64)
				w, ok := h.Add(id)
				if !ok {
					t.Error("refused")
					return
				}
				h.Wake(id, Result{Confirmed: true})
				<-w.C()
				h.Remove(w)
			}
		})
	}
	wg.Wait()
	if h.Len() != 0 {
		t.Errorf("len %d after all removed", h.Len())
	}
}

// Against the real Redis: announcements on the channel wake the waiters; the
// subscription wakes everyone to recheck.
func TestWatch(t *testing.T) {
	rdb, prefix := servicetest.Redis(t)
	h := NewHub(10)
	early, _ := h.Add("o0")
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); h.Watch(ctx, rdb, prefix+"orders", slog.New(slog.DiscardHandler), ready) }()
	defer func() { cancel(); <-done }()
	<-ready
	if r := <-early.C(); !r.Recheck {
		t.Errorf("subscription delivered %+v, want a recheck", r)
	}
	w, _ := h.Add("o1")
	servicetest.Must(t, rdb.Publish(ctx, prefix+"orders", "o1|F|expired").Err(), "publish")
	select {
	case r := <-w.C():
		if r.Confirmed || r.Reason != "expired" {
			t.Errorf("got %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("announcement never woke the waiter")
	}
}

// BenchmarkWaiterMemory reports the hub's own memory per waiting client
// (without the connection and the handler goroutine, which the HTTP server
// holds for any request in progress).
func BenchmarkWaiterMemory(b *testing.B) {
	b.ReportAllocs()
	const n = 10_000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("42-%026d", i)
	}
	var bytesPer float64
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		h := NewHub(n)
		ws := make([]*Waiter, n)
		for i, id := range ids {
			ws[i], _ = h.Add(id)
		}
		runtime.ReadMemStats(&after)
		bytesPer = float64(after.HeapAlloc-before.HeapAlloc) / n
		for _, w := range ws {
			h.Remove(w)
		}
	}
	b.ReportMetric(bytesPer, "B/waiter")
}
