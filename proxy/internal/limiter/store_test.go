package limiter

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/internal/servicetest"
)

// stores runs fn against the Redis store (the test's Redis: a node, or the
// cluster under make test-engines) and the memory store.
func stores(t *testing.T, fn func(t *testing.T, s Store, prefix string)) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rdb, prefix := servicetest.Redis(t)
		fn(t, NewRedis(rdb, "t", 2*time.Second, NewMetrics(prometheus.NewRegistry()), nil), prefix)
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		fn(t, NewMemory(), "m:")
	})
}

var keySeq atomic.Int64

// fresh is a new per-client window key (its own hash tag) and a global one.
func fresh(prefix string) (client, global string) {
	n := keySeq.Add(1)
	return fmt.Sprintf("%s{rl:a:10.0.%d.%d}:r", prefix, n>>8, n&255), fmt.Sprintf("%s{rl:g:r%d}", prefix, n)
}

// Bursts admit exactly the limit: 30 rounds of 3L concurrent decisions on
// a fresh pair of windows (per-client and global, under two hash tags on a
// cluster), L in {1, 5}; nothing is written for a refused decision.
func TestStoreBurstExact(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s Store, prefix string) {
		for _, L := range []int{1, 5} {
			for round := range 30 {
				c, g := fresh(prefix)
				ws := []Want{{Key: c, Limit: L, Length: 10 * time.Second}, {Key: g, Limit: 1000, Length: 10 * time.Second}}
				var admitted, full atomic.Int64
				var wg sync.WaitGroup
				for range 3 * L {
					wg.Go(func() {
						out := make([]Got, 2)
						ok, err := s.Take(ws, 1, out)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							admitted.Add(1)
						} else if out[0].Full && !out[1].Full {
							full.Add(1)
						}
					})
				}
				wg.Wait()
				if admitted.Load() != int64(L) || full.Load() != int64(2*L) {
					t.Fatalf("L=%d round %d: %d admitted, %d refused by the client's window, want %d and %d",
						L, round, admitted.Load(), full.Load(), L, 2*L)
				}
				out := make([]Got, 1)
				if _, err := s.Take(ws[1:], 1, out); err != nil || out[0].Remaining != 1000-L-1 {
					t.Fatalf("the global window holds %d, want %d (refused decisions write nothing): %v", 1000-out[0].Remaining-1, L, err)
				}
			}
		}
	})
}

// Every window of a decision or none: a full one refuses and names itself,
// the others keep their slots; weights count as that many hits; a weight
// above the limit never passes; Reset says when the weight fits again.
func TestStoreAllOrNothingAndWeights(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s Store, prefix string) {
		// Two windows of one client: one hash tag, one op even on a cluster
		// (across tags a cluster asks the later tag only if the earlier admits).
		a, _ := fresh(prefix)
		b := a + ":other"
		ws := []Want{{Key: a, Limit: 2, Length: time.Second}, {Key: b, Limit: 10, Length: time.Second}}
		out := make([]Got, 2)
		for i := range 4 {
			ok, err := s.Take(ws, 1, out)
			servicetest.Must(t, err, "take")
			if ok != (i < 2) {
				t.Fatalf("decision %d: admitted %v", i, ok)
			}
		}
		if !out[0].Full || out[1].Full || out[1].Remaining != 8 || out[0].Reset <= 0 || out[0].Reset > time.Second {
			t.Fatalf("after the limit: %+v, want the first full (reset within 1s), the second with 8 left", out)
		}
		w := []Want{{Key: b, Limit: 10, Length: time.Second}}
		one := make([]Got, 1)
		for _, tc := range []struct {
			weight int
			ok     bool
			left   int
		}{{4, true, 4}, {4, true, 0}, {1, false, 0}, {11, false, 0}} {
			ok, err := s.Take(w, tc.weight, one)
			servicetest.Must(t, err, "take")
			if ok != tc.ok || one[0].Remaining != tc.left || one[0].Full == tc.ok {
				t.Fatalf("weight %d: admitted %v %+v, want %v with %d left", tc.weight, ok, one[0], tc.ok, tc.left)
			}
		}
		time.Sleep(one[0].Reset / 10) // Reset of a weight above the limit is the window: never
		if ok, _ := s.Take(w, 1, one); ok {
			t.Fatal("admitted in a full window")
		}
		time.Sleep(one[0].Reset + 20*time.Millisecond)
		if ok, err := s.Take(w, 1, one); !ok || err != nil {
			t.Fatalf("not admitted after its Reset %v: %v", one[0].Reset, err)
		}
	})
}

// The sliding window holds in every interval: 16 goroutines hammer a
// window of 20 per 200 ms for a second; the admission moments the store
// reports (its own clock) never hold more than 20 in any 200 ms, and the
// run admits at least 2 windows' worth (of 5).
func TestStoreWorstInterval(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s Store, prefix string) {
		const L, W = 20, 200 * time.Millisecond
		k, _ := fresh(prefix)
		ws := []Want{{Key: k, Limit: L, Length: W}}
		var mu sync.Mutex
		var at []int64
		end := time.Now().Add(time.Second)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				out := make([]Got, 1)
				for time.Now().Before(end) {
					ok, err := s.Take(ws, 1, out)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						mu.Lock()
						at = append(at, out[0].At)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		slices.Sort(at)
		worst := 0
		for i, j := 0, 0; i < len(at); i++ {
			for at[i]-at[j] >= W.Microseconds() {
				j++
			}
			worst = max(worst, i-j+1)
		}
		t.Logf("%d admitted, worst %v interval %d (limit %d)", len(at), W, worst, L)
		if worst > L || len(at) < 2*L {
			t.Fatalf("worst interval %d > %d, or only %d admitted", worst, L, len(at))
		}
	})
}
