package soldout

import (
	"context"
	"hash/maphash"
	"slices"
	"time"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/soldout"
)

// KeySource reads the keys that hold an order of a sold-out sale
// (reservation.Store.HeldKeys).
type KeySource interface {
	HeldKeys(ctx context.Context, activityID int64, most int) (reservation.Held, error)
}

// fetchTimeout bounds one read of a sale's keys: up to [proxy]
// sold_out_keys_max keys in one script call, far longer than a limiter
// call, and off the request path (purchases meanwhile are forwarded).
const fetchTimeout = 2 * time.Second

// keySet is what the proxy knows of a sold-out sale's keys. A set read
// while the sale was sold out (exact) is kept until news about the sale; a
// sale whose keys cannot be held (forward: sharded, too many, recovering,
// not sold out by the time of the read, an error) has its keyed purchases
// forwarded until news, or until retry for the outcomes that may change
// without news (a read that failed, found units that then sold, or met a
// recovery that then ended).
type keySet struct {
	fps     []uint64 // sorted fingerprints of (user, key): a filter whose positives go to the backend
	forward bool
	retry   time.Time // forward only: zero means until news
}

// seed keys the fingerprints per process, so that no client can craft a
// key that collides with another user's order everywhere (a collision only
// sends the purchase to the backend, which answers it right).
var seed = maphash.MakeSeed()

func fingerprint(user, key []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	_, _ = h.Write(user)
	_ = h.WriteByte(0) // neither a user id nor a key holds a NUL byte
	_, _ = h.Write(key)
	return h.Sum64()
}

func (k *keySet) holds(fp uint64) bool {
	_, found := slices.BinarySearch(k.fps, fp)
	return found
}

// Hooks are points at which tests force an interleaving.
type Hooks struct {
	// Fetched runs after a read of a sale's keys, before its result is kept.
	Fetched func(id int64)
}

// EnableKeys lets the cache answer keyed purchases of a sold-out sale whose
// keys it read from src (at most most keys; 0 leaves keyed purchases to the
// backend). Call before serving.
func (c *Cache) EnableKeys(src KeySource, most int, hooks Hooks) {
	if most <= 0 {
		return
	}
	c.src, c.most, c.hooks = src, most, hooks
}

// heldBy is the sale's key set when one is kept and in force; fetch tells
// the caller that none is and none is being read.
func (c *Cache) heldBy(id int64, now time.Time) (ks *keySet, fetch bool) {
	c.mu.RLock()
	ks, ok := c.keys[id]
	busy := c.fetching[id]
	c.mu.RUnlock()
	if ok && !(ks.forward && !ks.retry.IsZero() && !now.Before(ks.retry)) {
		return ks, false
	}
	return nil, !busy
}

// prefetch starts reading the sale's keys unless they are kept or being read.
func (c *Cache) prefetch(id int64, now time.Time) {
	if c.src == nil {
		return
	}
	if _, fetch := c.heldBy(id, now); fetch {
		c.startFetch(id)
	}
}

func (c *Cache) startFetch(id int64) {
	c.mu.Lock()
	if c.fetching[id] {
		c.mu.Unlock()
		return
	}
	c.fetching[id] = true
	c.mu.Unlock()
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		c.fetch(id)
	}()
}

// fetch reads the sale's keys and keeps them unless news about the sale
// arrived since the read began: then they may be short of a key accepted
// since (the read is exact only until the next news).
func (c *Cache) fetch(id int64) {
	tok := c.flags.Token()
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	h, err := c.src.HeldKeys(ctx, id, c.most)
	cancel()
	if c.hooks.Fetched != nil {
		c.hooks.Fetched(id)
	}
	ks := &keySet{forward: true}
	outcome := h.Outcome
	switch {
	case err != nil:
		outcome = "error"
		ks.retry = time.Now().Add(c.flags.TTL())
	case h.Outcome == reservation.HeldSoldOut:
		ks.forward = false
		ks.fps = make([]uint64, len(h.Pairs))
		for i, p := range h.Pairs {
			ks.fps[i] = fingerprint([]byte(p.User), []byte(p.Key))
		}
		slices.Sort(ks.fps)
	case h.Outcome == reservation.HeldOpen || h.Outcome == reservation.HeldNotFound || h.Outcome == reservation.HeldRecovering:
		// Units were left, or no sale: it may sell out without news. A
		// recovery may end without news too (sync.lua publishes only when
		// units came back).
		ks.retry = time.Now().Add(c.flags.TTL())
	}
	c.mu.Lock()
	delete(c.fetching, id)
	kept := !c.flags.Stale(id, tok)
	if kept {
		c.keys[id] = ks
	}
	c.mu.Unlock()
	if c.KeyReads != nil {
		if !kept {
			outcome = "stale"
		}
		c.KeyReads.WithLabelValues(outcome).Inc()
	}
}

// Changed forgets the activity's flag and keys: news about it (a
// soldout.Listener). The news is recorded (flags) before the keys go, so a
// read that began before it is refused by fetch.
func (c *Cache) Changed(id int64) {
	c.flags.Changed(id)
	c.mu.Lock()
	delete(c.keys, id)
	c.mu.Unlock()
}

// Reset forgets every flag and key set: events may have been missed.
func (c *Cache) Reset() {
	c.flags.Reset()
	c.mu.Lock()
	clear(c.keys)
	c.mu.Unlock()
}

// SoldOut starts reading the keys of a sale the stock events said is sold
// out (a soldout.SoldOutListener), so they are ready when its first sold-out
// answer is learnt.
func (c *Cache) SoldOut(id int64) { c.prefetch(id, time.Now()) }

// Close waits for the reads of keys in flight (at shutdown, once no
// request is served; tests call it to wait for a read they started).
func (c *Cache) Close() { c.bg.Wait() }

var _ soldout.SoldOutListener = (*Cache)(nil)

// MayHold reports whether a keyed purchase of a sale with no unit left may
// be the replay of an accepted order of (user, key): true unless the
// sale's keys are read and do not hold it (a waiting room then answers it
// sold out itself; otherwise it goes on to the backend, which answers a
// replay with its order). It starts reading the keys when they are not.
func (c *Cache) MayHold(id int64, now time.Time, user, key []byte) bool {
	if c.src == nil || len(user) == 0 {
		return true
	}
	ks, fetch := c.heldBy(id, now)
	if ks == nil {
		if fetch {
			c.startFetch(id)
		}
		return true
	}
	return ks.forward || ks.holds(fingerprint(user, key))
}
