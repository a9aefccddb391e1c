package conf

import (
	"net/url"
	"time"
)

// Bench is the [bench] section: defaults of bin/bench, each overridable by a flag.
type Bench struct {
	// Targets are the URLs purchases are sent to (usually the proxies).
	Targets []string `toml:"targets"`
	// AdminURL is the backend the sale is created through.
	AdminURL     string   `toml:"admin_url"`
	ActivityID   int64    `toml:"activity_id"`
	Stock        int      `toml:"stock"`
	PerUserLimit int      `toml:"per_user_limit"`
	Users        int      `toml:"users"`
	Duration     Duration `toml:"duration"`
	Rate         int      `toml:"rate"`
	Connections  int      `toml:"connections"`
	DrainTimeout Duration `toml:"drain_timeout"`
}

func defaultBench() Bench {
	return Bench{
		Targets:      []string{"http://127.0.0.1:8080"},
		AdminURL:     "http://127.0.0.1:8090",
		ActivityID:   1,
		Stock:        1000,
		PerUserLimit: 1,
		Users:        20000,
		Duration:     D(10 * time.Second),
		Rate:         0,
		Connections:  64,
		DrainTimeout: D(60 * time.Second),
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
	if b.ActivityID <= 0 {
		p.add("bench.activity_id", "must be a positive integer, got %d", b.ActivityID)
	}
	checkRange(p, "bench.stock", b.Stock, 1, 100_000_000)
	checkRange(p, "bench.per_user_limit", b.PerUserLimit, 1, 1_000_000)
	checkRange(p, "bench.users", b.Users, 1, 100_000_000)
	checkPositive(p, "bench.duration", b.Duration)
	checkRange(p, "bench.rate", b.Rate, 0, 10_000_000)
	checkRange(p, "bench.connections", b.Connections, 1, 100_000)
	checkPositive(p, "bench.drain_timeout", b.DrainTimeout)
}
