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
// Redis answered another call sent beside it met load (Redis is alive, this
// host or its queue slow), not a failure: its decisions are shed too. Any
// other error is a Redis failure, which the breaker counts and
// on_redis_error answers. Take returns within about twice the timeout.
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
	m       *Metrics
	log     *slog.Logger
	pool    sync.Pool
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
	s.pool.New = func() any { return &op{done: make(chan struct{}, 1)} }
	s.br.init()
	s.live.Store(1)
	return s
}

// Take implements Store. On a cluster a decision whose windows live under
// several hash tags is decided tag by tag, per-client tags first and global
// ones last (so another client is never refused by a global hit about to be
// removed); when one refuses, the hits taken before it are removed again (a
// brief under-admission, never an over-admission).
func (s *Redis) Take(ws []Want, weight int, out []Got) (bool, error) {
	if !s.cluster || len(ws) == 1 {
		o := s.get(ws, weight, out)
		defer s.pool.Put(o)
		return s.wait(o)
	}
	order := make([]int, len(ws))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(tagOrder(ws[a].Key), tagOrder(ws[b].Key)) })
	sorted, got, back := make([]Want, len(ws)), make([]Got, len(ws)), map[string][]any{}
	for i, j := range order {
		sorted[i], got[i] = ws[j], Got{Remaining: -1}
	}
	ok, err := true, error(nil)
	for lo, hi := 0, 0; lo < len(sorted) && ok && err == nil; lo = hi {
		for hi = lo + 1; hi < len(sorted) && hashTag(sorted[hi].Key) == hashTag(sorted[lo].Key); hi++ {
		}
		o := s.get(sorted[lo:hi], weight, got[lo:hi])
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

func (s *Redis) get(ws []Want, weight int, out []Got) *op {
	o := s.pool.Get().(*op)
	o.ws, o.weight, o.out, o.ok, o.err, o.queued = ws, weight, out, false, nil, time.Now()
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
	for g, ops := range groups {
		keys[g], args[g] = s.encode(ops, s.seq.Add(1))
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
	answered := false
	for g, ops := range groups {
		s.m.called.Add(1)
		s.m.batch.Observe(float64(len(ops)))
		err := decode(cmds[g], ops)
		switch {
		case err == nil:
			s.m.ok.Inc()
			answered = true
		case isTimeout(err) && s.lastOK.Load() > mono(t0):
			s.m.fail.Inc()
			s.m.shed.WithLabelValues("call_timeout").Add(float64(len(ops)))
			err = ErrShed
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
func (s *Redis) encode(ops []*op, seq uint64) ([]string, []any) {
	var keys []string
	index := make(map[string]int, len(ops))
	args := append(make([]any, 0, 2+len(ops)*5), s.id, seq)
	for i, o := range ops {
		o.seq, o.idx = seq, uint64(i+1)
		args = append(args, o.weight, len(o.ws))
		for _, w := range o.ws {
			k, ok := index[w.Key]
			if !ok {
				keys = append(keys, w.Key)
				k = len(keys)
				index[w.Key] = k
			}
			args = append(args, k, w.Limit, max(1, w.Length.Milliseconds()))
		}
	}
	return keys, args
}

// decode spreads a call's reply over its ops.
func decode(c *redis.Cmd, ops []*op) error {
	r, err := c.Int64Slice()
	if err != nil {
		return err
	}
	i := 1
	for _, o := range ops {
		if i+1+3*len(o.ws) > len(r) {
			return fmt.Errorf("limiter: short ratelimit reply (%d values)", len(r))
		}
		o.ok = r[i] == 1
		for w := range o.ws {
			o.out[w] = Got{Full: r[i+1] == 1, Remaining: int(r[i+2]), Reset: time.Duration(r[i+3]) * time.Millisecond, At: r[0]}
			i += 3
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
