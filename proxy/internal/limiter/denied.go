package limiter

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Denied is a negative cache: key (a client of one per-client window here;
// a window in the Envoy service) → until when (mono ns) the store said the
// window is full. Without leases
// nothing frees a slot before the oldest hit slides out, so the entry is
// exact, measured from before the call was sent; dropping one costs only a
// Redis call, so the bound is kept by dropping any.
type Denied struct {
	seed   maphash.Seed
	shards [deniedShards]struct {
		mu sync.Mutex
		m  map[string]int64
	}
	n atomic.Int64
}

const deniedShards = 64

// NewDenied makes an empty negative cache.
func NewDenied() *Denied {
	d := &Denied{seed: maphash.MakeSeed()}
	for i := range d.shards {
		d.shards[i].m = map[string]int64{}
	}
	return d
}

// Until is when client's window stops being known full (0: not known).
func (d *Denied) Until(client []byte) int64 {
	sh := &d.shards[maphash.Bytes(d.seed, client)&(deniedShards-1)]
	sh.mu.Lock()
	u := sh.m[string(client)]
	sh.mu.Unlock()
	return u
}

// set records client's window full until u; with maxStates > 0 a shard at
// its share first drops an expired entry, else any one (evicted).
func (d *Denied) set(client []byte, u, now int64, maxStates int, evicted counterRef) {
	sh := &d.shards[maphash.Bytes(d.seed, client)&(deniedShards-1)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[string(client)]; !ok {
		if per := (maxStates + deniedShards - 1) / deniedShards; maxStates > 0 && len(sh.m) >= per {
			victim, expired := "", false
			for k, v := range sh.m {
				victim = k
				if expired = v <= now; expired {
					break
				}
			}
			delete(sh.m, victim)
			d.n.Add(-1)
			if !expired {
				evicted.inc()
			}
		}
		d.n.Add(1)
	}
	sh.m[string(client)] = u
}

// Sweep drops the entries that ran out.
func (d *Denied) Sweep(now int64) {
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		for k, v := range sh.m {
			if v <= now {
				delete(sh.m, k)
				d.n.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// mono is t as monotonic ns since clockBase.
func mono(t time.Time) int64 { return int64(t.Sub(clockBase)) }

// Set records key's window full until u (mono ns, as now); with maxStates > 0
// the cache keeps about that many entries, dropping an expired one first,
// else any (counted in evicted, which may be nil).
func (d *Denied) Set(key []byte, u, now int64, maxStates int, evicted prometheus.Counter) {
	d.set(key, u, now, maxStates, counterRef{evicted})
}

// Len is the number of entries.
func (d *Denied) Len() int64 { return d.n.Load() }

// Mono is t as the monotonic ns the negative cache and leases count in.
func Mono(t time.Time) int64 { return mono(t) }
