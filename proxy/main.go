// Command proxy is the seckill edge proxy: shared sliding-window rate limits
// in Redis with a local token cache, in front of any HTTP upstream.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/cli"
	"github.com/seckill/seckill/internal/profiling"
	"github.com/seckill/seckill/internal/shutdown"
	"github.com/seckill/seckill/lua"
	"github.com/seckill/seckill/proxy/internal/edge"
	"github.com/seckill/seckill/proxy/internal/rls"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	cli.Report(os.Stderr, "proxy", err)
	os.Exit(cli.ExitCode(err))
}

// run serves until SIGINT/SIGTERM (or ctx ends) and drains; SIGHUP reloads
// the rules from the file (an invalid file keeps the running rules). Logs go
// to logOut.
func run(ctx context.Context, args []string, env func(string) string, stdout, logOut io.Writer) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	flags := cli.AddFlags(fs, "proxy", true)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if done, err := flags.Early(stdout, env, func(c conf.Config) string { return c.Proxy.AdminListen }); done {
		return err
	}
	path := &flags.Config
	cfg, err := conf.Load(*path, env)
	if err != nil {
		return err
	}
	log := cli.Logger(logOut, cfg.Log, "proxy")
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	stopPprof, err := profiling.Start(log)
	if err != nil {
		return err
	}
	defer stopPprof()

	rdb := cfg.Redis.NewClient()
	defer rdb.Close()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if err := lua.Preload(pctx, rdb); err != nil {
		// Not fatal: the limiter falls back per on_redis_error and the script
		// loads on the first call that reaches Redis.
		log.Warn("redis not reachable at start", "err", err)
	}
	cancel()

	p, err := edge.New(cfg, rdb, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Proxy.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Proxy.Listen, err)
	}
	aln, err := net.Listen("tcp", cfg.Proxy.AdminListen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("listen %s: %w", cfg.Proxy.AdminListen, err)
	}
	rsvc, rsrv, rln, err := startRLS(cfg, p, log)
	if err != nil {
		ln.Close()
		aln.Close()
		return err
	}
	srv, admin := p.Server(log), p.AdminServer(log)
	var gate shutdown.Gate
	admin.Handler = gate.Readyz(admin.Handler)

	bg, bgCancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.Handler.Limiter.Run(bg) })
	wg.Go(func() { p.Handler.Rooms.Run(bg) })
	subscribed := make(chan struct{})
	p.Handler.Subscribed = subscribed
	wg.Go(func() { p.WatchStockEvents(bg, rdb, log, subscribed) })
	errc := make(chan error, 3)
	go func() { errc <- srv.Serve(p.Listener(ln)) }()
	go func() { errc <- admin.Serve(aln) }()
	if rsrv != nil {
		wg.Go(func() { rsvc.Run(bg) })
		if err := rls.Watch(bg, rsvc, cfg.Proxy.RLS.Config, log); err != nil {
			// SIGHUP still reloads.
			log.Warn("rls config not watched", "path", cfg.Proxy.RLS.Config, "err", err)
		}
		go func() { errc <- rsrv.Serve(rln) }()
		log.Info("envoy rate-limit service serving", "listen", rln.Addr().String(), "config", cfg.Proxy.RLS.Config,
			"domains", rsvc.Config().Domains())
	}
	log.Info("proxy serving", "listen", ln.Addr().String(), "admin", aln.Addr().String(),
		"upstreams", cfg.Proxy.Upstreams, "rules", len(cfg.Proxy.Rules))

	var serveErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-errc:
			serveErr = fmt.Errorf("serve: %w", err)
			break loop
		case <-hup:
			reload(*path, env, p, log)
			if rsvc != nil {
				if err := rsvc.Reload(cfg.Proxy.RLS.Config); err != nil {
					log.Error("rls config reload rejected, running config kept", "path", cfg.Proxy.RLS.Config, "err", err)
				} else {
					log.Info("rls config reloaded", "path", cfg.Proxy.RLS.Config, "domains", rsvc.Config().Domains())
				}
			}
		}
	}
	if serveErr == nil {
		gate.Drain(log, cfg.Proxy.DrainDelay.Duration)
	}
	log.Info("proxy draining", "grace", cfg.Proxy.ShutdownGrace.Duration)
	sctx, scancel := context.WithTimeout(context.Background(), cfg.Proxy.ShutdownGrace.Duration)
	defer scancel()
	if rsrv != nil {
		rsrv.Stop(sctx)
	}
	if err := srv.ShutdownWithContext(sctx); err != nil && serveErr == nil {
		serveErr = fmt.Errorf("drain: %w", err)
	}
	if err := admin.ShutdownWithContext(sctx); err != nil && serveErr == nil && !errors.Is(err, context.DeadlineExceeded) {
		serveErr = fmt.Errorf("drain admin: %w", err)
	}
	bgCancel()
	wg.Wait()
	p.Handler.SoldOut.Close()
	return serveErr
}

func reload(path string, env func(string) string, p *edge.Proxy, log *slog.Logger) {
	cfg, err := conf.Load(path, env)
	if err == nil {
		err = p.Reload(cfg.Proxy)
	}
	if err != nil {
		log.Error("reload rejected, running rules kept", "path", path, "err", err)
		return
	}
	log.Info("rules, deny list and identity reloaded", "path", path, "rules", len(cfg.Proxy.Rules))
}

// startRLS builds the Envoy rate-limit service when [proxy] rls_listen is
// set: its windows in the HTTP edge's store (one batch queue, breaker and
// heartbeat for both), its metrics on the admin /metrics. The rls_* keys
// are read at start; a reload changes only the YAML rules.
func startRLS(cfg conf.Config, p *edge.Proxy, log *slog.Logger) (*rls.Service, *rls.Server, net.Listener, error) {
	rc := cfg.Proxy.RLS
	if rc.Listen == "" {
		return nil, nil, nil, nil
	}
	rules, err := rls.Load(rc.Config)
	if err != nil {
		return nil, nil, nil, err
	}
	mode, err := rls.ParseMode(rc.OnRedisError)
	if err != nil {
		return nil, nil, nil, err
	}
	lim := p.Handler.Limiter
	svc := rls.New(rules, rls.Options{Store: lim.SharedStore(), Live: lim.Live, Decided: lim.CountDecision,
		KeyPrefix: cfg.Redis.KeyPrefix, Mode: mode, Headers: rc.ResponseHeaders, Shadow: rc.ShadowMode,
		MaxCached: cfg.Proxy.MaxClientStates, Metrics: rls.NewMetrics(p.Handler.Registry), Log: log})
	ln, err := net.Listen("tcp", rc.Listen)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("listen %s: %w", rc.Listen, err)
	}
	srv := rls.NewServer(svc, rls.ServerOptions{MaxStreams: uint32(rc.MaxStreams), MaxMessageBytes: rc.MaxMessageBytes,
		Reflection: rc.Reflection})
	return svc, srv, ln, nil
}
