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
// rides on it: on one node a batch is one script call, on a cluster one
// call per hash tag, sent as one pipeline (go-redis splits it per node). So
// a crowd of new clients costs a round trip per batch, not per client, and
// the batch grows with the load instead of the queue.
//
// Bounds: a decision that waited longer than the timeout before its call
// could leave is shed (ErrShed: overload, not failure); a call is bounded
// by the timeout and its error is a Redis failure, which the breaker
// counts. So Take returns within about twice the timeout.
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
	m       *Metrics
	log     *slog.Logger
	keys    string // the live-instance set
	pool    sync.Pool
}

const (
	// flushers: calls in flight at once. Redis runs one at a time; two hide
	// the round trip, more would only split batches.
	flushers = 2
	maxBatch = 512  // ops per call (a few ms of Redis time at most)
	maxQueue = 8192 // undecided requests waiting for a call; past it, shed
	// liveness: an instance that has not heartbeaten for this long is not
	// live. Every instance heartbeats at a third of it.
	liveness = 3 * time.Second
)

// op is one decision in the queue. Its waiter blocks until the flusher
// that took it signals done, which it always does within the bounds.
type op struct {
	ws     []Want
	weight int
	out    []Got
	ok     bool
	err    error
	queued time.Time
	seq    uint64 // the call that decided it, and its place there: its
	idx    int    // members are "<id>:<seq>:<idx>:<j>"
	done   chan struct{}
}

// NewRedis makes the Redis store. instance is this proxy's unique id
// (members of the logs carry it), keyPrefix is [redis] key_prefix.
func NewRedis(rdb redis.Cmdable, keyPrefix, instance string, timeout time.Duration, m *Metrics, log *slog.Logger) *Redis {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_, cluster := rdb.(*redis.ClusterClient)
	s := &Redis{rdb: rdb, cluster: cluster, id: instance, timeout: timeout, queue: make(chan *op, maxQueue), m: m, log: log,
		keys: keyPrefix + "{rl}:instances"}
	s.pool.New = func() any { return &op{done: make(chan struct{}, 1)} }
	s.br.init()
	s.live.Store(1)
	return s
}

// Take implements Store. On a cluster an op whose windows live under
// several hash tags is decided tag by tag, per-client tags first and global
// ones last, each as its own op; when one refuses, the hits taken under the
// tags before it are removed again (a brief under-admission of those
// windows, never an over-admission).
func (s *Redis) Take(ws []Want, weight int, out []Got) (bool, error) {
	if !s.cluster || len(ws) == 1 {
		return s.take(ws, weight, out)
	}
	order := make([]int, len(ws))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(tagOrder(ws[a].Key), tagOrder(ws[b].Key)) })
	sorted, got := make([]Want, len(ws)), make([]Got, len(ws))
	for i, j := range order {
		sorted[i] = ws[j]
	}
	var taken []Want
	var members []string
	ok, err := true, error(nil)
	for lo := 0; lo < len(sorted) && ok && err == nil; {
		hi := lo + 1
		for hi < len(sorted) && hashTag(sorted[hi].Key) == hashTag(sorted[lo].Key) {
			hi++
		}
		o := s.get(sorted[lo:hi], weight, got[lo:hi])
		ok, err = s.wait(o)
		if ok && err == nil {
			taken = append(taken, sorted[lo:hi]...)
			members = append(members, s.prefix(o))
		}
		s.pool.Put(o)
		for k := hi; k < len(sorted); k++ {
			got[k] = Got{Remaining: -1}
		}
		lo = hi
	}
	for i, j := range order {
		out[j] = got[i]
	}
	if (!ok || err != nil) && len(taken) > 0 {
		s.giveBack(taken, members, weight)
	}
	return ok, err
}

// take decides ws as one op.
func (s *Redis) take(ws []Want, weight int, out []Got) (bool, error) {
	o := s.get(ws, weight, out)
	ok, err := s.wait(o)
	s.pool.Put(o)
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
	select {
	case s.queue <- o:
	default:
		s.m.shed.WithLabelValues("queue_full").Inc()
		return false, ErrShed
	}
	s.m.queued.Add(1)
	s.kick()
	<-o.done
	return o.ok, o.err
}

// kick starts a flusher unless enough run; a flusher exits when it finds the
// queue empty, so an idle limiter holds no goroutine.
func (s *Redis) kick() {
	for {
		n := s.active.Load()
		if n >= flushers {
			return
		}
		if s.active.CompareAndSwap(n, n+1) {
			go s.flush()
			return
		}
	}
}

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
		if len(batch) == 0 {
			s.active.Add(-1)
			// An op queued after the drain but before the decrement found
			// every flusher running: look once more.
			if len(s.queue) > 0 {
				s.kick()
			}
			return
		}
		s.m.queued.Add(-int64(len(batch)))
		s.send(batch)
	}
}

// send decides a batch: sheds what waited too long, then one call per
// group (the whole batch on one node, each hash tag on a cluster).
func (s *Redis) send(batch []*op) {
	now := time.Now()
	live := batch[:0]
	for _, o := range batch {
		if now.Sub(o.queued) > s.timeout {
			s.m.shed.WithLabelValues("queue_wait").Inc()
			o.err = ErrShed
			o.done <- struct{}{}
			continue
		}
		live = append(live, o)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	seq := s.seq.Add(1)
	var groups [][]*op
	if !s.cluster {
		groups = [][]*op{live}
	} else {
		byTag := map[string]int{}
		for _, o := range live {
			t := hashTag(o.ws[0].Key)
			g, ok := byTag[t]
			if !ok {
				g = len(groups)
				byTag[t] = g
				groups = append(groups, nil)
			}
			groups[g] = append(groups[g], o)
		}
	}
	// On a cluster every group gets its own sequence number, so that its
	// members are unique (the op index restarts in each).
	cmds := make([]*redis.Cmd, len(groups))
	keys, args := make([][]string, len(groups)), make([][]any, len(groups))
	for g, ops := range groups {
		if g > 0 {
			seq = s.seq.Add(1)
		}
		keys[g], args[g] = s.encode(ops, seq)
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
	s.m.batch.Observe(float64(len(live)))
	var failed error
	for g, ops := range groups {
		s.m.called.Add(1)
		err := decode(cmds[g], ops)
		if err != nil {
			s.m.fail.Inc()
			failed = err
		} else {
			s.m.ok.Inc()
		}
		for _, o := range ops {
			o.err = err
			o.done <- struct{}{}
		}
	}
	if failed != nil {
		if s.br.failure(time.Now()) {
			s.log.Warn("redis limiter degraded: circuit open, rules fall back to on_redis_error", "err", failed)
		}
	} else if s.br.success() {
		s.log.Info("redis limiter recovered: circuit closed")
	}
}

// encode lays out ops as the script reads them.
func (s *Redis) encode(ops []*op, seq uint64) ([]string, []any) {
	var keys []string
	index := make(map[string]int, len(ops))
	args := make([]any, 0, 2+len(ops)*5)
	args = append(args, s.id, seq)
	for i, o := range ops {
		o.seq, o.idx = seq, i+1
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
	now, i := r[0], 1
	for _, o := range ops {
		if i+1+3*len(o.ws) > len(r) {
			return fmt.Errorf("limiter: short ratelimit reply (%d values)", len(r))
		}
		o.ok = r[i] == 1
		i++
		for w := range o.ws {
			o.out[w] = Got{Full: r[i] == 1, Remaining: int(r[i+1]), Reset: time.Duration(r[i+2]) * time.Millisecond, At: now}
			i += 3
		}
	}
	return nil
}

// prefix is the member prefix of o's hits.
func (s *Redis) prefix(o *op) string {
	return s.id + ":" + strconv.FormatUint(o.seq, 10) + ":" + strconv.Itoa(o.idx) + ":"
}

// giveBack removes the hits of a cluster op that a later hash tag refused
// (members[i] prefixes the hits in the windows of the i-th tag taken).
func (s *Redis) giveBack(ws []Want, members []string, weight int) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		t := 0
		for i, w := range ws {
			if i > 0 && hashTag(w.Key) != hashTag(ws[i-1].Key) {
				t++
			}
			m := make([]any, weight)
			for j := range weight {
				m[j] = members[t] + strconv.Itoa(j+1)
			}
			p.ZRem(ctx, w.Key, m...)
		}
		return nil
	})
	if err != nil {
		// The hits stay until they slide out: under-admission only.
		s.log.Debug("limiter give-back failed", "err", err)
	}
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

// tagOrder sorts the global windows' tags after the per-client ones, so
// that on a cluster a request holds a global hit only once its own windows
// admitted it: another client is never refused by a hit that is about to be
// given back.
func tagOrder(k string) string {
	t := hashTag(k)
	if strings.HasPrefix(t, "rl:g:") {
		return "\xff" + t
	}
	return t
}

var errBreakerOpen = errors.New("redis circuit breaker open")

// Live is the last known number of live proxy instances (at least 1).
func (s *Redis) Live() int { return int(max(1, s.live.Load())) }

// Degraded reports whether the circuit breaker keeps Redis out of the path.
func (s *Redis) Degraded() bool { return s.br.isOpen() }

// Run heartbeats until ctx ends, learning the live-instance count (for
// on_redis_error = "local": limit / live instances).
func (s *Redis) Run(ctx context.Context) {
	t := time.NewTicker(liveness / 3)
	defer t.Stop()
	for {
		s.heartbeat()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Redis) heartbeat() {
	if !s.br.allow(time.Now()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	n, err := lua.Instances.Run(ctx, s.rdb, []string{s.keys}, s.id, liveness.Milliseconds()).Int64()
	cancel()
	if err != nil {
		s.br.failure(time.Now())
		s.log.Debug("limiter heartbeat failed", "err", err)
		return
	}
	s.br.success()
	s.live.Store(n)
}
