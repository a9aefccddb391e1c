package limiter

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/seckill/seckill/lua"
)

// Redis is the Store shared by every proxy instance (lua/ratelimit.lua).
// Decisions wait in one bounded queue; whatever waits when a call leaves
// rides on it (one script call per batch on a node, one per hash tag in one
// pipeline on a cluster), so a crowd costs a round trip per batch, not per
// client, and batches grow with the load instead of the queue.
//
// Bounds: a decision waits at most twice the timeout for its answer (await);
// then it is shed (ErrShed: load) when Redis answered anything since it was
// queued, else it falls back to on_redis_error (a timeout error). The call
// itself may take longer, up to failAfter: on a host saturated by a crowd a
// reply that came in time is read late (the reading goroutine waits its
// turn behind thousands), and is still an exact answer for every decision
// still waiting on it; the hits of decisions that gave up are given back.
// Only an error, or a call unanswered for failAfter, is a Redis failure,
// which the breaker counts. Take returns within about twice the timeout.
type Redis struct {
	rdb     redis.Cmdable
	cluster bool
	id      string
	timeout time.Duration
	seq     atomic.Uint64
	queue   chan *op
	active  atomic.Int32 // flushers running
	br      breaker
	live    atomic.Int64
	lastOK  atomic.Int64 // mono ns: when the latest call or PING Redis answered was sent
	// mono ns: when Redis last answered a call within four timeouts
	lastQuick atomic.Int64
	calls     atomic.Int32 // script calls in flight
	late      atomic.Int64 // how late this host last woke a waiter (ns) ...
	lateAt    atomic.Int64 // ... and when (mono ns)
	pings     singleflight.Group
	leases    *leases
	backs     atomic.Int32 // lease slots queued or on their way back
	backMu    sync.Mutex
	backQ     []backItem
	backing   bool // a goroutine sends backQ
	m         *Metrics
	log       *slog.Logger
	pool      sync.Pool // *op
	bufs      sync.Pool // *takeBufs
}

const (
	// flushers: calls in flight at once. Redis runs one at a time, but on a
	// busy host a call's round trip is mostly waiting to be scheduled: with
	// four, a decision waits about a quarter of a call for its own to leave.
	flushers = 4
	maxBatch = 512  // decisions per call: a few ms of Redis time at most
	maxQueue = 8192 // decisions waiting for a call; past it, shed
	// liveness: an instance that has not heartbeaten for this long is not
	// live; every instance heartbeats at a third of it.
	liveness = 3 * time.Second
)

// NewRedis makes the Redis store; instance is this proxy's unique id.
func NewRedis(rdb redis.Cmdable, instance string, timeout time.Duration, m *Metrics, log *slog.Logger) *Redis {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_, cluster := rdb.(*redis.ClusterClient)
	s := &Redis{rdb: rdb, cluster: cluster, id: instance, timeout: timeout, queue: make(chan *op, maxQueue), m: m, log: log}
	s.leases = newLeases(s.giveBack, s.prefetch)
	s.pool.New = func() any { return &op{done: make(chan struct{}, 1)} }
	s.bufs.New = func() any { return new(takeBufs) }
	s.br.init(s.failAfter() + 2*timeout) // a probe's answer comes by then
	s.live.Store(1)
	return s
}

// Take implements Store. A decision whose windows are all leasable (lease.go)
// is made here when this instance holds a slot of each: all taken at one
// moment, or none (a window without one gives back the others at once, to
// their leases). Every other decision goes to Redis whole — a decision
// half from leases would be admitted after its leased slots were spent,
// possibly past their score — and may ask for the next leases.
func (s *Redis) Take(ws []Want, weight int, out []Got) (bool, error) {
	var sc leaseScratch
	live, all := s.Live(), weight > 0 && len(ws) <= len(sc.held)
	for _, w := range ws {
		all = all && leasable(w, live)
	}
	asked := false
	if all {
		for i, w := range ws {
			h, g, ok, ask := s.leases.spend(w, weight)
			if ok {
				out[i], sc.held[i] = g, h
				sc.n++
			}
			sc.ask[i], asked = ask, asked || ask > 0
		}
		if sc.n == len(ws) {
			s.m.leaseHits.Add(float64(sc.n))
			return true, nil
		}
		// A window this instance neither holds nor may ask a lease of
		// (too little demand here) keeps every decision of this kind in
		// Redis: leases of its other windows would go unspent. Ask none.
		lacking := false
		for i := range ws {
			lacking = lacking || sc.held[i].n == 0 && sc.ask[i] == 0
		}
		for i, w := range ws {
			if sc.held[i].n > 0 {
				s.leases.unspend(sc.held[i])
			}
			if lacking && sc.ask[i] > 0 {
				s.leases.granted(w.Key, grant{}, 0, 0, 0) // ends the ask
				sc.ask[i] = 0
			}
		}
		asked = asked && !lacking
	}
	now := mono(time.Now()) // before the call leaves: a lease's spending time starts no later
	asks, leased := []int(nil), []grant(nil)
	if asked {
		b := s.bufs.Get().(*takeBufs)
		defer s.bufs.Put(b)
		b.asks, b.leased = append(b.asks[:0], sc.ask[:len(ws)]...), append(b.leased[:0], make([]grant, len(ws))...)
		asks, leased = b.asks, b.leased
	}
	ok, err := s.take(ws, asks, leased, weight, out)
	for i, w := range ws {
		if asks != nil && asks[i] > 0 {
			s.granted(w.Key, leased[i], out[i], now)
		}
	}
	return ok, err
}

// granted hands a grant (maybe none) to the lease of key: its slots count
// at g.At + the spending time and may be spent until now + the spending
// time less a millisecond (local clock, now read before the call left).
func (s *Redis) granted(key string, gr grant, g Got, now int64) {
	sp := s.leases.spending
	s.leases.granted(key, gr, g.At+sp.Microseconds(), now+int64(sp-time.Millisecond), g.Remaining)
	s.m.leased.Add(float64(gr.n))
}

// takeBufs: the lease asks of a Take and what Redis granted.
type takeBufs struct {
	asks   []int
	leased []grant
}

// leaseScratch: the slots a Take took from leases and the lease slots it
// asks for (decisions of up to 8 windows lease).
type leaseScratch struct {
	held [8]held
	ask  [8]int
	n    int
}

// prefetch asks Redis for the next slots of w's lease: a decision of
// weight 0 (it takes nothing itself). Not while the breaker is open: it
// would take the probe's place.
func (s *Redis) prefetch(w Want, ask int) {
	now := mono(time.Now())
	ws, asks, leased, got := []Want{w}, []int{ask}, []grant{{}}, []Got{{}}
	if !s.br.isOpen() {
		if _, err := s.take(ws, asks, leased, 0, got); err != nil {
			leased[0] = grant{}
		}
	}
	s.granted(w.Key, leased[0], got[0], now)
}

// take decides ws in Redis. On a cluster a decision whose windows live
// under several hash tags is decided tag by tag, per-client tags first and
// global ones last (so another client is never refused by a global hit
// about to be removed); when one refuses, the hits taken before it are
// removed again (a brief under-admission, never an over-admission; lease
// slots granted before it stay).
func (s *Redis) take(ws []Want, asks []int, leased []grant, weight int, out []Got) (bool, error) {
	if !s.cluster || len(ws) == 1 {
		o := s.get(ws, asks, leased, weight, out)
		ok, err, gone := s.wait(o)
		if !gone {
			s.pool.Put(o)
		}
		return ok, err
	}
	order := make([]int, len(ws))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(tagOrder(ws[a].Key), tagOrder(ws[b].Key)) })
	sorted, got, back := make([]Want, len(ws)), make([]Got, len(ws)), map[string][]any{}
	sasks, sleased := make([]int, len(ws)), make([]grant, len(ws))
	for i, j := range order {
		sorted[i], got[i] = ws[j], Got{Remaining: -1}
		if asks != nil {
			sasks[i] = asks[j]
		}
	}
	ok, err := true, error(nil)
	for lo, hi := 0, 0; lo < len(sorted) && ok && err == nil; lo = hi {
		for hi = lo + 1; hi < len(sorted) && hashTag(sorted[hi].Key) == hashTag(sorted[lo].Key); hi++ {
		}
		o := s.get(sorted[lo:hi], sasks[lo:hi], sleased[lo:hi], weight, got[lo:hi])
		var gone bool
		if ok, err, gone = s.wait(o); ok && err == nil {
			for _, w := range sorted[lo:hi] {
				for j := range weight {
					back[w.Key] = append(back[w.Key], s.id+":"+strconv.FormatUint(o.seq, 10)+":"+strconv.FormatUint(o.idx, 10)+":"+strconv.Itoa(j+1))
				}
			}
		}
		if !gone {
			s.pool.Put(o)
		}
	}
	for i, j := range order {
		out[j] = got[i]
		if leased != nil {
			leased[j] = sleased[i]
		}
	}
	if (!ok || err != nil) && len(back) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		_, e := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k, m := range back {
				p.ZRem(ctx, k, m...)
			}
			return nil
		})
		if e != nil { // they stay until they slide out: under-admission only
			s.log.Debug("limiter give-back failed", "err", e)
		}
	}
	return ok, err
}

// hashTag is the part of a key Redis Cluster hashes ({...}), or the key.
func hashTag(k string) string {
	if i := strings.IndexByte(k, '{'); i >= 0 {
		if j := strings.IndexByte(k[i+1:], '}'); j > 0 {
			return k[i+1 : i+1+j]
		}
	}
	return k
}

// tagOrder sorts the global windows' tags after the per-client ones.
func tagOrder(k string) string {
	if t := hashTag(k); strings.HasPrefix(t, "rl:g:") {
		return "\xff" + t
	}
	return hashTag(k)
}

var errBreakerOpen = errors.New("redis circuit breaker open")

// Live is the last known number of live proxy instances (at least 1).
func (s *Redis) Live() int { return int(max(1, s.live.Load())) }

// Degraded reports whether the circuit breaker keeps Redis out of the path.
func (s *Redis) Degraded() bool { return s.br.isOpen() }

// Run heartbeats into the live-instance set until ctx ends, learning how
// many instances share the windows (on_redis_error = "local": limit / live).
func (s *Redis) Run(ctx context.Context, set string) {
	t := time.NewTicker(liveness / 3)
	defer t.Stop()
	for {
		if s.br.allow(time.Now()) {
			c, cancel := context.WithTimeout(ctx, s.failAfter())
			t0 := time.Now()
			n, err := lua.Instances.Run(c, s.rdb, []string{set}, s.id, liveness.Milliseconds()).Int64()
			cancel()
			if s.settle(t0, false, err); err == nil {
				s.live.Store(n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
