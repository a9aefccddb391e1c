package sale

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// stateCache keeps each activity's sale state for a short TTL, so that a
// read flood costs at most one Redis read per activity per TTL on this
// backend; a miss is one flight per activity, which every concurrent reader
// joins. When Redis fails the flight falls back to one MySQL read, and the
// readers that arrive meanwhile get the last known state marked stale
// instead of waiting (or wait when there is none): never a read per request.
//
// News about an activity (a stock event, this backend's sold-out answer, an
// admin change) invalidates its entry at once; a flight that started before
// the news still answers the readers that joined it, but its result is not
// kept.
type stateCache struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[int64]*stateEntry
}

type stateEntry struct {
	view  ActivityView // last known; State is derived at answer time
	known bool         // view holds a state read from Redis or MySQL
	fresh bool         // false after news: the next reader starts a flight
	gen   uint64       // counts the news about this activity
	fl    *stateFlight // in progress, or nil
}

type stateFlight struct {
	gen      uint64
	done     chan struct{}
	fallback chan struct{} // closed when the flight turns to MySQL
	view     ActivityView
	err      error
}

// joinPatience is how long a reader that has a last known state waits for the
// flight it joined: a healthy Redis answers well within it, a slow or failed
// one does not hold the flood up (the readers get the last known state,
// marked stale).
const joinPatience = 20 * time.Millisecond

func newStateCache(ttl time.Duration) *stateCache {
	return &stateCache{ttl: ttl, m: map[int64]*stateEntry{}}
}

// lookup returns a fresh view, or the flight to join (leader: the caller
// must run it and call finish), and the last known view if any.
func (c *stateCache) lookup(id int64, now time.Time) (v ActivityView, hit bool, fl *stateFlight, leader bool, last ActivityView, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[id]
	if e == nil {
		c.prune(now)
		e = &stateEntry{}
		c.m[id] = e
	}
	if e.known && e.fresh && now.Sub(e.view.AsOf) < c.ttl {
		return e.view, true, nil, false, ActivityView{}, false
	}
	if e.fl != nil {
		return ActivityView{}, false, e.fl, false, e.view, e.known
	}
	e.fl = &stateFlight{gen: e.gen, done: make(chan struct{}), fallback: make(chan struct{})}
	return ActivityView{}, false, e.fl, true, e.view, e.known
}

// finish records a flight's result; it is kept only when no news arrived
// since the flight started.
func (c *stateCache) finish(id int64, fl *stateFlight, keep bool) {
	c.mu.Lock()
	if e := c.m[id]; e != nil {
		if e.fl == fl {
			e.fl = nil
		}
		if keep && e.gen == fl.gen && fl.err == nil {
			e.view, e.known, e.fresh = fl.view, true, true
		}
	}
	c.mu.Unlock()
	close(fl.done)
}

// invalidate: news about id. The next reader starts a new flight.
func (c *stateCache) invalidate(id int64) {
	c.mu.Lock()
	if e := c.m[id]; e != nil {
		e.gen++
		e.fresh = false
		e.fl = nil
	}
	c.mu.Unlock()
}

// invalidateAll: news may have been missed.
func (c *stateCache) invalidateAll() {
	c.mu.Lock()
	for _, e := range c.m {
		e.gen++
		e.fresh = false
		e.fl = nil
	}
	c.mu.Unlock()
}

// soldOut: this backend saw the activity sold out; drop a cached state that
// still shows units, so readers see it within one TTL or sooner.
func (c *stateCache) soldOut(id int64) {
	c.mu.Lock()
	if e := c.m[id]; e != nil && e.known && e.view.Available > 0 {
		e.gen++
		e.fresh = false
		e.fl = nil
	}
	c.mu.Unlock()
}

// prune drops entries nobody read for a minute once the map grows, so ids
// that were asked for once do not pile up.
func (c *stateCache) prune(now time.Time) {
	if len(c.m) < 1024 {
		return
	}
	for id, e := range c.m {
		if e.fl == nil && now.Sub(e.view.AsOf) > time.Minute {
			delete(c.m, id)
		}
	}
}

// StateTTL is how long a sale state is answered from the local cache.
func (s *Service) StateTTL() time.Duration { return s.state.ttl }

// Activity returns the sale state from the local cache, refreshed from Redis
// (or from MySQL when Redis fails or has no such sale) at most once per TTL
// per activity, by one flight at a time. AsOf tells when the state was read;
// Stale marks a last known state answered because the read in flight is a
// fallback or failed.
func (s *Service) Activity(ctx context.Context, id int64) (ActivityView, error) {
	now := s.now()
	if s.missing.Has(id, now) {
		return ActivityView{}, ErrActivityNotFound
	}
	v, hit, fl, leader, last, known := s.state.lookup(id, now)
	if hit {
		s.m.stateRead("hit")
		return withState(v, now), nil
	}
	if !leader {
		s.m.stateRead("joined")
		if !known {
			<-fl.done // nothing to answer meanwhile
			return s.flightAnswer(fl, last, known)
		}
		patience := time.NewTimer(joinPatience)
		defer patience.Stop()
		select {
		case <-fl.done:
			return s.flightAnswer(fl, last, known)
		case <-fl.fallback:
		case <-patience.C:
		}
		s.m.stateRead("stale")
		last.Stale = true
		return withState(last, s.now()), nil
	}
	s.m.stateRead("miss")
	// Shared by the readers that join: not cancelled with the leader's request.
	var keep bool
	fl.view, keep, fl.err = s.readState(context.WithoutCancel(ctx), id, fl)
	s.state.finish(id, fl, keep)
	return s.flightAnswer(fl, last, known)
}

// flightAnswer is a finished flight's answer; when both Redis and MySQL
// failed, the last known state marked stale beats a 503.
func (s *Service) flightAnswer(fl *stateFlight, last ActivityView, known bool) (ActivityView, error) {
	if errors.Is(fl.err, ErrUnavailable) && known {
		s.m.stateRead("stale")
		last.Stale = true
		return withState(last, s.now()), nil
	}
	return withState(fl.view, s.now()), fl.err
}

// readState is the flight: Redis, else one MySQL read. keep is false for an
// answer that must not be cached (not found: the negative cache has it).
func (s *Service) readState(ctx context.Context, id int64, fl *stateFlight) (ActivityView, bool, error) {
	missTok := s.missing.Token()
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	sale, found, err := s.store.Sale(rctx, id)
	cancel()
	if err == nil && found {
		return ActivityView{
			ActivityID: id, Stock: sale.Total, Available: sale.Available(), Pending: sale.Pending,
			Sold: sale.Sold, PerUserLimit: sale.Limit, StartsAt: sale.Start, EndsAt: sale.End,
			AsOf: s.now(),
		}, true, nil
	}
	if err != nil {
		s.m.stateRead("fallback")
		s.log.Debug("activity from Redis failed; reading MySQL", "activity_id", id, "err", err)
	}
	close(fl.fallback)
	a, found, err := s.loadActivity(ctx, id)
	if err != nil {
		return ActivityView{}, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if !found {
		s.missing.Set(id, missTok, s.now())
		return ActivityView{}, false, ErrActivityNotFound
	}
	return mysqlView(id, a, s.now()), true, nil
}

func withState(v ActivityView, now time.Time) ActivityView {
	if v.ActivityID != 0 {
		v.State = stateAt(now, v.StartsAt, v.EndsAt, v.Available)
	}
	return v
}
