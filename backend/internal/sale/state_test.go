package sale

import (
	"testing"
	"time"
)

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

// A flight that started before news answers its readers but is not kept: the
// next reader starts a new flight.
func TestStateCacheNewsDuringFlight(t *testing.T) {
	c := newStateCache(time.Hour)
	now := time.Unix(1000, 0)
	_, hit, fl, leader, _, _ := c.lookup(1, now)
	if hit || !leader {
		t.Fatalf("first lookup: hit=%v leader=%v", hit, leader)
	}
	if _, _, fl2, leader2, _, _ := c.lookup(1, now); leader2 || fl2 != fl {
		t.Fatal("a second reader did not join the flight in progress")
	}
	c.invalidate(1) // news while the flight reads
	_, _, fl3, leader3, _, _ := c.lookup(1, now)
	if !leader3 || fl3 == fl {
		t.Fatal("a reader after the news joined the flight that predates it")
	}
	fl.view = ActivityView{ActivityID: 1, Available: 5, AsOf: now}
	c.finish(1, fl, true)
	if _, hit, _, _, _, _ := c.lookup(1, now); hit {
		t.Fatal("the result of a flight older than the news was kept")
	}
	fl3.view = ActivityView{ActivityID: 1, Available: 4, AsOf: now}
	c.finish(1, fl3, true)
	v, hit, _, _, _, _ := c.lookup(1, now.Add(time.Minute))
	if !hit || v.Available != 4 {
		t.Fatalf("fresh result not answered: hit=%v %+v", hit, v)
	}
	if _, hit, _, _, _, _ := c.lookup(1, now.Add(time.Hour)); hit {
		t.Fatal("answered after its TTL")
	}
}

func TestStateCacheSoldOutDropsAStateWithUnits(t *testing.T) {
	c := newStateCache(time.Hour)
	now := time.Unix(1000, 0)
	_, _, fl, _, _, _ := c.lookup(1, now)
	fl.view = ActivityView{ActivityID: 1, Available: 1, AsOf: now}
	c.finish(1, fl, true)
	c.soldOut(1)
	_, hit, _, leader, last, known := c.lookup(1, now)
	if hit || !leader || !known || last.Available != 1 {
		t.Fatalf("after sold out: hit=%v leader=%v known=%v last=%+v", hit, leader, known, last)
	}
}
