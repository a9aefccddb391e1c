package conf

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// Proxy is the [proxy] section.
type Proxy struct {
	Listen      string   `toml:"listen"`
	AdminListen string   `toml:"admin_listen"`
	Upstreams   []string `toml:"upstreams"`
	// TrustedProxies are CIDRs whose X-Forwarded-For / Forwarded is believed.
	TrustedProxies []string `toml:"trusted_proxies"`
	// IPv6Prefix is the prefix length that keys an IPv6 client.
	IPv6Prefix      int      `toml:"ipv6_prefix"`
	ReadTimeout     Duration `toml:"read_timeout"`
	WriteTimeout    Duration `toml:"write_timeout"`
	IdleTimeout     Duration `toml:"idle_timeout"`
	UpstreamConnect Duration `toml:"upstream_connect_timeout"`
	UpstreamTimeout Duration `toml:"upstream_timeout"`
	MaxBodyBytes    int      `toml:"max_body_bytes"`
	MaxHeaderBytes  int      `toml:"max_header_bytes"`
	// Concurrency bounds the connections served at once (beyond it new
	// connections are refused with 503); MaxConnsPerIP bounds them per client
	// address (0: no bound).
	Concurrency   int `toml:"concurrency"`
	MaxConnsPerIP int `toml:"max_conns_per_ip"`
	// Limiter is where the windows live: "redis" (default), shared by every
	// instance, or "memory", this process alone (no Redis call per decision).
	Limiter string `toml:"limiter"`
	// RedisTimeout bounds each limiter call to Redis, and the wait for one.
	RedisTimeout Duration `toml:"redis_timeout"`
	// MaxClientStates bounds the per-client negative-cache entries each rule
	// with a per_ip window keeps in memory; past it one is dropped (its
	// window stays exact: the store holds the log).
	MaxClientStates int `toml:"max_client_states"`
	// SoldOutTTL is how long the proxy answers a sold-out activity itself.
	SoldOutTTL Duration `toml:"sold_out_ttl"`
	// SoldOutKeysMax bounds the keys holding an order of a sold-out sale
	// that the proxy reads and keeps to answer keyed purchases itself; a
	// sale with more (or 0 here) has its keyed purchases forwarded.
	SoldOutKeysMax int      `toml:"sold_out_keys_max"`
	ShutdownGrace  Duration `toml:"shutdown_grace"`
	// DrainDelay is how long the admin /readyz fails after SIGTERM, while
	// requests are still forwarded, before the listeners close.
	DrainDelay Duration `toml:"drain_delay"`
	// DenyPrefixes are paths answered 404 and never forwarded, unless a rule
	// allows its client (RuleAccess.AllowFrom).
	DenyPrefixes []string `toml:"deny_prefixes"`
	Identity     Identity `toml:"identity"`
	Rules        []Rule   `toml:"rules"`
	// RLS: the Envoy rate-limit service (conf/rls.go), off by default.
	RLS
}

// Rule is one [[proxy.rules]] entry.
type Rule struct {
	Name       string   `toml:"name"`
	Methods    []string `toml:"methods"`
	PathPrefix string   `toml:"path_prefix"`
	PerIP      *Window  `toml:"per_ip"`
	Global     *Window  `toml:"global"`
	// OnRedisError is "local", "open" or "closed".
	OnRedisError string `toml:"on_redis_error"`
	Shadow       bool   `toml:"shadow"`
	RuleAccess
	// ReadCacheTTL: the proxy answers GETs of this rule from its own cache
	// this long (conf/readcache.go; 0: off).
	ReadCacheTTL Duration `toml:"read_cache_ttl"`
	// WaitingRoom puts a line in front of the rule (conf/room.go); nil: none.
	WaitingRoom *WaitingRoom `toml:"waiting_room"`
}

// Window is a sliding-window limit: at most Limit admitted requests per Window.
type Window struct {
	Limit  int      `toml:"limit"`
	Window Duration `toml:"window"`
	// Key is what a per_ip window counts by: "ip" (default: the client
	// address), "header:<Name>" or "cookie:<Name>"; a request without that
	// header or cookie is counted by its address, and so is one whose value
	// neither a trusted peer nor the JWT identity vouches for. Global
	// windows have none.
	Key string `toml:"key"`
}

// Key sources of a per-client window.
const (
	KeyAddress = "ip"
	KeyHeader  = "header"
	KeyCookie  = "cookie"
)

// ParseKey splits a window key into its source (KeyAddress, KeyHeader,
// KeyCookie) and the header or cookie name; "" is KeyAddress.
func ParseKey(s string) (source, name string, err error) {
	if s == "" || s == KeyAddress {
		return KeyAddress, "", nil
	}
	source, name, ok := strings.Cut(s, ":")
	if !ok || (source != KeyHeader && source != KeyCookie) {
		return "", "", fmt.Errorf("must be \"ip\", \"header:<Name>\" or \"cookie:<Name>\", got %q", s)
	}
	if name == "" || len(name) > 64 {
		return "", "", fmt.Errorf("%s name must be 1 to 64 characters, got %q", source, name)
	}
	for i := 0; i < len(name); i++ {
		if !tokenChar(name[i]) {
			return "", "", fmt.Errorf("%s name %q: byte %q is not allowed in a %s name", source, name, name[i], source)
		}
	}
	if source == KeyHeader && strings.EqualFold(name, "Cookie") {
		return "", "", fmt.Errorf("header:Cookie keys by every cookie at once; use cookie:<Name>")
	}
	return source, name, nil
}

// tokenChar: RFC 9110 tchar, the characters of a header field name (cookie
// names are tokens too, RFC 6265).
func tokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func defaultProxy() Proxy {
	return Proxy{
		Listen:          "127.0.0.1:8080",
		AdminListen:     "127.0.0.1:8081",
		Upstreams:       []string{"http://127.0.0.1:8090"},
		IPv6Prefix:      64,
		ReadTimeout:     D(5 * time.Second),
		WriteTimeout:    D(5 * time.Second),
		IdleTimeout:     D(60 * time.Second),
		UpstreamConnect: D(time.Second),
		UpstreamTimeout: D(5 * time.Second),
		MaxBodyBytes:    1 << 20,
		MaxHeaderBytes:  8 << 10,
		Concurrency:     256 * 1024,
		Limiter:         "redis",
		RedisTimeout:    D(20 * time.Millisecond),
		MaxClientStates: 262144,
		SoldOutTTL:      D(time.Second),
		SoldOutKeysMax:  100_000,
		ShutdownGrace:   D(10 * time.Second),
		DenyPrefixes:    DefaultDenyPrefixes(),
		RLS:             defaultRLS(),
	}
}

func (x *Proxy) validate(p *problems) {
	checkListen(p, "proxy.listen", x.Listen)
	checkListen(p, "proxy.admin_listen", x.AdminListen)
	if x.Listen == x.AdminListen {
		p.add("proxy.admin_listen", "must differ from proxy.listen")
	}
	if len(x.Upstreams) == 0 {
		p.add("proxy.upstreams", "needs at least one upstream URL")
	}
	for i, u := range x.Upstreams {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			p.add(keyIndex("proxy.upstreams", i), "must be an http(s)://host:port URL, got %q", u)
		}
	}
	for i, c := range x.TrustedProxies {
		if _, _, err := net.ParseCIDR(c); err != nil {
			p.add(keyIndex("proxy.trusted_proxies", i), "must be a CIDR such as 10.0.0.0/8, got %q", c)
		}
	}
	checkRange(p, "proxy.ipv6_prefix", x.IPv6Prefix, 1, 128)
	checkPositive(p, "proxy.read_timeout", x.ReadTimeout)
	checkPositive(p, "proxy.write_timeout", x.WriteTimeout)
	checkPositive(p, "proxy.idle_timeout", x.IdleTimeout)
	checkPositive(p, "proxy.upstream_connect_timeout", x.UpstreamConnect)
	checkPositive(p, "proxy.upstream_timeout", x.UpstreamTimeout)
	checkRange(p, "proxy.max_body_bytes", x.MaxBodyBytes, 1024, 1<<30)
	checkRange(p, "proxy.max_header_bytes", x.MaxHeaderBytes, 1024, 1<<20)
	checkRange(p, "proxy.concurrency", x.Concurrency, 1, 10_000_000)
	checkRange(p, "proxy.max_conns_per_ip", x.MaxConnsPerIP, 0, 10_000_000)
	if x.Limiter != "redis" && x.Limiter != "memory" {
		p.add("proxy.limiter", `must be "redis" (windows shared by every instance) or "memory" (this process alone), got %q`, x.Limiter)
	}
	checkPositive(p, "proxy.redis_timeout", x.RedisTimeout)
	checkRange(p, "proxy.max_client_states", x.MaxClientStates, 64, 100_000_000)
	checkPositive(p, "proxy.sold_out_ttl", x.SoldOutTTL)
	checkRange(p, "proxy.sold_out_keys_max", x.SoldOutKeysMax, 0, 10_000_000)
	checkPositive(p, "proxy.shutdown_grace", x.ShutdownGrace)
	checkNonNegative(p, "proxy.drain_delay", x.DrainDelay)
	for i, d := range x.DenyPrefixes {
		if !strings.HasPrefix(d, "/") {
			p.add(keyIndex("proxy.deny_prefixes", i), "must start with /, got %q", d)
		}
	}
	x.RLS.validate(p, x)
	if x.Identity.JWT != nil {
		x.Identity.JWT.validate(p)
	}
	names := map[string]bool{}
	for i := range x.Rules {
		// By index: validate also fills a rule's defaults.
		x.Rules[i].validate(p, keyIndex("proxy.rules", i), names)
		x.Rules[i].RuleAccess.validate(p, keyIndex("proxy.rules", i), x.Identity.JWT)
	}
}

func (r *Rule) validate(p *problems, key string, names map[string]bool) {
	switch {
	case r.Name == "":
		p.add(key+".name", "is required")
	case names[r.Name]:
		p.add(key+".name", "duplicate rule name %q", r.Name)
	case strings.ContainsAny(r.Name, "\",; \t{}"):
		p.add(key+".name", "must not contain quotes, commas, semicolons, braces or spaces, got %q", r.Name)
	}
	names[r.Name] = true
	for j, m := range r.Methods {
		if m == "" || strings.ToUpper(m) != m || strings.ContainsAny(m, " \t") {
			p.add(keyIndex(key+".methods", j), "must be an upper-case HTTP method, got %q", m)
		}
	}
	if !strings.HasPrefix(r.PathPrefix, "/") {
		p.add(key+".path_prefix", "must start with /, got %q", r.PathPrefix)
	}
	r.validateReadCache(p, key)
	if r.WaitingRoom != nil {
		r.WaitingRoom.validate(p, key, r)
	}
	if r.PerIP == nil && r.Global == nil {
		p.add(key, "needs per_ip, global or both")
	}
	if r.PerIP != nil {
		r.PerIP.validate(p, key+".per_ip")
		if _, _, err := ParseKey(r.PerIP.Key); err != nil {
			p.add(key+".per_ip.key", "%v", err)
		}
	}
	if r.Global != nil {
		r.Global.validate(p, key+".global")
		if r.Global.Key != "" {
			p.add(key+".global.key", "a global window is shared by every client and has no key, got %q", r.Global.Key)
		}
	}
	switch r.OnRedisError {
	case "":
		r.OnRedisError = "local"
	case "local", "open", "closed":
	default:
		p.add(key+".on_redis_error", "must be \"local\", \"open\" or \"closed\", got %q", r.OnRedisError)
	}
}

func (w *Window) validate(p *problems, key string) {
	checkRange(p, key+".limit", w.Limit, 1, 10_000_000)
	if w.Window.Duration < time.Millisecond || w.Window.Duration > 24*time.Hour {
		p.add(key+".window", "must be between 1ms and 24h, got %q", w.Window.String())
	}
}
