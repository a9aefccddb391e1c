package room

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

// A step carrying more polls than one call takes sends them in chunks:
// every poll is recorded, and the line is walked once.
func TestStepChunksPolls(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	key := writeKey(t, t.TempDir(), "k", keyA)
	rs := []conf.Rule{{Name: "buy", PathPrefix: "/", WaitingRoom: &conf.WaitingRoom{KeyFile: key, ActivityID: 9,
		AdmitPerSecond: 0.01, MaxActive: 10, Session: conf.D(time.Minute), PollInterval: conf.D(time.Second), PlaceTTL: conf.D(3 * time.Second)}}}
	m, err := New(rs, Options{Redis: rdb, KeyPrefix: prefix})
	servicetest.Must(t, err, "rooms")
	r := m.Enter(Request{Method: []byte("GET"), Path: []byte("/x"), Identity: "a:first", Now: time.Now()})
	if r.Answer != Waiting || r.Place != 1 {
		t.Fatalf("first arrival: %+v", r)
	}
	const n = 3*touchChunk + 7
	r.Room.mu.Lock()
	for i := range n {
		r.Room.seen["a:"+strconv.Itoa(i)] = struct{}{}
	}
	r.Room.mu.Unlock()
	m.Step(context.Background())
	got, err := rdb.HLen(context.Background(), r.Room.keys[3]).Result()
	servicetest.Must(t, err, "seen")
	if got < n {
		t.Errorf("%d polls recorded, want %d", got, n)
	}
	if r.Room.degraded.Load() {
		t.Error("the step failed")
	}
	calls := r.Room.st.Load()
	if calls == nil || calls.next != 1 {
		t.Errorf("state after the step: %+v", calls)
	}
}

// A poll with a fresh place ticket gets it back as it came; one with less
// than half of place_ttl left gets a new one (the ticket follows the polls).
func TestPollRenewsTicketAtHalfLife(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	key := writeKey(t, t.TempDir(), "k", keyA)
	rs := []conf.Rule{{Name: "buy", PathPrefix: "/", WaitingRoom: &conf.WaitingRoom{KeyFile: key, ActivityID: 9,
		AdmitPerSecond: 0.01, MaxActive: 10, Session: conf.D(time.Minute), PollInterval: conf.D(time.Second), PlaceTTL: conf.D(10 * time.Second)}}}
	m, err := New(rs, Options{Redis: rdb, KeyPrefix: prefix})
	servicetest.Must(t, err, "rooms")
	ask := func(ticket string, at time.Time) Result {
		return m.Enter(Request{Method: []byte("GET"), Path: []byte("/x"), Identity: "a:1", Ticket: []byte(ticket), Now: at})
	}
	t0 := time.Now()
	first := ask("", t0)
	if first.Answer != Waiting || first.Ticket == "" || first.Kept {
		t.Fatalf("arrival: %+v", first)
	}
	if r := ask(first.Ticket, t0.Add(4*time.Second)); !r.Kept || r.Ticket != first.Ticket {
		t.Errorf("a poll with 6 s of 10 left: %+v, want the ticket kept", r)
	}
	r := ask(first.Ticket, t0.Add(6*time.Second))
	if r.Kept || r.Ticket == first.Ticket || r.Place != first.Place {
		t.Errorf("a poll with 4 s of 10 left: %+v, want a new ticket for place %d", r, first.Place)
	}
}
