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

func TestParseEvent(t *testing.T) {
	for _, c := range []struct {
		payload string
		want    soldout.Event
		known   bool
		bad     bool
	}{
		{"42", soldout.Event{V: 1, ActivityID: 42, Kind: soldout.KindChanged}, true, false},
		{soldout.SoldOutEvent(42), soldout.Event{V: 2, ActivityID: 42, Kind: soldout.KindSoldOut}, true, false},
		{`{"v":2,"activity_id":7,"kind":"changed"}`, soldout.Event{V: 2, ActivityID: 7, Kind: soldout.KindChanged}, true, false},
		// A field or kind a later writer adds within v2: read, the kind as news.
		{`{"v":2,"activity_id":7,"kind":"queue_closed","position":3}`, soldout.Event{V: 2, ActivityID: 7, Kind: soldout.KindChanged}, true, false},
		{`{"v":3,"activity_id":7,"kind":"sold_out"}`, soldout.Event{}, false, false},
		{"0", soldout.Event{}, false, true},
		{"-4", soldout.Event{}, false, true},
		{"x", soldout.Event{}, false, true},
		{"", soldout.Event{}, false, true},
		{`{"v":2}`, soldout.Event{}, false, true},
		{`{"v":1,"activity_id":7}`, soldout.Event{}, false, true},
		{`{"v":2,"activity_id":"7"}`, soldout.Event{}, false, true},
	} {
		ev, known, err := soldout.ParseEvent(c.payload)
		if (err != nil) != c.bad || known != c.known || (known && ev != c.want) {
			t.Errorf("ParseEvent(%q) = %+v %v %v, want %+v known %v bad %v", c.payload, ev, known, err, c.want, c.known, c.bad)
		}
	}
}

func FuzzParseEvent(f *testing.F) {
	for _, s := range []string{"42", soldout.SoldOutEvent(9), `{"v":3}`, `{"v":2,"activity_id":-1}`, "{"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		ev, known, err := soldout.ParseEvent(payload)
		if err != nil && known {
			t.Fatal("known and an error")
		}
		if known && (ev.ActivityID <= 0 || (ev.Kind != soldout.KindChanged && ev.Kind != soldout.KindSoldOut)) {
			t.Fatalf("known event %+v", ev)
		}
		if known && ev.Kind == soldout.KindSoldOut {
			if again, _, _ := soldout.ParseEvent(soldout.SoldOutEvent(ev.ActivityID)); again != ev {
				t.Fatalf("round trip %+v -> %+v", ev, again)
			}
		}
	})
}

type soldOutRecorder struct {
	recorder
	mu      sync.Mutex
	soldOut []int64
}

func (r *soldOutRecorder) SoldOut(id int64) {
	r.mu.Lock()
	r.soldOut = append(r.soldOut, id)
	r.mu.Unlock()
}

// A v2 "sold out" reaches the listeners that act on it and clears no flag;
// a later version is ignored; v1 news still clears.
func TestWatchSoldOutEvent(t *testing.T) {
	rdb, prefix := servicetest.Redis(t)
	ctx, cancel := context.WithCancel(context.Background())
	f := soldout.NewFlags(time.Hour)
	rec := &soldOutRecorder{}
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		soldout.Watch(ctx, rdb, reservation.Channel(prefix), slog.New(slog.DiscardHandler), ready, f, rec)
	}()
	defer func() { cancel(); <-done }()
	<-ready
	f.Set(4, f.Token(), time.Now())
	for _, p := range []string{soldout.SoldOutEvent(4), `{"v":3,"activity_id":4,"kind":"changed"}`, "5"} {
		servicetest.Must(t, rdb.Publish(ctx, reservation.Channel(prefix), p).Err(), "publish")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		rec.recorder.mu.Lock()
		n := len(rec.changed)
		rec.recorder.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the v1 event never arrived")
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.soldOut) != 1 || rec.soldOut[0] != 4 {
		t.Errorf("sold out heard: %v, want [4]", rec.soldOut)
	}
	if rec.changed[0] != 5 {
		t.Errorf("changed = %v, want [5] (v3 ignored, sold out is not news)", rec.changed)
	}
	if !f.Has(4, time.Now()) {
		t.Error("the sold-out event cleared a flag")
	}
}
