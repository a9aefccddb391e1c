package limiter

import (
	"hash/maphash"
	"strconv"
	"sync"
	"time"
)

// Leases spare Redis the windows far from their limit. A decision that
// goes to Redis may ask, per window, for the slots this instance is likely
// to need in the next spendTime; the script grants them only while the
// window keeps 2 x live x lease free, and scores them at the end of the
// spending time, so a slot spent before then counts in every interval that
// holds the moment it was spent (lua/ratelimit.lua; docs/limiter.md).
// Slots left unspent when the spending time ends go back to Redis (ZREM;
// never dropped, or a burst would stop short of its limit),
// and a window full while leases may still come back says so in its reset.
// Nothing waits on a lease.
const (
	spendTime = 50 * time.Millisecond // leases.spending by default
	// minLease: a window is asked for a lease only when this instance
	// decided at least this many hits of it in a spending time, so a crowd
	// of clients each asking a few times a second never leases.
	minLease = 4
	maxLease = 512 // the script's bound too: one call writes it all
	// coolFor: after a lease came back mostly unspent (a burst ended, or
	// decisions that could not use it), no ask for this many spending times.
	coolFor = 20
	// leaseMinLength: shorter windows would count a slot too long past
	// its use (the spending time) for their length. ratelimit.lua grants
	// no lease below it or below leaseMinLimit either (its leasable).
	leaseMinLength = 10 * spendTime
	// leaseMinLimit: narrower windows are near their limit after a few
	// hits anyway; a lease there would mostly be left unspent.
	leaseMinLimit = 64
)

// leases holds this instance's leases of every window it leases, by key.
type leases struct {
	seed   maphash.Seed
	shards [leaseShards]struct {
		mu sync.Mutex
		m  map[string]*lease
	}
	// back removes slots this instance will not spend from key's log;
	// prefetch asks Redis for the next slots of key. Both run on their own
	// goroutine (they call Redis).
	back     func(key string, members []string)
	prefetch func(w Want, ask int)
	spending time.Duration // spendTime; tests stretch it
}

const (
	leaseShards = 64
	// leaseShardCap bounds the leases kept (64 x 1024): keys past it are
	// decided in Redis until the sweep drops idle ones.
	leaseShardCap = 1024
)

// lease: what this instance may spend of one window (the current slots and
// the next ones, asked for while the current ran low) and the demand that
// sizes the next ask.
type lease struct {
	cur, next slots
	asking    bool  // an ask is in flight
	cool      int64 // mono ns: no ask before (the last lease came back mostly unspent)
	hits      int   // decisions that needed the window since `since`
	prev      int   // ... in the spending time before
	since     int64 // mono ns
}

// slots is one grant of Redis.
type slots struct {
	name      string // slot j is the member name+j, j = 1..granted
	granted   int
	left      int   // slots not spent: the last `left` names
	until     int64 // spend before this (mono ns; from before the granting call left)
	at        int64 // their score (µs, Redis clock): their admission moment
	remaining int   // the window's free slots past them, at the grant
}

func (s *slots) usable(weight int, now int64) bool { return s.left >= weight && now < s.until }

// unspent is the members of s not spent (and forgets them).
func (s *slots) unspent() []string {
	if s.left == 0 {
		return nil
	}
	m := names(s.name, s.granted-s.left+1, s.left)
	s.left = 0
	return m
}

// grant is what Redis leased with one decision.
type grant struct {
	n    int
	name string
}

// held is the slots one decision took from a lease: name+from ... n of them.
type held struct {
	key, name string
	from, n   int
}

func newLeases(back func(string, []string), prefetch func(Want, int)) *leases {
	l := &leases{seed: maphash.MakeSeed(), back: back, prefetch: prefetch, spending: spendTime}
	for i := range l.shards {
		l.shards[i].m = map[string]*lease{}
	}
	return l
}

// leasable: windows long and wide enough for a lease to pay.
func leasable(w Want, live int) bool {
	return w.Length >= leaseMinLength && w.Limit >= max(leaseMinLimit, 2*live*minLease)
}

func (ls *leases) shard(key string) *struct {
	mu sync.Mutex
	m  map[string]*lease
} {
	return &ls.shards[maphash.String(ls.seed, key)&(leaseShards-1)]
}

// spend takes weight slots of w's lease (ok: h holds them, got describes
// the window), or says how many slots the decision going to Redis should
// ask for (0: none). A lease spent past half has its next slots asked for
// on the side, so a steady stream of decisions rarely goes to Redis. The
// moment a slot is spent is read under the lock: no later spend can be
// judged by an earlier clock reading.
func (ls *leases) spend(w Want, weight int) (h held, got Got, ok bool, ask int) {
	sh := ls.shard(w.Key)
	sh.mu.Lock()
	now := mono(time.Now())
	l := sh.m[w.Key]
	if l == nil {
		if len(sh.m) >= leaseShardCap { // a flood of keys: those beyond go to Redis
			sh.mu.Unlock()
			return h, got, false, 0
		}
		l = &lease{since: now}
		sh.m[w.Key] = l
	}
	if d := now - l.since; d >= int64(ls.spending) {
		l.prev = 0
		if d < 2*int64(ls.spending) {
			l.prev = l.hits
		}
		l.hits, l.since = 0, now
	}
	l.hits += weight
	var back []string
	if !l.cur.usable(weight, now) && l.next.usable(weight, now) {
		back = l.cur.unspent()
		l.cur, l.next = l.next, slots{}
	}
	demand, prefetch := min(max(l.prev, l.hits), maxLease), false
	if ok = l.cur.usable(weight, now); ok {
		h = held{key: w.Key, name: l.cur.name, from: l.cur.granted - l.cur.left + 1, n: weight}
		l.cur.left -= weight
		got = Got{Remaining: l.cur.remaining + l.cur.left, At: l.cur.at}
		prefetch = !l.asking && l.next.left == 0 && demand >= minLease &&
			(2*l.cur.left < l.cur.granted || now+int64(ls.spending)/2 > l.cur.until)
		l.asking = l.asking || prefetch
	} else if !l.asking && demand >= minLease && now >= l.cool {
		l.asking = true
		ask = demand
	}
	sh.mu.Unlock()
	if back != nil {
		go ls.back(w.Key, back)
	}
	if prefetch {
		go ls.prefetch(w, demand)
	}
	return h, got, ok, ask
}

// unspend returns the slots of h (a decision that another window had no
// slot for): to the lease while it can still spend them, else to Redis.
func (ls *leases) unspend(h held) {
	sh := ls.shard(h.key)
	sh.mu.Lock()
	now := mono(time.Now())
	if l := sh.m[h.key]; l != nil {
		for _, s := range []*slots{&l.cur, &l.next} {
			if s.name == h.name && now < s.until {
				s.left += h.n // slots are alike: the last `left` names stay unspent
				sh.mu.Unlock()
				return
			}
		}
	}
	sh.mu.Unlock()
	go ls.back(h.key, names(h.name, h.from, h.n))
}

// granted ends an ask: g's slots scored at, spendable until until; the
// next slots while the current ones last. Slots it replaces go back to
// Redis, and so do its own left unspent at their end.
func (ls *leases) granted(key string, g grant, at, until int64, remaining int) {
	sh := ls.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := sh.m[key]
	if l == nil {
		return
	}
	l.asking = false
	if g.n == 0 {
		return
	}
	s := slots{name: g.name, granted: g.n, left: g.n, until: until, at: at, remaining: remaining}
	var back []string
	if now := mono(time.Now()); l.cur.usable(1, now) {
		back, l.next = l.next.unspent(), s
	} else {
		back, l.cur = l.cur.unspent(), s
	}
	if back != nil {
		go ls.back(key, back)
	}
	time.AfterFunc(time.Duration(until-mono(time.Now())), func() { ls.expire(key, g.name) })
}

// expire gives back what is left of key's slots named name at their end.
func (ls *leases) expire(key, name string) {
	sh := ls.shard(key)
	sh.mu.Lock()
	var back []string
	if l := sh.m[key]; l != nil {
		for _, s := range []*slots{&l.cur, &l.next} {
			if s.name == name {
				if 2*s.left > s.granted { // mostly unspent: leases do not pay here now
					l.cool = mono(time.Now()) + coolFor*int64(ls.spending)
				}
				back = s.unspent()
			}
		}
	}
	sh.mu.Unlock()
	if back != nil {
		ls.back(key, back)
	}
}

// names are the members of n slots from `from`.
func names(name string, from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = name + strconv.Itoa(from+i)
	}
	return out
}

// sweep drops the leases that ran out and saw no decision for two
// spending times (their slots are back or on the way).
func (ls *leases) sweep(now int64) {
	for i := range ls.shards {
		sh := &ls.shards[i]
		sh.mu.Lock()
		for k, l := range sh.m {
			if !l.asking && now >= l.cur.until && now >= l.next.until && now-l.since >= 2*int64(ls.spending) {
				for _, s := range []*slots{&l.cur, &l.next} {
					if back := s.unspent(); back != nil { // its expiry has not run yet
						go ls.back(k, back)
					}
				}
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}
