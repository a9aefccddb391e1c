// Package lease is the fenced Redis lease by which one worker of the fleet at
// a time runs a singleton job (the sweeper, the archiver). The holder's name
// carries a fencing token from a counter, so a holder whose lease lapsed
// (paused, partitioned) cannot renew or release its successor's lease. The
// jobs under a lease keep their writes idempotent, so a stale holder that
// overlaps a new one for one tick does no harm.
package lease

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Lease is one instance's claim on a named lease; not safe for concurrent use.
type Lease struct {
	rdb      redis.UniversalClient
	key      string
	instance string
	ttl      time.Duration
	token    int64 // fencing token of the lease held, 0 when not held
}

// New returns a lease on key for instance, lasting ttl from each renewal.
func New(rdb redis.UniversalClient, key, instance string, ttl time.Duration) *Lease {
	return &Lease{rdb: rdb, key: key, instance: instance, ttl: ttl}
}

// renew extends the lease only if this holder's token still holds it.
var renew = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

var unlock = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// Acquire takes the lease, or renews it when this instance holds it; it
// reports whether the lease is held now.
func (l *Lease) Acquire(ctx context.Context) (bool, error) {
	if l.token != 0 {
		n, err := renew.Run(ctx, l.rdb, []string{l.key}, l.holder(), l.ttl.Milliseconds()).Int64()
		if err != nil {
			return false, err
		}
		if n == 1 {
			return true, nil
		}
		l.token = 0
	}
	tok, err := l.rdb.Incr(ctx, l.key+":fence").Result()
	if err != nil {
		return false, err
	}
	l.token = tok
	ok, err := l.rdb.SetNX(ctx, l.key, l.holder(), l.ttl).Result()
	if err != nil || !ok {
		l.token = 0
		return false, err
	}
	return true, nil
}

// Token is the fencing token of the lease held (0 when not held).
func (l *Lease) Token() int64 { return l.token }

func (l *Lease) holder() string { return l.instance + "#" + strconv.FormatInt(l.token, 10) }

// Release gives the lease up if this instance still holds it.
func (l *Lease) Release(ctx context.Context) {
	if l.token == 0 {
		return
	}
	_ = unlock.Run(ctx, l.rdb, []string{l.key}, l.holder()).Err()
	l.token = 0
}
