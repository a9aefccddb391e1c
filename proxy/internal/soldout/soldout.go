// Package soldout lets the proxy answer the sold-out tail of a flash sale
// itself, so that it never reaches the backend.
//
// How the proxy learns: when the upstream answers
// POST /api/v1/activities/{id}/purchase with 409, Content-Type
// application/json and a body whose "code" is "sold_out", the proxy keeps that
// exact answer for the activity for [proxy] sold_out_ttl and replays it (409,
// same headers and body) to further purchases of the activity.
//
// How it forgets: when the TTL ends; and at once when the backend gives units
// back (a failed order released, stock raised): it PUBLISHes the activity id
// on the Redis channel "<key_prefix>seckill:stock-events", every proxy
// instance subscribes to it and drops the flag. A sold-out answer whose
// request was sent before such an event is not learnt, so a response racing
// with the event cannot bring the flag back.
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
)

// Cache holds the sold-out answers per activity id.
type Cache struct {
	ttl    time.Duration
	mu     sync.RWMutex
	m      map[string]answer
	forgot map[string]time.Time // last stock event per activity

	Hits   prometheus.Counter
	Learnt prometheus.Counter
}

type answer struct {
	body, ctype []byte
	until       time.Time
}

// New builds a Cache keeping answers for ttl.
func New(ttl time.Duration, reg prometheus.Registerer) *Cache {
	c := &Cache{ttl: ttl, m: map[string]answer{}, forgot: map[string]time.Time{}}
	if reg != nil {
		c.Hits = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_sold_out_answers_total", Help: "Purchases answered sold-out by the proxy itself."})
		c.Learnt = prometheus.NewCounter(prometheus.CounterOpts{Name: "seckill_proxy_sold_out_learnt_total", Help: "Sold-out answers learnt from the upstream."})
		reg.MustRegister(c.Hits, c.Learnt)
	}
	return c
}

var (
	purchasePrefix = []byte("/api/v1/activities/")
	purchaseSuffix = []byte("/purchase")
)

// PurchaseID returns the activity id of a purchase request, if it is one.
func PurchaseID(method, path []byte) ([]byte, bool) {
	if string(method) != "POST" || !bytes.HasPrefix(path, purchasePrefix) || !bytes.HasSuffix(path, purchaseSuffix) {
		return nil, false
	}
	id := path[len(purchasePrefix) : len(path)-len(purchaseSuffix)]
	if len(id) == 0 || len(id) > 19 {
		return nil, false
	}
	for _, c := range id {
		if c < '0' || c > '9' {
			return nil, false
		}
	}
	return id, true
}

// Lookup returns the cached answer for the activity, if still fresh.
func (c *Cache) Lookup(id []byte, now time.Time) (body, ctype []byte, ok bool) {
	c.mu.RLock()
	a, ok := c.m[string(id)]
	c.mu.RUnlock()
	if !ok || !now.Before(a.until) {
		return nil, nil, false
	}
	if c.Hits != nil {
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

// Learn keeps a sold-out answer for the activity, unless a stock event for it
// arrived after the request was sent (sent).
func (c *Cache) Learn(id []byte, sent time.Time, ctype, body []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.forgot[string(id)]; ok && !sent.After(f) {
		return
	}
	c.m[string(id)] = answer{body: bytes.Clone(body), ctype: bytes.Clone(ctype), until: time.Now().Add(c.ttl)}
	if c.Learnt != nil {
		c.Learnt.Inc()
	}
}

// Forget drops the activity's flag (a stock event).
func (c *Cache) Forget(id string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
	c.forgot[id] = now
	// Events older than a TTL can no longer race with a response: drop them,
	// and expired answers with them.
	for k, t := range c.forgot {
		if now.Sub(t) > c.ttl+time.Minute {
			delete(c.forgot, k)
		}
	}
	for k, a := range c.m {
		if !now.Before(a.until) {
			delete(c.m, k)
		}
	}
}

// Subscribe forgets flags on every stock event until ctx ends; go-redis
// resubscribes after a lost connection. While it cannot listen, flags still
// expire after the TTL. ready is closed once the subscription is confirmed
// (or failed to confirm at first).
func (c *Cache) Subscribe(ctx context.Context, rdb *redis.Client, keyPrefix string, log *slog.Logger, ready chan<- struct{}) {
	ps := rdb.Subscribe(ctx, reservation.Channel(keyPrefix))
	defer ps.Close()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if _, err := ps.Receive(rctx); err != nil {
		log.Warn("sold-out cache: subscribe not confirmed yet; flags expire by TTL meanwhile", "err", err)
	}
	cancel()
	if ready != nil {
		close(ready)
	}
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			c.Forget(msg.Payload, time.Now())
		}
	}
}
