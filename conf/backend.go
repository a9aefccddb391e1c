package conf

import "time"

// Backend is the [backend] section.
type Backend struct {
	Listen string `toml:"listen"`
	// AdminToken guards /admin/v1; empty (and no AdminTokenFile) disables
	// the admin API. See LoadAdminToken for the policy.
	AdminToken string `toml:"admin_token"`
	// AdminTokenFile holds the admin token instead (read at start and on
	// SIGHUP); exclusive with AdminToken.
	AdminTokenFile string `toml:"admin_token_file"`
	// DevMode accepts weak and published admin tokens (local development).
	DevMode bool `toml:"dev_mode"`
	// AdminFailures bounds failed admin authentications per source address.
	AdminFailures Window `toml:"admin_failure_limit"`
	// ReservationTTL is how long a reservation may stay pending before the sweeper
	// resolves it.
	ReservationTTL Duration `toml:"reservation_ttl"`
	// RedisTimeout bounds each Redis call of a request.
	RedisTimeout Duration `toml:"redis_timeout"`
	// PublishTimeout bounds the wait for the broker's confirm.
	PublishTimeout Duration `toml:"publish_timeout"`
	// SoldOutTTL is how long a local "sold out" flag is trusted without news.
	SoldOutTTL     Duration `toml:"sold_out_ttl"`
	RetryAfter     Duration `toml:"retry_after"`
	MaxBodyBytes   int      `toml:"max_body_bytes"`
	AdminBodyBytes int      `toml:"admin_body_bytes"`
	ReadTimeout    Duration `toml:"read_timeout"`
	WriteTimeout   Duration `toml:"write_timeout"`
	IdleTimeout    Duration `toml:"idle_timeout"`
	ShutdownGrace  Duration `toml:"shutdown_grace"`
	// DrainDelay is how long /readyz fails after SIGTERM, while requests are
	// still served, before the listener closes (load balancers move away).
	DrainDelay Duration `toml:"drain_delay"`

	// The read path (docs/read-path.md).
	// StateCacheTTL: a sale state is answered from the local cache this long.
	StateCacheTTL Duration `toml:"state_cache_ttl"`
	// OrderWaitMax bounds ?wait= of GET /api/v1/orders/{id}.
	OrderWaitMax Duration `toml:"order_wait_max"`
	// MaxOrderWaiters bounds the long-polls waiting at once; beyond it a
	// request is answered at once.
	MaxOrderWaiters int `toml:"max_order_waiters"`

	// The group commit (docs/purchase-path.md, "Group commit").
	// GroupMax bounds the purchases of one sale shard reserved in one script
	// call and published in one message (1: every purchase alone).
	GroupMax int `toml:"group_max"`
	// GroupLinger bounds how long a purchase waits for a running group of
	// its shard before its own group goes (0s: never waits). A purchase that
	// finds its shard idle never waits.
	GroupLinger Duration `toml:"group_linger"`
	// GroupMessage is how a group's accepted orders are published: "batch"
	// (one message carrying them, ordermsg.Batch: workers must decode it) or
	// "each" (one message per order, as before the group commit).
	GroupMessage string `toml:"group_message"`
	// StockShards is the stock shard count of an activity created without
	// "stock_shards" in its admin body (docs/scale-out.md).
	StockShards int `toml:"stock_shards"`
}

// Group message forms ([backend] group_message).
const (
	GroupBatch = "batch"
	GroupEach  = "each"
)

// MaxGroup is the largest group_max: the orders one batch message carries at
// most (ordermsg.MaxBatch).
const MaxGroup = 1024

func defaultBackend() Backend {
	return Backend{
		Listen:         "127.0.0.1:8090",
		ReservationTTL: D(30 * time.Second),
		RedisTimeout:   D(200 * time.Millisecond),
		PublishTimeout: D(3 * time.Second),
		SoldOutTTL:     D(500 * time.Millisecond),
		RetryAfter:     D(time.Second),
		MaxBodyBytes:   4 << 10,
		AdminBodyBytes: 64 << 10,
		ReadTimeout:    D(5 * time.Second),
		WriteTimeout:   D(5 * time.Second),
		IdleTimeout:    D(60 * time.Second),
		ShutdownGrace:  D(10 * time.Second),
		AdminFailures:  Window{Limit: 10, Window: D(time.Minute)},

		StateCacheTTL:   D(100 * time.Millisecond),
		OrderWaitMax:    D(4 * time.Second),
		MaxOrderWaiters: 20_000,

		GroupMax:     64,
		GroupLinger:  D(2 * time.Millisecond),
		GroupMessage: GroupBatch,
		StockShards:  1,
	}
}

func (b *Backend) validate(p *problems) {
	checkListen(p, "backend.listen", b.Listen)
	b.validateAdmin(p)
	checkPositive(p, "backend.reservation_ttl", b.ReservationTTL)
	checkPositive(p, "backend.redis_timeout", b.RedisTimeout)
	checkPositive(p, "backend.publish_timeout", b.PublishTimeout)
	checkPositive(p, "backend.sold_out_ttl", b.SoldOutTTL)
	checkPositive(p, "backend.retry_after", b.RetryAfter)
	checkRange(p, "backend.max_body_bytes", b.MaxBodyBytes, 64, 1<<20)
	checkRange(p, "backend.admin_body_bytes", b.AdminBodyBytes, 256, 16<<20)
	checkPositive(p, "backend.read_timeout", b.ReadTimeout)
	checkPositive(p, "backend.write_timeout", b.WriteTimeout)
	checkPositive(p, "backend.idle_timeout", b.IdleTimeout)
	checkPositive(p, "backend.shutdown_grace", b.ShutdownGrace)
	checkNonNegative(p, "backend.drain_delay", b.DrainDelay)
	if b.StateCacheTTL.Duration < 0 || b.StateCacheTTL.Duration > time.Minute {
		p.add("backend.state_cache_ttl", "must be between 0s (no cache) and 1m, got %q", b.StateCacheTTL.String())
	}
	if b.OrderWaitMax.Duration < 0 || b.OrderWaitMax.Duration > 5*time.Minute {
		p.add("backend.order_wait_max", "must be between 0s (no long-polls) and 5m, got %q", b.OrderWaitMax.String())
	}
	checkRange(p, "backend.max_order_waiters", b.MaxOrderWaiters, 1, 10_000_000)
	checkRange(p, "backend.group_max", b.GroupMax, 1, MaxGroup)
	if b.GroupLinger.Duration < 0 || b.GroupLinger.Duration > 100*time.Millisecond {
		p.add("backend.group_linger", "must be between 0s (no wait) and 100ms, got %q", b.GroupLinger.String())
	}
	if b.GroupMessage != GroupBatch && b.GroupMessage != GroupEach {
		p.add("backend.group_message", "must be %q or %q, got %q", GroupBatch, GroupEach, b.GroupMessage)
	}
	checkRange(p, "backend.stock_shards", b.StockShards, 1, 64)
	if b.PublishTimeout.Duration >= b.ReservationTTL.Duration {
		p.add("backend.publish_timeout", "must be shorter than backend.reservation_ttl")
	}
}
