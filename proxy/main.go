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
	flags.Validate = func(c conf.Config) error {
		_, _, err := loadRLS(c.Proxy.RLS)
		return err
	}
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
	front, err := startRLS(cfg, p, log)
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
	if front != nil {
		wg.Go(func() { front.svc.Run(bg) })
		front.watch(bg, log)
		go func() { errc <- front.srv.Serve(front.ln) }()
		log.Info("envoy rate-limit service serving", "listen", front.ln.Addr().String(), "config", front.rc.Config,
			"domains", front.svc.Config().Domains())
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
			next, ok := reload(*path, env, p, log)
			switch {
			case !ok:
			case front != nil:
				front.reload(bg, next.Proxy.RLS, log)
			case next.Proxy.RLS.Listen != "":
				log.Warn("rls_listen set on reload: turning the Envoy rate-limit service on needs a restart; it stays off")
			}
		}
	}
	if serveErr == nil {
		gate.Drain(log, cfg.Proxy.DrainDelay.Duration)
	}
	log.Info("proxy draining", "grace", cfg.Proxy.ShutdownGrace.Duration)
	sctx, scancel := context.WithTimeout(context.Background(), cfg.Proxy.ShutdownGrace.Duration)
	defer scancel()
	if front != nil {
		front.srv.Stop(sctx)
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

// reload reloads the HTTP edge from the file; ok: the file loaded, and
// cfg is what the Envoy service reloads from (it applies its own part, or
// not, on its own: a front end's bad rules do not hold the other's back).
// A file that does not load changes nothing.
func reload(path string, env func(string) string, p *edge.Proxy, log *slog.Logger) (cfg conf.Config, ok bool) {
	cfg, err := conf.Load(path, env)
	if err != nil {
		log.Error("reload rejected, running rules kept", "path", path, "err", err)
		return cfg, false
	}
	if err := p.Reload(cfg.Proxy); err != nil {
		log.Error("reload rejected, running rules kept", "path", path, "err", err)
		return cfg, true
	}
	log.Info("rules, deny list and identity reloaded", "path", path, "rules", len(cfg.Proxy.Rules))
	return cfg, true
}
