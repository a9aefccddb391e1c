package soldout_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/internal/soldout"
)

func TestFlagsTTLAndEvents(t *testing.T) {
	f := soldout.NewFlags(time.Second)
	t0 := time.Unix(1000, 0)
	f.Set(1, f.Token(), t0)
	if !f.Has(1, t0.Add(999*time.Millisecond)) {
		t.Error("flag gone before its TTL")
	}
	if f.Has(1, t0.Add(time.Second)) {
		t.Error("flag outlived its TTL")
	}
	if f.Has(2, t0) {
		t.Error("unset id flagged")
	}
	f.Set(1, f.Token(), t0)
	f.Clear(1, t0)
	if f.Has(1, t0) {
		t.Error("event did not clear the flag")
	}
	f.Set(1, f.Token(), t0)
	f.Set(3, f.Token(), t0)
	f.ClearAll()
	if f.Has(1, t0) || f.Has(3, t0) {
		t.Error("resubscription did not clear every flag")
	}
}

// An event that arrives between the answer and the Set wins: the answer
// "sold out" predates the unit that came back.
func TestFlagsEventBeforeSetWins(t *testing.T) {
	f := soldout.NewFlags(time.Hour)
	now := time.Unix(1000, 0)
	tok := f.Token() // taken before the request
	f.Clear(7, now)  // the stock event is handled while the request is in flight
	if f.Set(7, tok, now) || f.Has(7, now) {
		t.Error("a stale sold-out answer set the flag after the event that cleared it")
	}
	if !f.Set(7, f.Token(), now) {
		t.Error("an answer to a request sent after the event was refused")
	}
}

// News about another activity does not block this one (the backend's old
// rule, one epoch for all, refused it; the proxy's per-id rule did not).
func TestFlagsEventOfAnotherActivityDoesNotBlock(t *testing.T) {
	f := soldout.NewFlags(time.Hour)
	now := time.Unix(1000, 0)
	tok := f.Token()
	f.Clear(8, now)
	if !f.Set(7, tok, now) {
		t.Error("an event for activity 8 blocked the flag of activity 7")
	}
}

// A resubscription refuses every token taken before it: events may have been
// lost while the subscription was down.
func TestFlagsResetRefusesOlderTokens(t *testing.T) {
	f := soldout.NewFlags(time.Hour)
	now := time.Unix(1000, 0)
	tok := f.Token()
	f.ClearAll()
	if f.Set(7, tok, now) {
		t.Error("a token from before the resubscription was accepted")
	}
}

// Forgetting old events keeps memory bounded and only ever refuses more.
func TestFlagsPruneRaisesTheFloor(t *testing.T) {
	f := soldout.NewFlags(time.Hour)
	t0 := time.Unix(1000, 0)
	tok := f.Token()
	f.Clear(1, t0)
	for i := int64(2); i < 2000; i++ { // old enough to be pruned later
		f.Clear(i, t0.Add(2*time.Minute))
	}
	f.Clear(5000, t0.Add(5*time.Minute)) // prunes events older than a minute
	if f.Set(1, tok, t0.Add(5*time.Minute)) {
		t.Error("a token older than a pruned event was accepted")
	}
	if !f.Set(1, f.Token(), t0.Add(5*time.Minute)) {
		t.Error("a fresh token was refused")
	}
}

func TestFlagsConcurrent(t *testing.T) {
	f := soldout.NewFlags(time.Hour)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 2000 {
				id := int64(j%16 + 1)
				now := time.Now()
				if i%2 == 0 {
					f.Set(id, f.Token(), now)
				} else {
					f.Clear(id, now)
				}
				f.Has(id, now)
			}
		})
	}
	wg.Wait()
}

type recorder struct {
	mu      sync.Mutex
	changed []int64
	resets  int
}

func (r *recorder) Changed(id int64) { r.mu.Lock(); r.changed = append(r.changed, id); r.mu.Unlock() }
func (r *recorder) Reset()           { r.mu.Lock(); r.resets++; r.mu.Unlock() }

// Against the real Redis: a subscription resets the listeners, each event
// reaches every listener, a bad payload is skipped.
func TestWatch(t *testing.T) {
	rdb, prefix := servicetest.Redis(t)
	ctx, cancel := context.WithCancel(context.Background())
	f := soldout.NewFlags(time.Hour)
	f.Set(9, f.Token(), time.Now())
	rec := &recorder{}
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		soldout.Watch(ctx, rdb, reservation.Channel(prefix), slog.New(slog.DiscardHandler), ready, f, rec)
	}()
	defer func() { cancel(); <-done }()
	<-ready
	if f.Has(9, time.Now()) {
		t.Error("subscribing did not reset the flags")
	}
	f.Set(4, f.Token(), time.Now())
	for _, p := range []string{"not-an-id", "4", "5"} {
		servicetest.Must(t, rdb.Publish(ctx, reservation.Channel(prefix), p).Err(), "publish")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec.mu.Lock()
		n, resets := len(rec.changed), rec.resets
		rec.mu.Unlock()
		if n == 2 {
			if resets != 1 {
				t.Errorf("resets = %d, want 1", resets)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("listener heard %d events, want 2", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if f.Has(4, time.Now()) {
		t.Error("event did not clear the flag")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.changed[0] != 4 || rec.changed[1] != 5 {
		t.Errorf("changed = %v, want [4 5]", rec.changed)
	}
}
