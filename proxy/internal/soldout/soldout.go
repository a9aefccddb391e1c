// Package soldout lets the proxy answer the sold-out tail of a flash sale
// itself, so that it never reaches the backend.
//
// How the proxy learns: when the upstream answers
// POST /api/v1/activities/{id}/purchase with 409, Content-Type
// application/json and a body whose "code" is "sold_out", the proxy keeps that
// exact answer for the activity for [proxy] sold_out_ttl and replays it (409,
// same headers and body) to further purchases of the activity: to every
// unkeyed one, and to a keyed one whose (user, key) holds no order of the
// sale. For those it reads the keys that hold an order once (keys.go;
// reservation.Store.HeldKeys, exact while the sale is sold out), when the
// sale's first sold-out answer is learnt or when the stock events say it
// sold out, whichever comes first; until the keys are read, keyed purchases
// are forwarded.
//
// How it forgets: by the rule of the shared package internal/soldout (the
// backend's flag follows the same one): when the TTL ends; and at once when
// news about the activity arrives on the stock-event channel (units given
// back, stock raised, the sale changed). A sold-out answer to a request sent
// before such news is not learnt, so a response racing with the event cannot
// bring the flag back; keys read before such news are not kept either. Keys
// outlive the flag's TTL (nothing but news changes them), so a sale is read
// once per sell-out, not once per TTL.
package soldout

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/soldout"
)

// Cache holds the sold-out answers per activity id, and the keys that hold
// an order of each sold-out sale.
type Cache struct {
	flags *soldout.Flags
	mu    sync.RWMutex
	m     map[int64]answer
	// keys and fetching: keys.go; src nil: keyed purchases are forwarded.
	keys     map[int64]*keySet
	fetching map[int64]bool
	src      KeySource
	most     int
	hooks    Hooks
	bg       sync.WaitGroup

	Hits      prometheus.Counter // unkeyed purchases answered
	KeyedHits prometheus.Counter // keyed purchases answered
	Learnt    prometheus.Counter
	KeyReads  *prometheus.CounterVec // reads of a sale's keys, by outcome
}

type answer struct{ body, ctype []byte }

// New builds a Cache keeping answers for ttl.
func New(ttl time.Duration, reg prometheus.Registerer) *Cache {
	c := &Cache{flags: soldout.NewFlags(ttl), m: map[int64]answer{}, keys: map[int64]*keySet{}, fetching: map[int64]bool{}}
	if reg != nil {
		c.Hits = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_sold_out_answers_total", Help: "Unkeyed purchases answered sold-out by the proxy itself."})
		c.KeyedHits = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_sold_out_keyed_answers_total",
			Help: "Keyed purchases answered sold-out by the proxy itself (their key holds no order of the sale)."})
		c.Learnt = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_sold_out_learnt_total", Help: "Sold-out answers learnt from the upstream."})
		c.KeyReads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "seckill_proxy_sold_out_key_reads_total",
			Help: "Reads of the keys holding an order of a sold-out sale, by outcome (keys, sharded, too_many, recovering, open, not_found, error, stale)."}, []string{"outcome"})
		reg.MustRegister(c.Hits, c.KeyedHits, c.Learnt, c.KeyReads)
	}
	return c
}

// Flags is the sold-out rule the cache follows (a stock-event listener).
func (c *Cache) Flags() *soldout.Flags { return c.flags }

var (
	purchasePrefix = []byte("/api/v1/activities/")
	purchaseSuffix = []byte("/purchase")
)

// PurchaseID returns the activity id of a purchase request, if it is one.
func PurchaseID(method, path []byte) (int64, bool) {
	if string(method) != "POST" || !bytes.HasPrefix(path, purchasePrefix) || !bytes.HasSuffix(path, purchaseSuffix) {
		return 0, false
	}
	return soldout.ParseID(path[len(purchasePrefix) : len(path)-len(purchaseSuffix)])
}

// Token is taken before a purchase is forwarded; Learn needs it.
func (c *Cache) Token() soldout.Token { return c.flags.Token() }

// Lookup returns the proxy's own answer to a purchase of the activity by
// user with idempotency key key (empty: unkeyed), if it has one: the
// sold-out answer while the flag is fresh, for a keyed purchase only once
// the sale's keys are read and do not hold (user, key) — a replay of an
// order goes on to the backend, which answers it with its order.
func (c *Cache) Lookup(id int64, now time.Time, user, key []byte) (body, ctype []byte, ok bool) {
	if !c.flags.Has(id, now) {
		return nil, nil, false
	}
	if len(key) > 0 {
		if c.src == nil || len(user) == 0 { // no user: the backend's 400
			return nil, nil, false
		}
		ks, fetch := c.heldBy(id, now)
		if ks == nil {
			if fetch {
				c.startFetch(id)
			}
			return nil, nil, false
		}
		if ks.forward || ks.holds(fingerprint(user, key)) {
			return nil, nil, false
		}
	}
	c.mu.RLock()
	a, ok := c.m[id]
	c.mu.RUnlock()
	if !ok {
		return nil, nil, false
	}
	if len(key) > 0 {
		if c.KeyedHits != nil {
			c.KeyedHits.Inc()
		}
	} else if c.Hits != nil {
		c.Hits.Inc()
	}
	return a.body, a.ctype, true
}

// IsSoldOut reports whether a response is the backend's sold-out answer.
func IsSoldOut(status int, ctype, body []byte) bool {
	if status != 409 || !bytes.HasPrefix(ctype, []byte("application/json")) || len(body) > 4096 {
		return false
	}
	var v struct {
		Code string `json:"code"`
	}
	return json.Unmarshal(body, &v) == nil && v.Code == "sold_out"
}

// Learn keeps a sold-out answer for the activity, unless news about it
// arrived since tok was taken (before the request was sent). It reports
// whether the answer was kept.
func (c *Cache) Learn(id int64, tok soldout.Token, ctype, body []byte) bool {
	// The answer is stored before the flag is raised, so a Lookup that sees
	// the flag finds an answer (a learnt one is never wrong: all say sold out).
	c.mu.Lock()
	c.m[id] = answer{body: bytes.Clone(body), ctype: bytes.Clone(ctype)}
	c.mu.Unlock()
	if !c.flags.Set(id, tok, time.Now()) {
		return false
	}
	if c.Learnt != nil {
		c.Learnt.Inc()
	}
	c.prefetch(id, time.Now())
	return true
}

// Subscribe forgets flags and keys on every stock event until ctx ends,
// telling the other listeners (the read cache) too, and reads the keys of a
// sale the events say sold out; see internal/soldout.Watch.
func (c *Cache) Subscribe(ctx context.Context, rdb redis.UniversalClient, keyPrefix string, log *slog.Logger, ready chan<- struct{}, more ...soldout.Listener) {
	soldout.Watch(ctx, rdb, reservation.Channel(keyPrefix), log, ready, append([]soldout.Listener{c}, more...)...)
}
