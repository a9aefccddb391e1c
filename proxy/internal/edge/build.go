package edge

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/connlimit"
	"github.com/seckill/seckill/internal/metrics"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/proxy/internal/forward"
	"github.com/seckill/seckill/proxy/internal/identity"
	"github.com/seckill/seckill/proxy/internal/limiter"
	"github.com/seckill/seckill/proxy/internal/readcache"
	"github.com/seckill/seckill/proxy/internal/room"
	"github.com/seckill/seckill/proxy/internal/soldout"
)

// Proxy is one wired proxy instance (without its listeners).
type Proxy struct {
	Handler *Handler
	Metrics *limiter.Metrics
	cfg     conf.Config

	// beforeServe is a test hook run first in every forwarded request (a
	// test injects a panic with it); nil in production.
	beforeServe atomic.Pointer[func(*fasthttp.RequestCtx)]
}

// Option adjusts New.
type Option struct {
	limiter func(*limiter.Config)
	room    func(*room.Options)
}

// WithTrace reports every admitted request's windows with their Redis-time
// decision stamps (see limiter.Config.Trace); for tests.
func WithTrace(fn func(policy, client string, redisMicros int64)) Option {
	return Option{limiter: func(c *limiter.Config) { c.Trace = fn }}
}

// WithRoom adjusts the waiting rooms' options (a trace of admissions, the
// step's pace); for tests.
func WithRoom(fn func(*room.Options)) Option { return Option{room: fn} }

// New wires a proxy instance from a validated configuration.
func New(cfg conf.Config, rdb redis.UniversalClient, log *slog.Logger, opts ...Option) (*Proxy, error) {
	reg := metrics.NewRegistry("proxy")
	lm := limiter.NewMetrics(reg)
	id, err := identity.New(cfg.Proxy.TrustedProxies, cfg.Proxy.IPv6Prefix)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	host, _ := os.Hostname()
	inst := limiter.FormatInstance(host, binary.LittleEndian.Uint64(rnd[:]))
	lc := limiter.Config{KeyPrefix: cfg.Redis.KeyPrefix, Timeout: cfg.Proxy.RedisTimeout.Duration,
		Instance: inst, MaxClientStates: cfg.Proxy.MaxClientStates, Metrics: lm, Log: log}
	if cfg.Proxy.Limiter != "memory" {
		lc.Redis = rdb
	}
	for _, o := range opts {
		if o.limiter != nil {
			o.limiter(&lc)
		}
	}
	lim := limiter.New(lc)
	pool, err := forward.NewPool(cfg.Proxy.Upstreams, forward.Options{
		ConnectTimeout:  cfg.Proxy.UpstreamConnect.Duration,
		Timeout:         cfg.Proxy.UpstreamTimeout.Duration,
		RequestIDPrefix: inst + "-",
		Metrics:         forward.NewMetrics(reg),
	})
	if err != nil {
		return nil, fmt.Errorf("upstreams: %w", err)
	}
	rules, err := limiter.Compile(cfg.Proxy.Rules, cfg.Redis.KeyPrefix, lm)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	gate, err := NewGate(cfg.Proxy)
	if err != nil {
		return nil, err
	}
	h := &Handler{Limiter: lim, Identity: id, Pool: pool, SoldOut: soldout.New(cfg.Proxy.SoldOutTTL.Duration, reg),
		ReadCache: readcache.New(cfg.Proxy.Rules, reg), Registry: reg,
		Security: NewSecurityMetrics(reg), metrics: metrics.Handler(reg)}
	store := reservation.New(rdb, cfg.Redis.KeyPrefix)
	h.SoldOut.EnableKeys(store, cfg.Proxy.SoldOutKeysMax, soldout.Hooks{})
	ro := room.Options{Redis: rdb, KeyPrefix: cfg.Redis.KeyPrefix, Stock: store, Metrics: room.NewMetrics(reg), Log: log}
	for _, o := range opts {
		if o.room != nil {
			o.room(&ro)
		}
	}
	if h.Rooms, err = room.New(cfg.Proxy.Rules, ro); err != nil {
		return nil, err
	}
	h.SetRules(rules)
	h.SetGate(gate)
	RegisterGauges(reg, lim)
	return &Proxy{Handler: h, Metrics: lm, cfg: cfg}, nil
}

// Reload compiles new rules, deny list and JWT identity (its key file read
// again: key rotation) and swaps them in; on error all running ones stay.
func (p *Proxy) Reload(c conf.Proxy) error {
	rs, err := limiter.Compile(c.Rules, p.cfg.Redis.KeyPrefix, p.Metrics)
	if err != nil {
		return err
	}
	gate, err := NewGate(c)
	if err != nil {
		return err
	}
	// Last of what may fail: it swaps the rooms (and rotates their keys)
	// when it succeeds.
	if err := p.Handler.Rooms.SetRules(c.Rules); err != nil {
		return err
	}
	p.Handler.SetRules(rs)
	p.Handler.SetGate(gate)
	p.Handler.ReadCache.SetRules(c.Rules)
	p.Handler.Limiter.SetMaxClientStates(c.MaxClientStates)
	return nil
}

// WatchStockEvents makes the sold-out cache and the read cache forget an
// activity on news about it, until ctx ends (see internal/soldout.Watch).
func (p *Proxy) WatchStockEvents(ctx context.Context, rdb redis.UniversalClient, log *slog.Logger, ready chan<- struct{}) {
	p.Handler.SoldOut.Subscribe(ctx, rdb, p.cfg.Redis.KeyPrefix, log, ready, p.Handler.ReadCache, p.Handler.Rooms)
}

// Server is the forwarding listener's server.
func (p *Proxy) Server(log *slog.Logger) *fasthttp.Server {
	c := p.cfg.Proxy
	return &fasthttp.Server{
		Handler:      recovered(p.serve, log),
		ErrorHandler: ServerError,
		// Listener bounds connections first (its answers are problem
		// details with Retry-After); fasthttp's own bound, whose answer is
		// text/plain, sits above it and is never reached.
		Concurrency:                   2 * c.Concurrency,
		Name:                          "seckill-proxy",
		ReadTimeout:                   c.ReadTimeout.Duration,
		WriteTimeout:                  c.WriteTimeout.Duration,
		IdleTimeout:                   c.IdleTimeout.Duration,
		ReadBufferSize:                c.MaxHeaderBytes,
		MaxRequestBodySize:            c.MaxBodyBytes,
		DisableHeaderNamesNormalizing: false,
		NoDefaultServerHeader:         true,
		NoDefaultDate:                 true,
		NoDefaultContentType:          true,
		DisablePreParseMultipartForm:  true,
		CloseOnShutdown:               true,
		Logger:                        fasthttpLogger{log},
	}
}

// Listener wraps the forwarding listener ln with the connection bounds
// ([proxy] concurrency, max_conns_per_ip): a connection beyond them gets 503
// or 429 problem details with Retry-After, and is closed.
func (p *Proxy) Listener(ln net.Listener) net.Listener {
	c := p.cfg.Proxy
	answer := func(status int, typ, title, detail string) connlimit.Answer {
		return connlimit.Answer{Status: status, ContentType: string(ctProblem), RetryAfter: 1,
			Body: problemBody(status, typ, title, detail)}
	}
	return connlimit.Listen(ln, connlimit.Config{
		Max: c.Concurrency, PerIP: c.MaxConnsPerIP,
		Busy: answer(fasthttp.StatusServiceUnavailable, "too-many-connections", "Too many connections",
			"the proxy serves as many connections as it may; retry later"),
		PerIPExceeded: answer(fasthttp.StatusTooManyRequests, "too-many-connections-per-ip", "Too many connections from your address",
			"this address holds as many connections as it may; close one or retry later"),
	})
}

func (p *Proxy) serve(ctx *fasthttp.RequestCtx) {
	if f := p.beforeServe.Load(); f != nil {
		(*f)(ctx)
	}
	p.Handler.Serve(ctx)
}

// recovered answers 500 (problem+json) for a request whose handler
// panicked, closes its connection and logs it: one bad request never ends
// the process or reaches the client as a dropped connection.
func recovered(h fasthttp.RequestHandler, log *slog.Logger) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("proxy handler panicked", "panic", r, "path", string(ctx.Path()), "stack", string(debug.Stack()))
				ctx.Response.Reset()
				ctx.SetConnectionClose()
				problem(ctx, fasthttp.StatusInternalServerError, "internal-error", "Internal error", "the proxy failed on this request")
			}
		}()
		h(ctx)
	}
}

// AdminServer serves /healthz, /readyz, /metrics.
func (p *Proxy) AdminServer(log *slog.Logger) *fasthttp.Server {
	return &fasthttp.Server{Handler: recovered(p.Handler.Admin, log), Name: "seckill-proxy-admin", ReadTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, IdleTimeout: time.Minute, Logger: fasthttpLogger{log}}
}

type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug("fasthttp: " + fmt.Sprintf(format, args...))
}
