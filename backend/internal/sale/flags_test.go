package sale

import (
	"testing"
	"time"
)

func TestFlagsTTLAndEvents(t *testing.T) {
	f := newFlags(time.Second)
	t0 := time.Unix(1000, 0)
	f.Set(1, f.Epoch(), t0)
	if !f.Has(1, t0.Add(999*time.Millisecond)) {
		t.Error("flag gone before its TTL")
	}
	if f.Has(1, t0.Add(time.Second)) {
		t.Error("flag outlived its TTL")
	}
	if f.Has(2, t0) {
		t.Error("unset id flagged")
	}
	f.Set(1, f.Epoch(), t0)
	f.Clear(1)
	if f.Has(1, t0) {
		t.Error("event did not clear the flag")
	}
	f.Set(1, f.Epoch(), t0)
	f.Set(3, f.Epoch(), t0)
	f.ClearAll()
	if f.Has(1, t0) || f.Has(3, t0) {
		t.Error("resubscription did not clear every flag")
	}
}

// An event that arrives between the Redis answer and the Set wins: the
// answer "sold out" predates the unit that came back.
func TestFlagsEventBeforeSetWins(t *testing.T) {
	f := newFlags(time.Hour)
	now := time.Unix(1000, 0)
	epoch := f.Epoch() // read before the reserve call
	f.Clear(7)         // the stock event is handled while the call is in flight
	f.Set(7, epoch, now)
	if f.Has(7, now) {
		t.Error("a stale sold-out answer set the flag after the event that cleared it")
	}
}

func TestStateAt(t *testing.T) {
	start, end := time.Unix(100, 0), time.Unix(200, 0)
	for _, c := range []struct {
		now   int64
		avail int64
		want  string
	}{
		{99, 5, StateUpcoming}, {100, 5, StateOpen}, {100, 0, StateSoldOut}, {199, 1, StateOpen}, {200, 5, StateEnded},
	} {
		if got := stateAt(time.Unix(c.now, 0), start, end, c.avail); got != c.want {
			t.Errorf("stateAt(%d, avail %d) = %s, want %s", c.now, c.avail, got, c.want)
		}
	}
}
