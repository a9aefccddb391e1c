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
	calls   atomic.Int32 // script calls in flight
	late    atomic.Int64 // how late this host last woke a waiter (ns) ...
	lateAt  atomic.Int64 // ... and when (mono ns)
	pings   singleflight.Group
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

// op is one decision in the queue. ws and asks are its own copies (a
// flusher may still read them after the waiter gave up); out and leased
// are the waiter's, written only by the flusher that claimed the op
// (state opWaiting -> opClaimed), which then signals done. A waiter that
// gives up first (opWaiting -> opGone) leaves the op to the flusher, which
// gives back what Redis granted it and recycles it.
type op struct {
	ws       []Want
	asks     []int   // per window: lease slots to ask for (nil: none)
	askBuf   []int   // asks' storage, kept while pooled
	leased   []grant // per window: lease slots granted
	weight   int
	out      []Got
	ok       bool
	err      error
	queued   time.Time
	seq, idx uint64 // its call and place there: members "<id>:<seq>:<idx>:<j>"
	state    atomic.Int32
	done     chan struct{}
}

// op states
const (
	opWaiting = iota // queued or in a call; its waiter waits
	opClaimed        // a flusher writes its answer and signals done
	opGone           // its waiter gave up: the flusher owns it
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

func (s *Redis) get(ws []Want, asks []int, leased []grant, weight int, out []Got) *op {
	o := s.pool.Get().(*op)
	o.ws = append(o.ws[:0], ws...)
	o.asks = nil
	if asks != nil {
		o.asks = append(o.askBuf[:0], asks...)
		o.askBuf = o.asks
	}
	o.leased, o.weight, o.out, o.ok, o.err, o.queued = leased, weight, out, false, nil, time.Now()
	o.state.Store(opWaiting)
	return o
}

// wait queues o and waits for its answer, at most twice the timeout from
// when it was queued. Past the timeout with no answer of Redis since then,
// a PING goes (one at a time for all waiters): Redis alive makes the bound
// a shed, not a fallback (with leases few calls are in flight, so a slow
// call seldom has a neighbour to vouch for Redis). gone: o now belongs to
// its flusher (the waiter gave up), not to be recycled by the caller.
func (s *Redis) wait(o *op) (ok bool, err error, gone bool) {
	if !s.br.allow(o.queued) {
		s.m.skipped.Inc()
		return false, errBreakerOpen, false
	}
	s.m.queued.Add(1) // before the flusher that takes it subtracts
	select {
	case s.queue <- o:
	default:
		s.m.queued.Add(-1)
		if !s.answeredSince(mono(time.Now()) - int64(2*s.timeout)) {
			return false, errSilent, false // full behind calls Redis has not answered
		}
		s.m.shed.WithLabelValues("queue_full").Inc()
		return false, ErrShed, false
	}
	for n := s.active.Load(); n < flushers; n = s.active.Load() {
		if s.active.CompareAndSwap(n, n+1) {
			go s.flush()
			break
		}
	}
	first := o.queued.Add(s.timeout)
	t := time.NewTimer(time.Until(first))
	defer t.Stop()
	select {
	case <-o.done:
		return o.ok, o.err, false
	case <-t.C:
		s.woke(first)
	}
	if !s.answeredSince(mono(o.queued)) {
		s.ping()
	}
	due := o.queued.Add(2 * s.timeout)
	t.Reset(time.Until(due))
	select {
	case <-o.done:
		return o.ok, o.err, false
	case <-t.C:
	}
	// Woken later than the timeout past the bound: this host's run queue,
	// not Redis (the flusher reading the reply waits its turn the same
	// way). Wait as long once more before giving up.
	if late := s.woke(due); late > s.timeout {
		s.m.lateWaits.Inc()
		t.Reset(late)
		select {
		case <-o.done:
			return o.ok, o.err, false
		case <-t.C:
		}
	}
	if !o.state.CompareAndSwap(opWaiting, opGone) { // claimed: its answer is being written
		<-o.done
		return o.ok, o.err, false
	}
	if s.answeredSince(mono(o.queued)) || s.hostLate(time.Now()) { // Redis alive, or this host too late to tell
		s.m.shed.WithLabelValues("wait_timeout").Inc()
		return false, ErrShed, true
	}
	return false, errSilent, true
}

// errSilent: Redis answered nothing (no call, no PING) within a decision's
// bound; the decision falls back to on_redis_error as a timeout.
var errSilent = fmt.Errorf("limiter: redis answered nothing within the bound: %w", context.DeadlineExceeded)

// ping sends one PING (one at a time, whoever asks); an answer is Redis
// alive (settle), however late this host reads it.
func (s *Redis) ping() {
	s.pings.DoChan("", func() (any, error) {
		ctx, cancel := context.WithTimeout(context.Background(), s.failAfter())
		defer cancel()
		t0 := time.Now()
		err := s.rdb.Ping(ctx).Err()
		if err == nil { // a failure is the calls' to tell: not counted twice
			s.settle(t0, false, nil)
		}
		return nil, err
	})
}

// failAfter is how long Redis may leave a call or a PING unanswered before
// the breaker counts a failure: ten timeouts, at least a second. A reply
// later than the timeout but within it is load (this host, or the calls
// ahead), not a failure.
func (s *Redis) failAfter() time.Duration { return max(time.Second, 10*s.timeout) }

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

// send decides a batch: one call per group (the batch on a node; each hash
// tag on a cluster), bounded by failAfter; ops whose waiter gave up before
// the call left are dropped.
func (s *Redis) send(batch []*op) {
	groups, byTag := [][]*op{nil}, map[string]int{}
	for _, o := range batch {
		if o.state.Load() == opGone {
			s.pool.Put(o)
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
	ctx, cancel := context.WithTimeout(context.Background(), s.failAfter())
	defer cancel()
	cmds, keys, args := make([]*redis.Cmd, len(groups)), make([][]string, len(groups)), make([][]any, len(groups))
	live := s.Live()
	for g, ops := range groups {
		keys[g], args[g] = s.encode(ops, s.seq.Add(1), live)
	}
	t0, alone := time.Now(), s.calls.Add(1) == 1
	defer s.calls.Add(-1)
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
	answered := false
	for g, ops := range groups {
		s.m.called.Add(1)
		s.m.batch.Observe(float64(len(ops)))
		err := s.decode(cmds[g], ops)
		switch {
		case err == nil:
			s.m.ok.Inc()
			answered = true
		case isTimeout(err) && (s.answeredSince(mono(t0)) || s.hostLate(time.Now())):
			// past the read deadline while Redis answered others, or on
			// a host too late to tell: load, not a failure; the ops still
			// waited on are shed
			s.m.fail.Inc()
			for _, o := range ops {
				if o.state.Load() == opWaiting {
					s.m.shed.WithLabelValues("wait_timeout").Inc()
				}
			}
			err = ErrShed
		default:
			s.m.fail.Inc()
			failed = err
		}
		if err != nil {
			for _, o := range ops {
				if o.state.CompareAndSwap(opWaiting, opClaimed) {
					o.err = err
					o.done <- struct{}{}
				} else {
					s.pool.Put(o)
				}
			}
		}
	}
	if failed != nil {
		s.record(failed)
	} else if answered {
		s.settle(t0, alone, nil)
	}
}

// answeredSince reports whether Redis answered a call or PING this
// instance sent after t (mono): then Redis is alive and serves newer work,
// and a decision still waiting since t met load (the calls ahead of it,
// this host), not a failure. (An answer to an older call does not vouch:
// a uniformly slow Redis answers those too, late.)
func (s *Redis) answeredSince(t int64) bool {
	ok := s.lastOK.Load()
	return ok != 0 && ok > t // 0: never
}

// settle tells the breaker how a call or PING sent at t0 went. An answer
// is Redis alive, unless it came later than twice the timeout to a call
// sent alone (none of this instance's ahead of it in Redis) while this
// host wakes its waiters on time: Redis slow, a failure. A late answer
// behind other calls is Redis busy with them (a crowd's first burst), and
// on a saturated host this host's run queue: neither tells anything.
func (s *Redis) settle(t0 time.Time, alone bool, err error) {
	now := time.Now()
	if err == nil {
		for sent, ok := mono(t0), s.lastOK.Load(); sent > ok && !s.lastOK.CompareAndSwap(ok, sent); ok = s.lastOK.Load() {
		}
		if now.Sub(t0) > 2*s.timeout {
			if !alone || s.hostLate(now) {
				return
			}
			err = errSlow
		}
	}
	s.record(err)
}

// errSlow: Redis answered later than twice the timeout on a host that was
// not itself late.
var errSlow = fmt.Errorf("limiter: redis answered later than twice redis_timeout: %w", context.DeadlineExceeded)

// woke notes how late this host woke a waiter whose timer was due at due.
func (s *Redis) woke(due time.Time) time.Duration {
	now := time.Now()
	late := now.Sub(due)
	s.late.Store(int64(late))
	s.lateAt.Store(mono(now))
	return late
}

// hostLate reports whether this host woke a waiter more than half a
// timeout late within the last second.
func (s *Redis) hostLate(now time.Time) bool {
	return s.late.Load() > int64(s.timeout/2) && mono(now)-s.lateAt.Load() < int64(time.Second)
}

// record tells the breaker how a call went (nil: Redis answered; see
// settle).
func (s *Redis) record(err error) {
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

// decode spreads a call's reply over its ops: each one still waited on is
// claimed, answered and signalled; the hits and lease slots of one whose
// waiter gave up go back (it was neither admitted nor told anything).
func (s *Redis) decode(c *redis.Cmd, ops []*op) error {
	r, err := c.Int64Slice()
	if err != nil {
		return err
	}
	need := 1 // the script's clock, then per op its flag, per window 3 values and leased where asked
	for _, o := range ops {
		need += 1 + 3*len(o.ws)
		for w := range o.asks {
			if o.asks[w] > 0 {
				need++
			}
		}
	}
	if need > len(r) { // checked before any op is claimed: a short reply fails them all alike
		return fmt.Errorf("limiter: short ratelimit reply (%d values, want %d)", len(r), need)
	}
	i := 1
	for _, o := range ops {
		mine := o.state.CompareAndSwap(opWaiting, opClaimed)
		ok := r[i] == 1
		for w := range o.ws {
			if mine {
				o.out[w] = Got{Full: r[i+1] == 1, Remaining: int(r[i+2]), Reset: time.Duration(r[i+3]) * time.Millisecond, At: r[0]}
			}
			i += 3
			if o.asks != nil && o.asks[w] > 0 { // the script says leased only where asked
				if n := int(r[i+1]); n > 0 {
					name := s.member(o, "l")
					if mine {
						o.leased[w] = grant{n: n, name: name}
					} else {
						s.giveBack(o.ws[w].Key, names(name, 1, n))
					}
				}
				i++
			}
		}
		i++
		if mine {
			o.ok = ok
			o.done <- struct{}{}
			continue
		}
		if ok && o.weight > 0 {
			for _, w := range o.ws {
				hits := make([]string, o.weight)
				for j := range hits {
					hits[j] = s.member(o, strconv.Itoa(j+1))
				}
				s.giveBack(w.Key, hits)
			}
		}
		s.pool.Put(o)
	}
	return nil
}

// member is the name of o's member with suffix j in its call's logs.
func (s *Redis) member(o *op, j string) string {
	return s.id + ":" + strconv.FormatUint(o.seq, 10) + ":" + strconv.FormatUint(o.idx, 10) + ":" + j
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
