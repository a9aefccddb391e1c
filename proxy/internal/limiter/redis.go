package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/lua"
)

// Redis is the Store shared by every proxy instance (lua/ratelimit.lua).
// Decisions wait in one bounded queue; whatever waits when a call leaves
// rides on it (one script call per batch on a node, one per hash tag in one
// pipeline on a cluster), so a crowd costs a round trip per batch, not per
// client, and batches grow with the load instead of the queue.
//
// Bounds: a decision that waited the timeout in the queue is shed (ErrShed:
// overload); a call is bounded by the timeout. A call that timed out while
// Redis answered another call sent after it, or a PING right after (judge),
// met load (Redis is alive, this host or its queue slow), not a failure: its
// decisions are shed too. Any other error is a Redis failure, which the
// breaker counts and on_redis_error answers. Take returns within about
// twice the timeout.
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
	lastOK  atomic.Int64 // mono ns when Redis last answered a call
	leases  *leases
	backs   atomic.Int32 // lease slots queued or on their way back
	backMu  sync.Mutex
	backQ   []backItem
	backing bool // a goroutine sends backQ
	m       *Metrics
	log     *slog.Logger
	pool    sync.Pool // *op
	bufs    sync.Pool // *takeBufs
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

// op is one decision in the queue; the flusher that takes it always
// signals done, within the bounds.
type op struct {
	ws       []Want
	asks     []int   // per window: lease slots to ask for (nil: none)
	leased   []grant // per window: lease slots granted
	weight   int
	out      []Got
	ok       bool
	err      error
	queued   time.Time
	seq, idx uint64 // its call and place there: members "<id>:<seq>:<idx>:<j>"
	done     chan struct{}
}

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
	s.br.init(3 * timeout)
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

// giveBack queues slots this instance will not spend for removal (ZREM).
// One goroutine at a time sends what is queued, a pipeline per round trip;
// past maxBack queued slots, they slide out instead (counted).
func (s *Redis) giveBack(key string, members []string) {
	if s.backs.Add(int32(len(members))) > maxBack {
		s.backs.Add(-int32(len(members)))
		s.m.backDropped.Add(float64(len(members)))
		return
	}
	s.backMu.Lock()
	s.backQ = append(s.backQ, backItem{key, members})
	start := !s.backing
	s.backing = true
	s.backMu.Unlock()
	if start {
		go s.sendBack()
	}
}

// backItem is a give-back of one window.
type backItem struct {
	key     string
	members []string
}

const maxBack = 1 << 16

// sendBack sends the queued give-backs until none is left.
func (s *Redis) sendBack() {
	for {
		s.backMu.Lock()
		q := s.backQ
		s.backQ = nil
		if len(q) == 0 {
			s.backing = false
			s.backMu.Unlock()
			return
		}
		s.backMu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, it := range q {
				args := make([]any, len(it.members))
				for i, m := range it.members {
					args[i] = m
				}
				p.ZRem(ctx, it.key, args...)
			}
			return nil
		})
		cancel()
		n := 0
		for _, it := range q {
			n += len(it.members)
		}
		if err == nil {
			s.m.returned.Add(float64(n))
		} else {
			s.m.backDropped.Add(float64(n))
			s.log.Debug("limiter lease give-back failed: the slots slide out", "err", err)
		}
		s.backs.Add(-int32(n))
	}
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
		defer s.pool.Put(o)
		return s.wait(o)
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
		if ok, err = s.wait(o); ok && err == nil {
			for _, w := range sorted[lo:hi] {
				for j := range weight {
					back[w.Key] = append(back[w.Key], s.id+":"+strconv.FormatUint(o.seq, 10)+":"+strconv.FormatUint(o.idx, 10)+":"+strconv.Itoa(j+1))
				}
			}
		}
		s.pool.Put(o)
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

func (s *Redis) get(ws []Want, asks []int, leased []grant, weight int, out []Got) *op {
	o := s.pool.Get().(*op)
	o.ws, o.asks, o.leased, o.weight, o.out, o.ok, o.err, o.queued = ws, asks, leased, weight, out, false, nil, time.Now()
	return o
}

// wait queues o and waits until a flusher decided it.
func (s *Redis) wait(o *op) (bool, error) {
	if !s.br.allow(o.queued) {
		s.m.skipped.Inc()
		return false, errBreakerOpen
	}
	s.m.queued.Add(1) // before the flusher that takes it subtracts
	select {
	case s.queue <- o:
	default:
		s.m.queued.Add(-1)
		s.m.shed.WithLabelValues("queue_full").Inc()
		return false, ErrShed
	}
	for n := s.active.Load(); n < flushers; n = s.active.Load() {
		if s.active.CompareAndSwap(n, n+1) {
			go s.flush()
			break
		}
	}
	<-o.done
	return o.ok, o.err
}

// flush sends what is queued until the queue is empty, then exits (an idle
// limiter holds no goroutine). An op queued just before the exit finds the
// count still at its bound; the last look after the decrement catches it.
func (s *Redis) flush() {
	batch := make([]*op, 0, maxBatch)
	for {
		batch = batch[:0]
	drain:
		for len(batch) < maxBatch {
			select {
			case o := <-s.queue:
				batch = append(batch, o)
			default:
				break drain
			}
		}
		if len(batch) > 0 {
			s.m.queued.Add(-int64(len(batch)))
			s.send(batch)
			continue
		}
		s.active.Add(-1)
		if n := s.active.Load(); len(s.queue) == 0 || n >= flushers || !s.active.CompareAndSwap(n, n+1) {
			return
		}
	}
}

// send decides a batch: sheds what waited too long, then one call per group
// (the batch on a node; each hash tag on a cluster).
func (s *Redis) send(batch []*op) {
	now := time.Now()
	groups, byTag := [][]*op{nil}, map[string]int{}
	for _, o := range batch {
		if now.Sub(o.queued) > s.timeout {
			s.m.shed.WithLabelValues("queue_wait").Inc()
			o.err = ErrShed
			o.done <- struct{}{}
			continue
		}
		g := 0
		if s.cluster {
			t := hashTag(o.ws[0].Key)
			if g = byTag[t]; g == 0 {
				g = len(groups)
				byTag[t] = g
				groups = append(groups, nil)
			}
		}
		groups[g] = append(groups[g], o)
	}
	if len(groups[0]) == 0 {
		groups = groups[1:]
	}
	if len(groups) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	cmds, keys, args := make([]*redis.Cmd, len(groups)), make([][]string, len(groups)), make([][]any, len(groups))
	live := s.Live()
	for g, ops := range groups {
		keys[g], args[g] = s.encode(ops, s.seq.Add(1), live)
	}
	t0 := time.Now()
	if len(groups) == 1 {
		cmds[0] = lua.RateLimit.Run(ctx, s.rdb, keys[0], args[0]...)
	} else {
		_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for g := range groups {
				cmds[g] = lua.RateLimit.EvalSha(ctx, p, keys[g], args[g]...)
			}
			return nil
		})
		for g, c := range cmds { // a node that lost the script (a promoted replica)
			if err := c.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				cmds[g] = lua.RateLimit.Run(ctx, s.rdb, keys[g], args[g]...)
			}
		}
	}
	s.m.latency.Observe(time.Since(t0).Seconds())
	var failed error
	var judged []*op // timed out with no answer of Redis since they left
	answered := false
	for g, ops := range groups {
		s.m.called.Add(1)
		s.m.batch.Observe(float64(len(ops)))
		err := s.decode(cmds[g], ops)
		switch {
		case err == nil:
			s.m.ok.Inc()
			answered = true
		case isTimeout(err) && s.answeredSince(mono(t0)):
			s.m.fail.Inc()
			s.m.shed.WithLabelValues("call_timeout").Add(float64(len(ops)))
			err = ErrShed
		case isTimeout(err):
			s.m.fail.Inc()
			for _, o := range ops {
				o.err = err
			}
			judged = append(judged, ops...)
			continue
		default:
			s.m.fail.Inc()
			failed = err
		}
		for _, o := range ops {
			o.err = err
			o.done <- struct{}{}
		}
	}
	// A call shed as load tells nothing of Redis: neither a failure for the
	// breaker nor an answer that would make the next timeout look like load.
	if failed != nil || answered {
		s.record(failed)
	}
	if len(judged) > 0 {
		go s.judge(judged)
	}
}

// oldest is when the op of ops that waits longest was queued.
func oldest(ops []*op) time.Time {
	t := ops[0].queued
	for _, o := range ops[1:] {
		if o.queued.Before(t) {
			t = o.queued
		}
	}
	return t
}

// judge decides what a timeout that no answer of Redis followed means: a
// PING answered within what is left of twice the timeout for the op queued
// first: load (shed, and Redis's answer for the breaker); else a failure
// (on_redis_error). With leases few calls are in flight, so a slow call
// seldom has a neighbour answered after it; a Redis paused or cut answers
// neither. It runs beside the flushers: the queue behind does not wait.
func (s *Redis) judge(ops []*op) {
	// what is left of twice the timeout for the op queued first (at most
	// the timeout): no decision waits longer for the verdict
	budget := min(s.timeout, 2*s.timeout-time.Since(oldest(ops)))
	err := error(context.DeadlineExceeded)
	if budget > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		err = s.rdb.Ping(ctx).Err()
		cancel()
	}
	if err == nil {
		s.m.shed.WithLabelValues("call_timeout").Add(float64(len(ops)))
		for _, o := range ops {
			o.err = ErrShed
		}
	}
	s.record(err) // the ops keep their timeout when Redis answered neither
	for _, o := range ops {
		o.done <- struct{}{}
	}
}

// answeredSince reports whether Redis answered this instance after t (mono).
func (s *Redis) answeredSince(t int64) bool {
	ok := s.lastOK.Load()
	return ok != 0 && ok > t // 0: never
}

// record tells the breaker how a call went (nil: Redis answered).
func (s *Redis) record(err error) {
	if err == nil {
		s.lastOK.Store(mono(time.Now()))
	}
	if err != nil {
		if s.br.failure(time.Now()) {
			s.log.Warn("redis limiter degraded: circuit open, rules fall back to on_redis_error", "err", err)
		}
	} else if s.br.success() {
		s.log.Info("redis limiter recovered: circuit closed")
	}
}

// encode lays out ops as the script reads them.
func (s *Redis) encode(ops []*op, seq uint64, live int) ([]string, []any) {
	var keys []string
	index := make(map[string]int, len(ops))
	args := append(make([]any, 0, 4+len(ops)*6), s.id, seq, live, s.leases.spending.Milliseconds())
	for i, o := range ops {
		o.seq, o.idx = seq, uint64(i+1)
		args = append(args, o.weight, len(o.ws))
		for j, w := range o.ws {
			k, ok := index[w.Key]
			if !ok {
				keys = append(keys, w.Key)
				k = len(keys)
				index[w.Key] = k
			}
			ask := 0
			if o.asks != nil {
				ask = o.asks[j]
			}
			args = append(args, k, w.Limit, max(1, w.Length.Milliseconds()), ask)
		}
	}
	return keys, args
}

// decode spreads a call's reply over its ops.
func (s *Redis) decode(c *redis.Cmd, ops []*op) error {
	r, err := c.Int64Slice()
	if err != nil {
		return err
	}
	i := 1
	for _, o := range ops {
		need := 1 + 3*len(o.ws) // its flag, per window 3 values and leased where asked
		for w := range o.asks {
			if o.asks[w] > 0 {
				need++
			}
		}
		if i+need > len(r) {
			return fmt.Errorf("limiter: short ratelimit reply (%d values)", len(r))
		}
		o.ok = r[i] == 1
		for w := range o.ws {
			o.out[w] = Got{Full: r[i+1] == 1, Remaining: int(r[i+2]), Reset: time.Duration(r[i+3]) * time.Millisecond, At: r[0]}
			i += 3
			if o.asks != nil && o.asks[w] > 0 { // the script says leased only where asked
				if n := int(r[i+1]); n > 0 {
					o.leased[w] = grant{n: n, name: s.id + ":" + strconv.FormatUint(o.seq, 10) + ":" + strconv.FormatUint(o.idx, 10) + ":l"}
				}
				i++
			}
		}
		i++
	}
	return nil
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
			c, cancel := context.WithTimeout(ctx, s.timeout)
			n, err := lua.Instances.Run(c, s.rdb, []string{set}, s.id, liveness.Milliseconds()).Int64()
			cancel()
			if s.record(err); err == nil {
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
