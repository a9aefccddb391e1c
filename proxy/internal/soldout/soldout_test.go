package soldout

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/internal/soldout"
)

var soldOutBody = []byte(`{"code":"sold_out","message":"sold out"}`)

// sale is one activity in the test's Redis, sold through the store as the
// backends behind every proxy would.
type sale struct {
	t   *testing.T
	rdb redis.UniversalClient
	st  *reservation.Store
	id  int64
}

func newSale(t *testing.T, id, total int64) *sale {
	t.Helper()
	rdb, prefix := servicetest.Redis(t)
	st := reservation.New(rdb, prefix)
	now := time.Now()
	_, _, err := st.Warm(context.Background(), id, reservation.WarmArgs{Total: total, Limit: 5, Start: now.Add(-time.Hour), End: now.Add(time.Hour)})
	servicetest.Must(t, err, "warm")
	return &sale{t: t, rdb: rdb, st: st, id: id}
}

// buy reserves one unit for (user, key) and returns its order id.
func (s *sale) buy(user, key string) string {
	s.t.Helper()
	res, err := s.st.Reserve(context.Background(), reservation.Request{ActivityID: s.id, UserID: user, IdempotencyKey: key,
		Quantity: 1, OrderID: ordermsg.NewOrderID(s.id), TTL: time.Minute})
	servicetest.Must(s.t, err, "reserve")
	if res.Outcome != reservation.Reserved {
		s.t.Fatalf("reserve %s/%s: %+v", user, key, res)
	}
	return res.OrderID
}

func (s *sale) release(oid string) {
	s.t.Helper()
	out, err := s.st.Release(context.Background(), s.id, oid, "expired")
	servicetest.Must(s.t, err, "release")
	if out != reservation.Released {
		s.t.Fatalf("release %s: %s", oid, out)
	}
}

func newCache(s *sale, ttl time.Duration, hooks Hooks) *Cache {
	c := New(ttl, nil)
	c.EnableKeys(s.st, 1000, hooks)
	s.t.Cleanup(c.Close)
	return c
}

// learn is the 409 sold_out of a purchase sent when tok was taken; it
// returns once the keys read it started are in.
func learn(t *testing.T, c *Cache, id int64, tok soldout.Token) {
	t.Helper()
	if !c.Learn(id, tok, []byte("application/json"), soldOutBody) {
		t.Fatal("sold-out answer not learnt")
	}
	c.Close()
}

// answered reports whether the cache answers the purchase itself (409).
func answered(t *testing.T, c *Cache, id int64, now time.Time, user, key string) bool {
	t.Helper()
	body, _, ok := c.Lookup(id, now, []byte(user), []byte(key))
	if ok && string(body) != string(soldOutBody) {
		t.Fatalf("answer %s", body)
	}
	return ok
}

// A sold-out sale's keys: a key that holds an order (pending, confirmed or
// failed) goes to the backend; any other keyed purchase gets the edge's 409.
func TestKeyedAnswers(t *testing.T) {
	t.Parallel()
	s := newSale(t, 41, 3)
	failed := s.buy("alice", "k1")
	s.buy("bob", "k1")
	s.buy("carol", "")
	s.release(failed) // failed: keeps its key, gives its unit back
	daveOrder := s.buy("dave", "d1")
	c := newCache(s, time.Minute, Hooks{})
	now := time.Now()
	if answered(t, c, 41, now, "x", "") {
		t.Fatal("answered before anything was learnt")
	}
	learn(t, c, 41, c.Token())
	for _, k := range [][2]string{{"alice", "k1"}, {"bob", "k1"}, {"dave", "d1"}} {
		if answered(t, c, 41, now, k[0], k[1]) {
			t.Errorf("%s/%s holds an order: answered at the edge", k[0], k[1])
		}
	}
	for _, k := range [][2]string{{"alice", "k2"}, {"carol", "k1"}, {"bob", "d1"}, {"carol", ""}} {
		if !answered(t, c, 41, now, k[0], k[1]) {
			t.Errorf("%s/%q holds no order: not answered at the edge", k[0], k[1])
		}
	}
	if answered(t, c, 41, now, "", "k9") {
		t.Error("a keyed purchase without a user (the backend's 400) answered at the edge")
	}
	// News: dave's order failed, its unit came back. Nothing is answered
	// until a sold-out answer is learnt again, and with a unit left no key
	// set is kept.
	s.release(daveOrder)
	c.Changed(41)
	if answered(t, c, 41, now, "erin", "e1") {
		t.Fatal("answered after news")
	}
	learnNoKeys := c.Learn(41, c.Token(), []byte("application/json"), soldOutBody)
	c.Close()
	if !learnNoKeys {
		t.Fatal("not learnt")
	}
	// The sale had a unit when read: keyed purchases go on until a read
	// finds it sold out.
	if answered(t, c, 41, now, "frank", "f1") {
		t.Error("answered a keyed purchase of a sale read with units left")
	}
}

// News arriving while the keys are being read (a unit came back, and a new
// key took it through another proxy): the keys read before the news are not
// kept, since that key is missing from them; once the sale is sold out
// again they are read anew and its replay goes to the backend.
func TestNewsDuringKeyRead(t *testing.T) {
	t.Parallel()
	s := newSale(t, 42, 1)
	first := s.buy("alice", "k1")
	var c *Cache
	var late string
	c = newCache(s, time.Minute, Hooks{Fetched: func(int64) {
		if late != "" {
			return
		}
		s.release(first)          // alice's order fails: its unit is back
		late = s.buy("bob", "b1") // bob's new key takes it at another proxy
		c.Changed(42)             // the release's stock event arrives
	}})
	learn(t, c, 42, c.Token())
	if answered(t, c, 42, time.Now(), "zed", "z") {
		t.Fatal("answered after news")
	}
	learn(t, c, 42, c.Token()) // the next sold-out answer, sent after the news
	now := time.Now()
	if answered(t, c, 42, now, "bob", "b1") {
		t.Error("the replay of bob's order (accepted while the keys were read) got the edge's 409")
	}
	if answered(t, c, 42, now, "alice", "k1") {
		t.Error("the replay of alice's failed order got the edge's 409")
	}
	if !answered(t, c, 42, now, "zed", "z") {
		t.Error("a new key was not answered at the edge")
	}
}

// A sold-out answer to a purchase sent before news, learnt while a replay
// is in flight, is refused by its token; and keys whose read began before
// the news are refused although the sale looked sold out when read.
func TestNewsBeforeLearn(t *testing.T) {
	t.Parallel()
	s := newSale(t, 43, 1)
	s.buy("alice", "k1")
	c := newCache(s, time.Minute, Hooks{})
	tok := c.Token() // the purchase goes upstream
	c.Changed(43)    // news while it is in flight
	if c.Learn(43, tok, []byte("application/json"), soldOutBody) {
		t.Fatal("an answer sent before the news was learnt")
	}
	c.Close()
	if answered(t, c, 43, time.Now(), "zed", "z") {
		t.Fatal("answered from a refused answer")
	}
}

// A key accepted at another proxy just before the sale sold out: this
// proxy's read of the keys began while a unit was left (its flag came from
// an answer that was true then). The sale then sells out with no news at
// all, so the read is retried after the flag's TTL, never kept until news;
// meanwhile the key's replay goes on.
func TestKeyAcceptedElsewhereJustBeforeSoldOut(t *testing.T) {
	t.Parallel()
	s := newSale(t, 44, 2)
	s.buy("alice", "k1")
	c := newCache(s, 50*time.Millisecond, Hooks{})
	learn(t, c, 44, c.Token()) // the read finds a unit left
	s.buy("bob", "b1")         // another proxy's purchase takes it: sold out, no news
	if answered(t, c, 44, time.Now(), "bob", "b1") {
		t.Fatal("bob's replay answered at the edge")
	}
	// The flag's TTL later: the next sold-out answer is learnt and the keys
	// are read again (the first keyed purchase after the retry time starts
	// the read), bob's among them.
	time.Sleep(60 * time.Millisecond)
	learn(t, c, 44, c.Token())
	answered(t, c, 44, time.Now(), "probe", "p")
	c.Close()
	if ks, _ := c.heldBy(44, time.Now()); ks == nil || ks.forward {
		t.Fatalf("keys not read again after the retry time: %+v", ks)
	}
	now := time.Now()
	if answered(t, c, 44, now, "bob", "b1") {
		t.Error("bob's replay answered at the edge")
	}
	if !answered(t, c, 44, now, "carol", "c1") {
		t.Error("a new key was not answered at the edge")
	}
}

// The stock events' "sold out" reads the keys before any answer is learnt.
func TestSoldOutEventReadsKeys(t *testing.T) {
	t.Parallel()
	s := newSale(t, 45, 1)
	s.buy("alice", "k1")
	c := newCache(s, time.Minute, Hooks{})
	c.SoldOut(45)
	c.Close()
	if ks, _ := c.heldBy(45, time.Now()); ks == nil || ks.forward || len(ks.fps) != 1 {
		t.Fatalf("keys after the sold-out event: %+v", ks)
	}
	c.Reset()
	if ks, _ := c.heldBy(45, time.Now()); ks != nil {
		t.Fatal("a resubscription kept the keys")
	}
}

// A sale recovering from a Redis loss: keys MySQL knows may be missing from
// Redis, so no keyed purchase is answered at the edge (the backend's 503
// for them stands); once the recovery ended, the keys are read again.
func TestRecoveringSaleForwardsKeyed(t *testing.T) {
	t.Parallel()
	s := newSale(t, 46, 1)
	s.buy("alice", "k1")
	c := newCache(s, 50*time.Millisecond, Hooks{})
	mark := s.st.Keys(46).Recovering
	servicetest.Must(t, s.rdb.Set(context.Background(), mark, "tok", time.Minute).Err(), "mark recovering")
	learn(t, c, 46, c.Token())
	if answered(t, c, 46, time.Now(), "zed", "z") {
		t.Fatal("a new key answered at the edge while the sale recovers")
	}
	servicetest.Must(t, s.rdb.Del(context.Background(), mark).Err(), "end the recovery")
	time.Sleep(60 * time.Millisecond) // the recovery may end without news: read again after the TTL
	learn(t, c, 46, c.Token())
	answered(t, c, 46, time.Now(), "probe", "p") // starts the read again
	c.Close()
	if !answered(t, c, 46, time.Now(), "zed", "z") {
		t.Error("a new key not answered at the edge after the recovery")
	}
}

// BenchmarkKeyedLookup is the edge's cost of a keyed purchase of a sold-out
// sale of 100,000 keys: a fingerprint and a binary search.
func BenchmarkKeyedLookup(b *testing.B) {
	c := New(time.Hour, nil)
	c.src, c.most = keySourceFunc(nil), 1
	ks := &keySet{fps: make([]uint64, 100_000)}
	for i := range ks.fps {
		ks.fps[i] = fingerprint([]byte("user"+strconv.Itoa(i)), []byte("key"))
	}
	slices.Sort(ks.fps)
	c.keys[1] = ks
	if !c.Learn(1, c.Token(), []byte("application/json"), soldOutBody) {
		b.Fatal("not learnt")
	}
	c.Close()
	user, key := []byte("user-not-there"), []byte("some-idempotency-key-0123456789")
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := c.Lookup(1, now, user, key); !ok {
			b.Fatal("not answered")
		}
	}
}

type keySourceFunc func(ctx context.Context, id int64, most int) (reservation.Held, error)

func (f keySourceFunc) HeldKeys(ctx context.Context, id int64, most int) (reservation.Held, error) {
	if f == nil {
		return reservation.Held{Outcome: reservation.HeldOpen}, nil
	}
	return f(ctx, id, most)
}
