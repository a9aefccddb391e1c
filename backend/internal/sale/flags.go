package sale

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// flags is a set of activity ids, each trusted until its own expiry. It backs
// the sold-out fast path and the short negative cache of unknown activities.
//
// A stock event (units became sellable again, or a sale was created) clears an
// id; epoch guards the race where the event is handled between a Redis answer
// and the set that follows it: set is skipped when any event arrived since the
// caller read the epoch (before its Redis call), so a flag can never outlive
// the news that cleared it.
type flags struct {
	ttl   time.Duration
	epoch atomic.Uint64
	mu    sync.RWMutex
	until map[int64]time.Time
}

func newFlags(ttl time.Duration) *flags {
	return &flags{ttl: ttl, until: make(map[int64]time.Time)}
}

// Epoch is read before the Redis call whose answer may set a flag.
func (f *flags) Epoch() uint64 { return f.epoch.Load() }

// Has reports whether id is flagged at now.
func (f *flags) Has(id int64, now time.Time) bool {
	f.mu.RLock()
	t, ok := f.until[id]
	f.mu.RUnlock()
	return ok && now.Before(t)
}

// Set flags id until now+ttl unless an event arrived since epoch.
func (f *flags) Set(id int64, epoch uint64, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.epoch.Load() != epoch {
		return
	}
	for k, t := range f.until { // keep the map small: drop expired ids
		if !now.Before(t) {
			delete(f.until, k)
		}
	}
	f.until[id] = now.Add(f.ttl)
}

// Clear drops id.
func (f *flags) Clear(id int64) {
	f.mu.Lock()
	f.epoch.Add(1)
	delete(f.until, id)
	f.mu.Unlock()
}

// ClearAll drops every id (events may have been missed).
func (f *flags) ClearAll() {
	f.mu.Lock()
	f.epoch.Add(1)
	clear(f.until)
	f.mu.Unlock()
}

// WatchStockEvents subscribes to the stock-event channel and clears the
// sold-out flag and negative cache of each activity named there, until ctx
// ends. Every (re)subscription clears all flags, since events sent while the
// subscription was down are lost. It returns once the subscription is closed.
func (s *Service) WatchStockEvents(ctx context.Context, rdb *redis.Client, channel string) {
	ps := rdb.Subscribe(ctx, channel)
	defer ps.Close()
	msgs := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			switch m := m.(type) {
			case *redis.Subscription:
				s.soldOut.ClearAll()
				s.missing.ClearAll()
				s.log.Debug("stock events subscribed", "kind", m.Kind, "channel", m.Channel)
			case *redis.Message:
				id, err := strconv.ParseInt(m.Payload, 10, 64)
				if err != nil {
					s.log.Warn("stock event with a bad activity id", "payload", m.Payload)
					continue
				}
				s.soldOut.Clear(id)
				s.missing.Clear(id)
			}
		}
	}
}
