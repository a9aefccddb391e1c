package conf

import (
	"net"
	"net/url"
	"time"
)

// Bench is the [bench] section: defaults of bin/bench, each overridable by a flag.
type Bench struct {
	// Targets are the URLs purchases are sent to (usually the proxies).
	Targets []string `toml:"targets"`
	// AdminURL is the backend the sale is created through.
	AdminURL string `toml:"admin_url"`
	// ActivityID is the sale to create; 0 picks a fresh id (unix milliseconds)
	// per run, so that runs against one stack never mix.
	ActivityID   int64 `toml:"activity_id"`
	Stock        int   `toml:"stock"`
	PerUserLimit int   `toml:"per_user_limit"`
	Users        int   `toml:"users"`
	// Duration is the rush; Warmup comes before it (the sale is not open yet,
	// clients read its state and open connections), Tail after it (the
	// sold-out tail, same load).
	Duration Duration `toml:"duration"`
	Warmup   Duration `toml:"warmup"`
	Tail     Duration `toml:"tail"`
	// Rate > 0 selects the open-loop model (requests per second, latency from
	// the intended send time); 0 the closed loop with Connections workers.
	Rate        int `toml:"rate"`
	Connections int `toml:"connections"`
	// MaxInFlight bounds the open loop's outstanding requests.
	MaxInFlight int `toml:"max_in_flight"`
	// SourceNet and SourceIPs: client source addresses are bound to SourceIPs
	// addresses of SourceNet (inside 127.0.0.0/8), so per-IP limits see distinct
	// peers. SourceIPs = 0 sends from the default address.
	SourceNet string `toml:"source_net"`
	SourceIPs int    `toml:"source_ips"`
	// HotShare is the fraction of users behind a few shared addresses (NAT,
	// bots): they trip the per-IP limits.
	HotShare float64 `toml:"hot_share"`
	// UnkeyedShare is the fraction of purchases sent without an
	// Idempotency-Key (never retried: a retry without a key may buy again).
	// Only those may be answered sold_out by the proxy itself.
	UnkeyedShare float64 `toml:"unkeyed_share"`
	// ReplayShare is the fraction of the tail's keyed purchases that replay
	// a key answered 202 earlier in the run (same user, same key): each
	// must get its order again, never sold_out.
	ReplayShare float64 `toml:"replay_share"`
	// ForwardedFor sends the synthetic client address in X-Forwarded-For
	// instead of binding it; only for proxies that trust the bench.
	ForwardedFor bool `toml:"forwarded_for"`
	// RequestTimeout bounds one attempt; Retries is how often a request is
	// retried with the same Idempotency-Key after a 502/503/504 or a
	// connection error.
	RequestTimeout Duration `toml:"request_timeout"`
	Retries        int      `toml:"retries"`
	// SaleLength is how long the created sale stays open after it starts.
	SaleLength   Duration `toml:"sale_length"`
	DrainTimeout Duration `toml:"drain_timeout"`
	// The read mix: StatePollRate sale-state GETs per second through the
	// warm-up (buyers refreshing the page before the start), and after each
	// 202 a wait for the order's result with GET /api/v1/orders/{id}?wait=
	// OrderWait, repeated until it is settled (0: no waits).
	StatePollRate int      `toml:"state_poll_rate"`
	OrderWait     Duration `toml:"order_wait"`
}

func defaultBench() Bench {
	return Bench{
		Targets:        []string{"http://127.0.0.1:8080"},
		AdminURL:       "http://127.0.0.1:8090",
		ActivityID:     0,
		Stock:          1000,
		PerUserLimit:   1,
		Users:          20000,
		Duration:       D(10 * time.Second),
		Warmup:         D(time.Second),
		Tail:           D(2 * time.Second),
		Rate:           0,
		Connections:    64,
		MaxInFlight:    4096,
		SourceNet:      "127.1.0.0/16",
		SourceIPs:      1000,
		HotShare:       0.1,
		ForwardedFor:   false,
		RequestTimeout: D(5 * time.Second),
		Retries:        3,
		SaleLength:     D(time.Hour),
		DrainTimeout:   D(60 * time.Second),
		StatePollRate:  500,
		OrderWait:      D(3 * time.Second),
	}
}

func (b *Bench) validate(p *problems) {
	if len(b.Targets) == 0 {
		p.add("bench.targets", "needs at least one URL")
	}
	for i, t := range b.Targets {
		if u, err := url.Parse(t); err != nil || u.Scheme != "http" || u.Host == "" {
			p.add(keyIndex("bench.targets", i), "must be an http://host:port URL, got %q", t)
		}
	}
	if u, err := url.Parse(b.AdminURL); err != nil || u.Scheme != "http" || u.Host == "" {
		p.add("bench.admin_url", "must be an http://host:port URL, got %q", b.AdminURL)
	}
	if b.ActivityID < 0 {
		p.add("bench.activity_id", "must be a positive integer (or 0 for a fresh id), got %d", b.ActivityID)
	}
	checkRange(p, "bench.stock", b.Stock, 1, 100_000_000)
	checkRange(p, "bench.per_user_limit", b.PerUserLimit, 1, 1_000_000)
	checkRange(p, "bench.users", b.Users, 1, 100_000_000)
	checkPositive(p, "bench.duration", b.Duration)
	if b.Warmup.Duration < 0 {
		p.add("bench.warmup", "must not be negative, got %q", b.Warmup.String())
	}
	if b.Tail.Duration < 0 {
		p.add("bench.tail", "must not be negative, got %q", b.Tail.String())
	}
	checkRange(p, "bench.rate", b.Rate, 0, 10_000_000)
	checkRange(p, "bench.connections", b.Connections, 1, 100_000)
	checkRange(p, "bench.max_in_flight", b.MaxInFlight, 1, 1_000_000)
	_, n, err := net.ParseCIDR(b.SourceNet)
	switch {
	case err != nil:
		p.add("bench.source_net", "must be a CIDR such as 127.1.0.0/16, got %q", b.SourceNet)
	case n.IP.To4() == nil || n.IP.To4()[0] != 127:
		p.add("bench.source_net", "must lie inside 127.0.0.0/8 (loopback), got %q", b.SourceNet)
	default:
		ones, bits := n.Mask.Size()
		if hosts := 1<<(bits-ones) - 2; b.SourceIPs > hosts {
			p.add("bench.source_ips", "%s holds only %d usable addresses, got %d", b.SourceNet, hosts, b.SourceIPs)
		}
	}
	checkRange(p, "bench.source_ips", b.SourceIPs, 0, 1<<20)
	if b.HotShare < 0 || b.HotShare > 1 || b.HotShare != b.HotShare {
		p.add("bench.hot_share", "must be between 0 and 1, got %v", b.HotShare)
	}
	if b.UnkeyedShare < 0 || b.UnkeyedShare > 1 || b.UnkeyedShare != b.UnkeyedShare {
		p.add("bench.unkeyed_share", "must be between 0 and 1, got %v", b.UnkeyedShare)
	}
	if b.ReplayShare < 0 || b.ReplayShare > 1 || b.ReplayShare != b.ReplayShare {
		p.add("bench.replay_share", "must be between 0 and 1, got %v", b.ReplayShare)
	}
	checkPositive(p, "bench.request_timeout", b.RequestTimeout)
	checkRange(p, "bench.retries", b.Retries, 0, 100)
	checkPositive(p, "bench.sale_length", b.SaleLength)
	checkPositive(p, "bench.drain_timeout", b.DrainTimeout)
	checkRange(p, "bench.state_poll_rate", b.StatePollRate, 0, 1_000_000)
	if b.OrderWait.Duration < 0 || b.OrderWait.Duration > time.Minute {
		p.add("bench.order_wait", "must be between 0s (no waits) and 1m, got %q", b.OrderWait.String())
	}
}
