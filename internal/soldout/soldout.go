// Package soldout is the one local "sold out" flag and the one subscriber to
// the stock-event channel, shared by the backend and the proxy.
//
// A flag says "this activity had no unit left when we last asked"; it is
// trusted until its TTL ends or until news arrives that the activity changed
// (a unit given back, stock raised, a sale rebuilt or edited by an admin):
// the activity id PUBLISHed on reservation.Channel (a v1 event; event.go
// has both forms). Every such event clears the activity's flag on every
// instance.
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
	"errors"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ParseID parses a positive decimal 64-bit activity id (as in a request
// path) without allocating.
func ParseID(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 || b[0] == '0' {
		return 0, false
	}
	var id uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		id = id*10 + uint64(c-'0')
	}
	if id > math.MaxInt64 { // 19 digits stay below 2^64: no wrap before this check
		return 0, false
	}
	return int64(id), true
}

// Token is the event count seen before a request; see News.Since.
type Token uint64

// News counts the events per activity, so that an answer to a request sent
// before news about its activity can be told apart and refused. Memory stays
// bounded: events older than a minute are forgotten by raising a floor below
// which every token is refused (which only ever refuses more).
type News struct {
	mu sync.RWMutex
	// seq counts events; last is the seq of each activity's latest event, and
	// floor the seq below which every token is refused (a resubscription, or
	// old entries of last pruned away).
	seq, floor uint64
	last       map[int64]uint64
	lastAt     map[int64]time.Time
}

// NewNews returns an empty event record.
func NewNews() *News { return &News{last: map[int64]uint64{}, lastAt: map[int64]time.Time{}} }

// Token is taken before the request whose answer is to be kept.
func (n *News) Token() Token {
	n.mu.RLock()
	t := n.seq
	n.mu.RUnlock()
	return Token(t)
}

// Since reports whether news about id (or a reset) arrived after tok.
func (n *News) Since(id int64, tok Token) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.sinceLocked(id, tok)
}

func (n *News) sinceLocked(id int64, tok Token) bool {
	return uint64(tok) < n.floor || n.last[id] > uint64(tok)
}

// Add records news about id.
func (n *News) Add(id int64, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.addLocked(id, now)
}

func (n *News) addLocked(id int64, now time.Time) {
	n.seq++
	n.last[id] = n.seq
	n.lastAt[id] = now
	// An event older than the longest a request may still be in flight with an
	// older token cannot race any more.
	if len(n.last) >= 1024 {
		for k, at := range n.lastAt {
			if now.Sub(at) > time.Minute {
				n.floor = max(n.floor, n.last[k])
				delete(n.last, k)
				delete(n.lastAt, k)
			}
		}
	}
}

// Reset refuses every token taken before (events may have been missed).
func (n *News) Reset() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.resetLocked()
}

func (n *News) resetLocked() {
	n.seq++
	n.floor = n.seq
	clear(n.last)
	clear(n.lastAt)
}

// Flags is a set of activity ids, each trusted until its own expiry or until
// news about it.
type Flags struct {
	ttl   time.Duration
	news  *News
	mu    sync.RWMutex
	until map[int64]time.Time
}

// NewFlags keeps flags for ttl.
func NewFlags(ttl time.Duration) *Flags {
	return &Flags{ttl: ttl, news: NewNews(), until: map[int64]time.Time{}}
}

// TTL is how long a flag is trusted without news.
func (f *Flags) TTL() time.Duration { return f.ttl }

// Token is taken before the request whose answer may set a flag.
func (f *Flags) Token() Token { return f.news.Token() }

// Stale reports whether news about id (or a resubscription) arrived after
// tok was taken: what was read before then may no longer hold.
func (f *Flags) Stale(id int64, tok Token) bool { return f.news.Since(id, tok) }

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
	// f.mu is held across the check so that a Clear cannot slip between the
	// check and the write (Clear takes f.mu before recording the news).
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.news.Since(id, tok) {
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
	f.news.Add(id, now)
	delete(f.until, id)
}

// ClearAll drops every flag (events may have been missed) and refuses every
// token taken before.
func (f *Flags) ClearAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.news.Reset()
	clear(f.until)
}

// Listener hears the stock events of one subscription.
type Listener interface {
	// Changed: news about activity id.
	Changed(id int64)
	// Reset: (re)subscribed; events sent meanwhile are lost.
	Reset()
}

// SoldOutListener is a Listener that acts on the news "sold out" too (a v2
// event, event.go); other listeners ignore it.
type SoldOutListener interface {
	Listener
	SoldOut(id int64)
}

// Changed makes Flags a Listener.
func (f *Flags) Changed(id int64) { f.Clear(id, time.Now()) }

// Reset makes Flags a Listener.
func (f *Flags) Reset() { f.ClearAll() }

// Subscribed is a readiness check on the ready channel of a Watch: nil once
// it is closed, an error before. A process is not ready until then: an
// event sent before its subscription is lost to it, and a flag it learned
// meanwhile stays until the confirmation resets the listeners.
func Subscribed(ready <-chan struct{}) error {
	select {
	case <-ready:
		return nil
	default:
		return errors.New("stock events: subscription not confirmed yet")
	}
}

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
				ev, known, err := ParseEvent(m.Payload)
				if err != nil {
					log.Warn("stock event ignored", "channel", channel, "err", err)
					continue
				}
				if !known {
					log.Debug("stock event of a later version ignored", "channel", channel, "payload", m.Payload)
					continue
				}
				for _, l := range ls {
					if ev.Kind == KindSoldOut {
						if so, ok := l.(SoldOutListener); ok {
							so.SoldOut(ev.ActivityID)
						}
						continue
					}
					l.Changed(ev.ActivityID)
				}
			}
		}
	}
}
