package rls

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// denied is the negative cache: window key → until when (mono ns) the
// store said it is full. Nothing frees a slot of a sliding log before its
// oldest hit slides out, so the entry is exact, measured from before the
// call left; a dropped entry costs only a store call, so the bound is kept
// by dropping any.
type denied struct {
	seed   maphash.Seed
	max    int
	shards [64]struct {
		mu sync.Mutex
		m  map[string]int64
	}
	n atomic.Int64
}

var clockBase = time.Now()

func mono() int64 { return int64(time.Since(clockBase)) }

func newDenied(max int) *denied {
	d := &denied{seed: maphash.MakeSeed(), max: max}
	for i := range d.shards {
		d.shards[i].m = map[string]int64{}
	}
	return d
}

func (d *denied) shard(key []byte) int { return int(maphash.Bytes(d.seed, key) & 63) }

// until: when key stops being known full (0: not known).
func (d *denied) until(key []byte) int64 {
	sh := &d.shards[d.shard(key)]
	sh.mu.Lock()
	u := sh.m[string(key)]
	sh.mu.Unlock()
	return u
}

func (d *denied) set(key []byte, u int64) {
	sh := &d.shards[d.shard(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[string(key)]; !ok {
		if per := (d.max + 63) / 64; d.max > 0 && len(sh.m) >= per {
			for k := range sh.m {
				delete(sh.m, k)
				d.n.Add(-1)
				break
			}
		}
		d.n.Add(1)
	}
	sh.m[string(key)] = u
}

// sweep drops the entries that ran out.
func (d *denied) sweep(now int64) {
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
