package coalesce_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seckill/seckill/backend/internal/coalesce"
)

// recorder runs groups and remembers them; a group whose first item is in
// block waits on that channel before it returns.
type recorder struct {
	mu     sync.Mutex
	groups [][]int
	keys   []string
	block  map[int]chan struct{}
	ran    chan []int
}

func newRecorder() *recorder {
	return &recorder{block: map[int]chan struct{}{}, ran: make(chan []int, 1000)}
}

func (r *recorder) run(key string, g []int) {
	r.mu.Lock()
	r.groups = append(r.groups, append([]int(nil), g...))
	r.keys = append(r.keys, key)
	b := r.block[g[0]]
	r.mu.Unlock()
	r.ran <- g
	if b != nil {
		<-b
	}
}

func (r *recorder) hold(item int) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := make(chan struct{})
	r.block[item] = c
	return c
}

func waitRan(t *testing.T, r *recorder) []int {
	t.Helper()
	select {
	case g := <-r.ran:
		return g
	case <-time.After(5 * time.Second):
		t.Fatal("no group ran")
		return nil
	}
}

// An idle key runs its call at once, alone, on the caller's goroutine.
func TestIdleCallRunsAloneAtOnce(t *testing.T) {
	r := newRecorder()
	c := coalesce.New(8, time.Hour, r.run)
	start := time.Now()
	c.Do("a", 1)
	c.Do("a", 2)
	if d := time.Since(start); d > time.Second {
		t.Errorf("two idle calls took %v with a linger of an hour", d)
	}
	if len(r.groups) != 2 || len(r.groups[0]) != 1 || len(r.groups[1]) != 1 {
		t.Errorf("groups %v, want [[1] [2]]", r.groups)
	}
}

// Calls that arrive while a group of their key runs go together as soon as
// it ends (natural batching), without waiting for the linger.
func TestCallsQueuedBehindARunningGroupGoTogether(t *testing.T) {
	r := newRecorder()
	c := coalesce.New(8, time.Hour, r.run)
	release := r.hold(0)
	var done sync.WaitGroup
	done.Go(func() { c.Do("a", 0) })
	waitRan(t, r)
	for i := 1; i <= 5; i++ {
		done.Go(func() { c.Do("a", i) })
	}
	coalesce.WaitQueued(t, c, "a", 5)
	close(release)
	g := waitRan(t, r)
	done.Wait()
	if len(g) != 5 {
		t.Fatalf("second group %v, want the 5 queued calls", g)
	}
}

// A queue reaching max goes at once, beside the group still running.
func TestFullQueueGoesAtOnce(t *testing.T) {
	r := newRecorder()
	c := coalesce.New(3, time.Hour, r.run)
	release := r.hold(0)
	var done sync.WaitGroup
	done.Go(func() { c.Do("a", 0) })
	waitRan(t, r)
	for i := 1; i <= 3; i++ {
		done.Go(func() { c.Do("a", i) })
	}
	if g := waitRan(t, r); len(g) != 3 {
		t.Fatalf("group %v, want the 3 queued calls while the first still runs", g)
	}
	close(release)
	done.Wait()
}

// A queued call waits linger at most for the running group: then its
// group starts beside it.
func TestLingerBoundsTheWait(t *testing.T) {
	r := newRecorder()
	const linger = 30 * time.Millisecond
	c := coalesce.New(8, linger, r.run)
	release := r.hold(0)
	defer close(release)
	go c.Do("a", 0)
	waitRan(t, r)
	start := time.Now()
	go c.Do("a", 1)
	g := waitRan(t, r)
	if d := time.Since(start); d < linger || len(g) != 1 || g[0] != 1 {
		t.Fatalf("group %v after %v, want [1] after the linger %v", g, d, linger)
	}
}

// Zero linger: nothing waits; a call arriving while a group runs starts its own.
func TestZeroLingerNeverWaits(t *testing.T) {
	r := newRecorder()
	c := coalesce.New(8, 0, r.run)
	release := r.hold(0)
	defer close(release)
	go c.Do("a", 0)
	waitRan(t, r)
	c.Do("a", 1)
	if len(r.groups) != 2 || len(r.groups[1]) != 1 {
		t.Fatalf("groups %v", r.groups)
	}
}

// Keys never share a group, and a busy key does not hold up another.
func TestKeysApart(t *testing.T) {
	r := newRecorder()
	c := coalesce.New(8, time.Hour, r.run)
	release := r.hold(0)
	go c.Do("a", 0)
	waitRan(t, r)
	c.Do("b", 1) // idle key: at once
	close(release)
	if r.keys[1] != "b" || len(r.groups[1]) != 1 {
		t.Fatalf("groups %v of keys %v", r.groups, r.keys)
	}
}

// Under concurrent calls of a few keys every call runs exactly once, in a
// group of its own key of at most max calls, and groups do form.
func TestEveryCallRunsOnce(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]string{}
	var groups, biggest atomic.Int64
	const max, calls = 16, 20_000
	keys := []string{"a", "b", "c"}
	c := coalesce.New(max, time.Millisecond, func(key string, g []int) {
		if len(g) > max {
			t.Errorf("group of %d", len(g))
		}
		groups.Add(1)
		if n := int64(len(g)); n > biggest.Load() {
			biggest.Store(n)
		}
		mu.Lock()
		for _, i := range g {
			if k, dup := seen[i]; dup {
				t.Errorf("call %d ran twice (%s, %s)", i, k, key)
			}
			if keys[i%len(keys)] != key {
				t.Errorf("call %d of key %s ran in a group of %s", i, keys[i%len(keys)], key)
			}
			seen[i] = key
		}
		mu.Unlock()
		time.Sleep(50 * time.Microsecond) // a round trip
	})
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < calls; i += 64 {
				c.Do(keys[i%len(keys)], i)
			}
		})
	}
	wg.Wait()
	if len(seen) != calls {
		t.Fatalf("%d calls ran, want %d", len(seen), calls)
	}
	if groups.Load() >= calls || biggest.Load() < 2 {
		t.Errorf("%d groups for %d calls, biggest %d: nothing was gathered", groups.Load(), calls, biggest.Load())
	}
	t.Logf("%d calls in %d groups (biggest %d)", calls, groups.Load(), biggest.Load())
}

// A run that panics is recovered: every call of its group gets the same
// *PanicError (none hangs), OnPanic hears of it once, and the key's calls
// queued meanwhile and later run as usual.
func TestPanicReachesEveryCallOfItsGroup(t *testing.T) {
	r := newRecorder()
	var reported atomic.Int64
	c := coalesce.New(8, time.Hour, func(key string, g []int) {
		r.run(key, g)
		if g[0] != 0 && g[0] != 6 { // the group of 1..5
			panic("boom")
		}
	})
	c.OnPanic(func(key string, err *coalesce.PanicError) {
		if key != "a" || err.Value != "boom" || len(err.Stack) == 0 {
			t.Errorf("OnPanic(%q, %+v)", key, err)
		}
		reported.Add(1)
	})
	release := r.hold(0)
	var done sync.WaitGroup
	done.Go(func() {
		if err := c.Do("a", 0); err != nil {
			t.Errorf("call 0: %v", err)
		}
	})
	waitRan(t, r)
	errs := make([]error, 5)
	for i := 1; i <= 5; i++ { // one group: 1..5, whose run panics
		done.Go(func() { errs[i-1] = c.Do("a", i) })
	}
	coalesce.WaitQueued(t, c, "a", 5)
	close(release)
	waitRan(t, r)
	finished := make(chan struct{})
	go func() { done.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
		t.Fatal("a call of the panicked group never returned")
	}
	var first *coalesce.PanicError
	for i, err := range errs {
		var pe *coalesce.PanicError
		if !errors.As(err, &pe) || (first != nil && pe != first) {
			t.Errorf("call %d: %v, want the group's *PanicError", i+1, err)
		}
		first = pe
	}
	if n := reported.Load(); n != 1 {
		t.Errorf("OnPanic called %d times, want once", n)
	}
	if err := c.Do("a", 6); err != nil || c.Queued("a") != 0 {
		t.Fatalf("after the panic: %v, queued %d", err, c.Queued("a"))
	}
	// A group of one (max 1) panics the same way.
	one := coalesce.New(1, 0, func(string, []int) { panic("alone") })
	var pe *coalesce.PanicError
	if err := one.Do("a", 1); !errors.As(err, &pe) || pe.Value != "alone" {
		t.Fatalf("max 1: %v", err)
	}
}
