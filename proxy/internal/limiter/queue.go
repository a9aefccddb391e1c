package limiter

// The queue of decisions waiting for Redis: an op per decision, flushers
// that carry whatever waits on one script call, and the waiter's bound.

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/lua"
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
	timer    *time.Timer // its waiter's
}

// op states
const (
	opWaiting = iota // queued or in a call; its waiter waits
	opClaimed        // a flusher writes its answer and signals done
	opGone           // its waiter gave up: the flusher owns it
)

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
	// The op's own timer, kept while pooled: a wait allocates nothing.
	// (Since Go 1.23 a stopped timer delivers nothing stale on Reset.)
	if o.timer == nil {
		o.timer = time.NewTimer(time.Until(first))
	} else {
		o.timer.Reset(time.Until(first))
	}
	t := o.timer
	// Stopped on every path that keeps the op; on the paths that give it
	// up the timer has fired already, and must not be touched again: the
	// flusher may recycle the op, and its next waiter reset this timer.
	select {
	case <-o.done:
		t.Stop()
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
		t.Stop()
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
			t.Stop()
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
