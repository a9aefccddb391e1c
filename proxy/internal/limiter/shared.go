package limiter

// The limiter's store offered to a second front end: the Envoy rate-limit
// service (proxy/internal/rls) decides its own windows, in a key namespace
// of its own, through the same store as the HTTP rules, so both share one
// batch queue, breaker, heartbeat and metrics.

// SharedStore is the store the limiter decides in (Redis, or this process
// with [proxy] limiter = "memory").
func (l *Limiter) SharedStore() Store { return l.store }

// CountDecision counts a decision made through SharedStore, so that
// seckill_proxy_redis_calls_per_decision covers both front ends.
func (l *Limiter) CountDecision() { l.m.decided.Add(1) }
