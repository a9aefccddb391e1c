package edge

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/metrics"
	"github.com/seckill/seckill/proxy/internal/forward"
	"github.com/seckill/seckill/proxy/internal/identity"
	"github.com/seckill/seckill/proxy/internal/limiter"
	"github.com/seckill/seckill/proxy/internal/soldout"
)

// Proxy is one wired proxy instance (without its listeners).
type Proxy struct {
	Handler *Handler
	Metrics *limiter.Metrics
	cfg     conf.Config
}

// Option adjusts New.
type Option func(*limiter.Config)

// WithTrace reports every admitted request's windows with their Redis-time
// decision stamps (see limiter.Config.Trace); for tests.
func WithTrace(fn func(policy, client string, redisMicros int64)) Option {
	return func(c *limiter.Config) { c.Trace = fn }
}

// New wires a proxy instance from a validated configuration.
func New(cfg conf.Config, rdb *redis.Client, log *slog.Logger, opts ...Option) (*Proxy, error) {
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
	lc := limiter.Config{Redis: rdb, KeyPrefix: cfg.Redis.KeyPrefix, Timeout: cfg.Proxy.RedisTimeout.Duration,
		Instance: inst, Metrics: lm, Log: log}
	for _, o := range opts {
		o(&lc)
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
	h := &Handler{Limiter: lim, Identity: id, Pool: pool, SoldOut: soldout.New(cfg.Proxy.SoldOutTTL.Duration, reg), Registry: reg,
		Security: NewSecurityMetrics(reg), metrics: metrics.Handler(reg)}
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
	p.Handler.SetRules(rs)
	p.Handler.SetGate(gate)
	return nil
}

// Server is the forwarding listener's server.
func (p *Proxy) Server(log *slog.Logger) *fasthttp.Server {
	c := p.cfg.Proxy
	return &fasthttp.Server{
		Handler:                       p.Handler.Serve,
		ErrorHandler:                  ServerError,
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

// AdminServer serves /healthz, /readyz, /metrics.
func (p *Proxy) AdminServer(log *slog.Logger) *fasthttp.Server {
	return &fasthttp.Server{Handler: p.Handler.Admin, Name: "seckill-proxy-admin", ReadTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, IdleTimeout: time.Minute, Logger: fasthttpLogger{log}}
}

type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug("fasthttp: " + fmt.Sprintf(format, args...))
}
