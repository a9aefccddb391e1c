package conf

import (
	"slices"
	"time"
)

// validateReadCache checks [[proxy.rules]] read_cache_ttl: between 0 (off)
// and one minute, and only on a rule that matches GET (the cache holds
// answers to GETs only).
func (r *Rule) validateReadCache(p *problems, key string) {
	d := r.ReadCacheTTL.Duration
	if d < 0 || d > time.Minute {
		p.add(key+".read_cache_ttl", "must be between 0s (off) and 1m, got %q", r.ReadCacheTTL.String())
	}
	if d > 0 && len(r.Methods) > 0 && !slices.Contains(r.Methods, "GET") {
		p.add(key+".read_cache_ttl", "caches GET answers, but the rule's methods %v have no GET", r.Methods)
	}
}
