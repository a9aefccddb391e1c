package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/proxy/internal/edge"
	"github.com/seckill/seckill/proxy/internal/limiter"
	"github.com/seckill/seckill/proxy/internal/rls"
)

// loadRLS loads rls_config and parses the rls_* settings when the Envoy
// service is on (rls_listen set); with it off nothing is read, as at
// start. Start, SIGHUP and -check all load through it, so -check refuses
// exactly what the proxy would. Errors name the key, then the file, the
// domain and the descriptor path.
func loadRLS(rc conf.RLS) (*rls.Config, rls.Settings, error) {
	if rc.Listen == "" {
		return nil, rls.Settings{}, nil
	}
	mode, err := limiter.ParseRLSMode(rc.OnRedisError)
	if err != nil {
		return nil, rls.Settings{}, fmt.Errorf("proxy.%w", err)
	}
	rules, err := rls.Load(rc.Config)
	if err != nil {
		return nil, rls.Settings{}, fmt.Errorf("proxy.rls_config: %w", err)
	}
	return rules, rls.Settings{Mode: mode, Headers: rc.ResponseHeaders, Shadow: rc.ShadowMode, NearLimit: rc.NearLimitRatio}, nil
}

// rlsFront is the running Envoy rate-limit service and the rls_* keys it
// runs with.
type rlsFront struct {
	svc *rls.Service
	srv *rls.Server
	ln  net.Listener
	rc  conf.RLS // as running: the reloadable keys as last applied, the others as at start
	// stopWatch ends the watch of rc.Config's files (nil: not watched).
	stopWatch func()
}

// startRLS builds the Envoy rate-limit service when [proxy] rls_listen is
// set: its windows in the HTTP edge's store (one batch queue, breaker and
// heartbeat for both), its metrics on the admin /metrics. nil: it is off.
func startRLS(cfg conf.Config, p *edge.Proxy, log *slog.Logger) (*rlsFront, error) {
	rc := cfg.Proxy.RLS
	if rc.Listen == "" {
		return nil, nil
	}
	rules, set, err := loadRLS(rc)
	if err != nil {
		return nil, err
	}
	lim := p.Handler.Limiter
	svc := rls.New(rules, rls.Options{Store: lim.SharedStore(), Live: lim.Live, Decided: lim.CountDecision,
		KeyPrefix: cfg.Redis.KeyPrefix, Settings: set,
		MaxCached: cfg.Proxy.MaxClientStates, Metrics: rls.NewMetrics(p.Handler.Registry), Log: log})
	ln, err := net.Listen("tcp", rc.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", rc.Listen, err)
	}
	srv := rls.NewServer(svc, rls.ServerOptions{MaxStreams: uint32(rc.MaxStreams), MaxMessageBytes: rc.MaxMessageBytes,
		Reflection: rc.Reflection})
	return &rlsFront{svc: svc, srv: srv, ln: ln, rc: rc}, nil
}

// watch reloads the rules when rc.Config's files change, until ctx ends.
func (f *rlsFront) watch(ctx context.Context, log *slog.Logger) {
	stop, err := rls.Watch(ctx, f.svc, f.rc.Config, log)
	if err != nil {
		// SIGHUP still reloads.
		log.Warn("rls config not watched", "path", f.rc.Config, "err", err)
		return
	}
	f.stopWatch = stop
}

// reload applies the rls_* keys of a reloaded TOML file: rls_config (read
// again, and watched instead of the old path when it moved),
// rls_on_redis_error, rls_response_headers, rls_shadow_mode and
// rls_near_limit_ratio, all
// together or, when the rules do not load, none. The listener, reflection
// and the gRPC bounds are fixed when the server starts: a change of them
// is logged as needing a restart, and the running values stay.
func (f *rlsFront) reload(ctx context.Context, next conf.RLS, log *slog.Logger) {
	if next.Listen == "" {
		log.Warn("rls_listen emptied on reload: turning the Envoy rate-limit service off needs a restart; it keeps serving with its running rules and settings",
			"listen", f.rc.Listen)
		return
	}
	if fixed := restartOnly(f.rc, next); len(fixed) > 0 {
		log.Warn("rls keys changed that take effect only at a restart; their running values stay", "keys", fixed)
	}
	rules, set, err := loadRLS(next)
	if err != nil {
		f.svc.CountReloadError()
		log.Error("rls config reload rejected, running config kept", "path", next.Config, "err", err)
		return
	}
	moved := next.Config != f.rc.Config
	if moved && f.stopWatch != nil {
		// Before the swap: the old files' watch must not reload them after it.
		f.stopWatch()
		f.stopWatch = nil
	}
	f.svc.Apply(rules, set)
	f.rc.Config, f.rc.OnRedisError, f.rc.ResponseHeaders, f.rc.ShadowMode, f.rc.NearLimitRatio =
		next.Config, next.OnRedisError, next.ResponseHeaders, next.ShadowMode, next.NearLimitRatio
	if moved {
		f.watch(ctx, log)
	}
	log.Info("rls config reloaded", "path", next.Config, "domains", rules.Domains(), "on_redis_error", set.Mode.String(),
		"response_headers", set.Headers, "shadow_mode", set.Shadow, "near_limit_ratio", set.NearLimit)
}

// restartOnly names the start-only rls_* keys that differ between the
// running ones and next.
func restartOnly(running, next conf.RLS) []string {
	var keys []string
	if next.Listen != running.Listen {
		keys = append(keys, "rls_listen")
	}
	if next.Reflection != running.Reflection {
		keys = append(keys, "rls_reflection")
	}
	if next.MaxStreams != running.MaxStreams {
		keys = append(keys, "rls_max_concurrent_streams")
	}
	if next.MaxMessageBytes != running.MaxMessageBytes {
		keys = append(keys, "rls_max_message_bytes")
	}
	return keys
}
