package limiter

// What the Redis store knows of Redis's health: which answers vouch for
// it, which late ones are this host's, and what the breaker hears.

import (
	"context"
	"fmt"
	"time"
)

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

// answeredSince reports whether Redis vouched for itself after t (mono):
// it answered a call or PING this instance sent after t (alive, serving
// newer work), or any call within four timeouts of its sending, the answer
// arriving after t (alive, working through the calls queued ahead: a
// crowd's first burst puts several of this instance's calls in Redis at
// once). Then a decision still waiting since t met load, not a failure. A
// later answer to an older call does not vouch: a uniformly slow Redis
// gives only those.
func (s *Redis) answeredSince(t int64) bool {
	ok, quick := s.lastOK.Load(), s.lastQuick.Load()
	return ok != 0 && ok > t || quick != 0 && quick > t // 0: never
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
		if now.Sub(t0) <= 4*s.timeout {
			for at, q := mono(now), s.lastQuick.Load(); at > q && !s.lastQuick.CompareAndSwap(q, at); q = s.lastQuick.Load() {
			}
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
