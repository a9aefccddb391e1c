// Package soldout is the one local "sold out" flag and the one subscriber to
// the stock-event channel, shared by the backend and the proxy.
//
// A flag says "this activity had no unit left when we last asked"; it is
// trusted until its TTL ends or until news arrives that the activity changed
// (a unit given back, stock raised, a sale rebuilt or edited by an admin):
// the activity id PUBLISHed on reservation.Channel. Every such event clears
// the activity's flag on every instance.
//
// The race rule: a caller takes a Token for the activity before the request
// whose answer may set the flag, and Set is refused when an event for that
// activity (or a resubscription, which may have missed events) arrived since
// the token was taken. So an answer "sold out" that predates the news can
// never bring the flag back, and news about another activity does not block
// this one. No clock takes part in the rule: tokens are event counters.
package soldout

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Token is the event count seen before a request; see Flags.Set.
type Token uint64

// Flags is a set of activity ids, each trusted until its own expiry.
type Flags struct {
	ttl time.Duration

	mu    sync.RWMutex
	until map[int64]time.Time
	// seq counts events; last is the seq of each activity's latest event, and
	// floor the seq below which every token is refused (a resubscription, or
	// old entries of last pruned away).
	seq, floor uint64
	last       map[int64]uint64
	lastAt     map[int64]time.Time
}

// NewFlags keeps flags for ttl.
func NewFlags(ttl time.Duration) *Flags {
	return &Flags{ttl: ttl, until: map[int64]time.Time{}, last: map[int64]uint64{}, lastAt: map[int64]time.Time{}}
}

// TTL is how long a flag is trusted without news.
func (f *Flags) TTL() time.Duration { return f.ttl }

// Token is taken before the request whose answer may set a flag.
func (f *Flags) Token() Token {
	f.mu.RLock()
	t := f.seq
	f.mu.RUnlock()
	return Token(t)
}

// Has reports whether id is flagged at now.
func (f *Flags) Has(id int64, now time.Time) bool {
	f.mu.RLock()
	t, ok := f.until[id]
	f.mu.RUnlock()
	return ok && now.Before(t)
}

// Set flags id until now+TTL, unless news about id (or a resubscription)
// arrived after tok was taken. It reports whether the flag was set.
func (f *Flags) Set(id int64, tok Token, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if uint64(tok) < f.floor || f.last[id] > uint64(tok) {
		return false
	}
	if len(f.until) >= 64 { // keep the map small: drop expired ids
		for k, t := range f.until {
			if !now.Before(t) {
				delete(f.until, k)
			}
		}
	}
	f.until[id] = now.Add(f.ttl)
	return true
}

// Clear drops id's flag: news about id arrived.
func (f *Flags) Clear(id int64, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	delete(f.until, id)
	f.last[id] = f.seq
	f.lastAt[id] = now
	// An event older than the longest a request may still be in flight with an
	// older token cannot race any more; forgetting it raises the floor, which
	// only ever refuses more.
	if len(f.last) >= 1024 {
		for k, at := range f.lastAt {
			if now.Sub(at) > time.Minute {
				f.floor = max(f.floor, f.last[k])
				delete(f.last, k)
				delete(f.lastAt, k)
			}
		}
	}
}

// ClearAll drops every flag (events may have been missed) and refuses every
// token taken before.
func (f *Flags) ClearAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	f.floor = f.seq
	clear(f.until)
	clear(f.last)
	clear(f.lastAt)
}

// Listener hears the stock events of one subscription.
type Listener interface {
	// Changed: news about activity id.
	Changed(id int64)
	// Reset: (re)subscribed; events sent meanwhile are lost.
	Reset()
}

// Changed makes Flags a Listener.
func (f *Flags) Changed(id int64) { f.Clear(id, time.Now()) }

// Reset makes Flags a Listener.
func (f *Flags) Reset() { f.ClearAll() }

// Watch subscribes to channel and tells every listener of each event until
// ctx ends. go-redis resubscribes after a lost connection; each
// (re)subscription resets the listeners, since events sent while the
// subscription was down are lost (until then, flags expire by their TTL).
// ready, when not nil, is closed once the first subscription is confirmed or
// could not be confirmed within two seconds.
func Watch(ctx context.Context, rdb redis.UniversalClient, channel string, log *slog.Logger, ready chan<- struct{}, ls ...Listener) {
	ps := rdb.Subscribe(ctx, channel)
	defer ps.Close()
	msgs := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
	var timeout <-chan time.Time
	if ready != nil {
		t := time.NewTimer(2 * time.Second)
		defer t.Stop()
		timeout = t.C
	}
	signal := func() {
		if ready != nil {
			close(ready)
			ready, timeout = nil, nil
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-timeout:
			log.Warn("stock events: subscription not confirmed yet; flags expire by TTL meanwhile", "channel", channel)
			signal()
		case m, ok := <-msgs:
			if !ok {
				return
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind != "subscribe" {
					continue
				}
				for _, l := range ls {
					l.Reset()
				}
				log.Debug("stock events subscribed", "channel", m.Channel)
				signal()
			case *redis.Message:
				id, err := strconv.ParseInt(m.Payload, 10, 64)
				if err != nil || id <= 0 {
					log.Warn("stock event with a bad activity id", "channel", channel, "payload", m.Payload)
					continue
				}
				for _, l := range ls {
					l.Changed(id)
				}
			}
		}
	}
}
