package conf

// RLS is the proxy's Envoy rate-limit service (docs/envoy.md): the
// limiter behind envoy.service.ratelimit.v3.RateLimitService over gRPC, on
// a listener of its own, with rules in envoyproxy/ratelimit's YAML format.
// Its keys sit in [proxy] (rls_*) beside the HTTP edge's, whose Redis,
// redis_timeout and max_client_states it shares.
type RLS struct {
	// Listen is the gRPC listener; "" (default) leaves the service off.
	Listen string `toml:"rls_listen"`
	// Config is a YAML file, or a directory whose *.yaml and *.yml files
	// are read (one domain each), watched and reloaded on change and on
	// SIGHUP. Relative paths are taken from the working directory.
	Config string `toml:"rls_config"`
	// OnRedisError: "local", "open", "closed" as the HTTP rules, or
	// "envoy": answer gRPC UNAVAILABLE and let Envoy's failure_mode_deny
	// decide.
	OnRedisError string `toml:"rls_on_redis_error"`
	// ResponseHeaders adds the IETF RateLimit and RateLimit-Policy fields
	// to response_headers_to_add.
	ResponseHeaders bool `toml:"rls_response_headers"`
	// ShadowMode answers OK whatever the limits say (counting what they
	// would have refused), as envoyproxy/ratelimit's SHADOW_MODE.
	ShadowMode bool `toml:"rls_shadow_mode"`
	// NearLimitRatio: an admitted hit that takes a window past this share
	// of its limit counts in seckill_proxy_rls_near_limit_hits_total (the
	// reference server's NEAR_LIMIT_RATIO and near_limit statistic).
	NearLimitRatio float64 `toml:"rls_near_limit_ratio"`
	// Reflection registers the gRPC reflection service (off: it describes
	// the server to anyone who can reach the port).
	Reflection bool `toml:"rls_reflection"`
	// MaxStreams bounds concurrent streams per connection; MaxMessageBytes
	// a request's size.
	MaxStreams      int `toml:"rls_max_concurrent_streams"`
	MaxMessageBytes int `toml:"rls_max_message_bytes"`
}

// RLS on_redis_error values beyond the HTTP rules' ones.
const RLSOnRedisErrorEnvoy = "envoy"

func defaultRLS() RLS {
	return RLS{OnRedisError: "local", NearLimitRatio: 0.8, MaxStreams: 1024, MaxMessageBytes: 64 << 10}
}

func (r *RLS) validate(p *problems, proxy *Proxy) {
	if r.Listen == "" {
		return
	}
	checkListen(p, "proxy.rls_listen", r.Listen)
	if r.Listen == proxy.Listen || r.Listen == proxy.AdminListen {
		p.add("proxy.rls_listen", "must differ from proxy.listen and proxy.admin_listen, got %q", r.Listen)
	}
	if r.Config == "" {
		p.add("proxy.rls_config", "is required with proxy.rls_listen: a YAML file or a directory of them (envoyproxy/ratelimit's format)")
	}
	switch r.OnRedisError {
	case "local", "open", "closed", RLSOnRedisErrorEnvoy:
	default:
		p.add("proxy.rls_on_redis_error", `must be "local", "open", "closed" or "envoy", got %q`, r.OnRedisError)
	}
	if !(r.NearLimitRatio >= 0 && r.NearLimitRatio <= 1) { // NaN fails both
		p.add("proxy.rls_near_limit_ratio", "must be between 0 and 1, got %v", r.NearLimitRatio)
	}
	checkRange(p, "proxy.rls_max_concurrent_streams", r.MaxStreams, 1, 1<<20)
	checkRange(p, "proxy.rls_max_message_bytes", r.MaxMessageBytes, 1024, 16<<20)
}
