// Command backend is the seckill purchase service: it reserves in Redis,
// publishes orders with publisher confirms, and serves the API of docs/contract.md.
// Wiring only: config → logger → clients → packages → server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/seckill/seckill/backend/internal/api"
	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/cli"
	"github.com/seckill/seckill/internal/metrics"
	"github.com/seckill/seckill/internal/profiling"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/shutdown"
	"github.com/seckill/seckill/internal/soldout"
	"github.com/seckill/seckill/lua"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	cli.Report(os.Stderr, "backend", err)
	os.Exit(cli.ExitCode(err))
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("backend", flag.ContinueOnError)
	flags := cli.AddFlags(fs, "backend", true)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if done, err := flags.Early(os.Stdout, os.Getenv, func(c conf.Config) string { return c.Backend.Listen }); done {
		return err
	}
	cfg, err := conf.LoadDefault(flags.Config)
	if err != nil {
		return err
	}
	log := cli.Logger(os.Stderr, cfg.Log, "backend")
	adminToken, err := cfg.Backend.LoadAdminToken()
	if err != nil {
		return err
	}
	if cfg.Backend.DevMode {
		log.Warn("dev_mode: weak and sample admin tokens are accepted; never in production")
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	stopPprof, err := profiling.Start(log)
	if err != nil {
		return err
	}
	defer stopPprof()

	// Clients.
	rdb := cfg.Redis.NewClient()
	defer rdb.Close()
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rdb.Ping(startCtx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if err := lua.Preload(startCtx, rdb); err != nil {
		return err
	}
	db, err := schema.Open(startCtx, cfg.MySQL)
	if err != nil {
		return err
	}
	defer db.Close()
	reg := metrics.NewRegistry("backend")
	host, _ := os.Hostname()
	pub, err := broker.NewPublisher(startCtx,
		broker.PublisherConfigFrom(cfg.RabbitMQ, fmt.Sprintf("seckill-backend@%s:%d", host, os.Getpid())),
		log, broker.NewPublisherMetrics(reg, "seckill_backend"))
	if err != nil {
		return err
	}
	defer pub.Close()

	// Packages.
	store := reservation.New(rdb, cfg.Redis.KeyPrefix)
	var orders sale.Publisher = pub
	if n, g, err := crashHooks(); err != nil {
		return err
	} else if n > 0 || g > 0 {
		log.Warn("test hook armed: the process exits after this many reservations, or at the publish of a group this large, before publishing",
			"env", envCrashAfterReserve, "n", n, "group_env", envCrashAtGroup, "group", g)
		orders = &crashingPublisher{next: pub, after: n, group: g}
	}
	svc := sale.New(store, db, orders, sale.Config{
		ReservationTTL:  cfg.Backend.ReservationTTL.Duration,
		RedisTimeout:    cfg.Backend.RedisTimeout.Duration,
		PublishTimeout:  cfg.Backend.PublishTimeout.Duration,
		QueryTimeout:    cfg.MySQL.QueryTimeout.Duration,
		SoldOutTTL:      cfg.Backend.SoldOutTTL.Duration,
		StateTTL:        cfg.Backend.StateCacheTTL.Duration,
		OrderWaitMax:    cfg.Backend.OrderWaitMax.Duration,
		MaxOrderWaiters: cfg.Backend.MaxOrderWaiters,
		StockShards:     cfg.Backend.StockShards,
		RecoveryMax:     cfg.Backend.ReservationTTL.Duration + cfg.Worker.QueuedExpireAfter.Duration,
		GroupMax:        cfg.Backend.GroupMax,
		GroupLinger:     cfg.Backend.GroupLinger.Duration,
		GroupBatch:      cfg.Backend.GroupMessage == conf.GroupBatch,
	}, log, sale.NewMetrics(reg))
	defer svc.Close() // before Redis closes: background undos end first
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	var watched sync.WaitGroup
	subscribed := make(chan struct{})
	watched.Go(func() { svc.WatchStockEvents(watchCtx, rdb, subscribed) })
	watched.Go(func() { svc.WatchOrders(watchCtx, rdb, nil) })
	defer func() { stopWatch(); watched.Wait() }()

	// Purchases need Redis and the broker; MySQL only to rebuild a sale Redis
	// lost, so a MySQL blip must not take every backend out of rotation: it
	// is reported, not gating.
	checks := []api.Check{
		{Name: "redis", Fn: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }},
		{Name: "rabbitmq", Fn: func(context.Context) error { return pub.Ready() }, Detail: pub.Status},
		{Name: "mysql", Fn: db.PingContext, Optional: true},
		{Name: "stock events", Fn: func(context.Context) error { return soldout.Subscribed(subscribed) }},
	}
	edge := api.New(svc, api.Config{
		AdminToken:      adminToken,
		AdminFailLimit:  cfg.Backend.AdminFailures.Limit,
		AdminFailWindow: cfg.Backend.AdminFailures.Window.Duration,
		MaxBodyBytes:    cfg.Backend.MaxBodyBytes,
		AdminBodyBytes:  cfg.Backend.AdminBodyBytes,
		RetryAfter:      cfg.Backend.RetryAfter.Duration,
		CheckTimeout:    cfg.Backend.RedisTimeout.Duration + time.Second,
		ReadTimeout:     cfg.Backend.ReadTimeout.Duration,
		WriteTimeout:    cfg.Backend.WriteTimeout.Duration,
		IdleTimeout:     cfg.Backend.IdleTimeout.Duration,
		StateTTL:        cfg.Backend.StateCacheTTL.Duration,
	}, checks, reg, log, api.NewMetrics(reg))

	// Server.
	srv := edge.Server()
	var gate shutdown.Gate
	srv.Handler = gate.Readyz(srv.Handler)
	ln, err := net.Listen("tcp", cfg.Backend.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Backend.Listen, err)
	}
	log.Info("backend listening", "addr", ln.Addr().String(), "admin_api", adminToken != "")
	served := make(chan error, 1)
	go func() { served <- srv.Serve(edge.Listener(ln)) }()
serving:
	for {
		select {
		case err := <-served:
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
			break serving
		case <-hup:
			reloadAdminToken(flags.Config, adminToken != "", edge, log)
		}
	}
	gate.Drain(log, cfg.Backend.DrainDelay.Duration)
	log.Info("backend draining", "grace", cfg.Backend.ShutdownGrace.Duration)
	drainCtx, cancelDrain := context.WithTimeout(context.Background(), cfg.Backend.ShutdownGrace.Duration)
	defer cancelDrain()
	// In-flight purchases finish (publish and confirm) before the publisher,
	// Redis and MySQL close in the deferred calls above.
	if err := srv.ShutdownWithContext(drainCtx); err != nil {
		if !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("shutdown: %w", err)
		}
		log.Warn("backend drain timed out; closing with requests in flight")
	}
	<-served
	log.Info("backend stopped")
	return nil
}

// reloadAdminToken re-reads the admin token (admin_token_file, or the
// config's admin_token) on SIGHUP; a token that fails the policy, or that
// would turn the admin API on or off (fixed at start), keeps the running one.
func reloadAdminToken(path string, enabled bool, edge *api.API, log *slog.Logger) {
	cfg, err := conf.LoadDefault(path)
	if err != nil {
		log.Error("reload rejected, admin token kept", "err", err)
		return
	}
	tok, err := cfg.Backend.LoadAdminToken()
	if err == nil && (tok != "") != enabled {
		err = errors.New("turning the admin API on or off needs a restart")
	}
	if err != nil {
		log.Error("reload rejected, admin token kept", "err", err)
		return
	}
	edge.SetAdminToken(tok)
	log.Info("admin token reloaded", "from", cfg.Backend.AdminTokenKey())
}
