// Command worker is a member of the worker fleet: it consumes orders from
// RabbitMQ, writes them to MySQL in batches and settles them in Redis. It
// serves /healthz, /readyz and /metrics on [worker] listen.
//
//	worker [-config PATH]                     run a fleet member
//	worker reconcile [-force] [-config PATH]  one reconciliation pass, printed
//	worker teardown -yes [-config PATH]       delete the stack's Redis keys (by
//	                                          key prefix), queues, exchanges and
//	                                          database: what demo/bench stacks
//	                                          run when they stop
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/cli"
	"github.com/seckill/seckill/internal/metrics"
	"github.com/seckill/seckill/internal/profiling"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/shutdown"
	"github.com/seckill/seckill/internal/teardown"
	"github.com/seckill/seckill/lua"
	"github.com/seckill/seckill/worker/internal/archive"
	"github.com/seckill/seckill/worker/internal/backlog"
	"github.com/seckill/seckill/worker/internal/consume"
	"github.com/seckill/seckill/worker/internal/reconcile"
	"github.com/seckill/seckill/worker/internal/store"
	"github.com/seckill/seckill/worker/internal/sweep"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	cli.Report(os.Stderr, "worker", err)
	os.Exit(cli.ExitCode(err))
}

// run picks the subcommand: a first argument that is not a flag names one;
// without one the process runs as a fleet member.
func run(ctx context.Context, args []string) error {
	command := ""
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		command, args = args[0], args[1:]
		if command != "reconcile" && command != "teardown" {
			return fmt.Errorf("unknown command %q (usage: worker [reconcile [-force] | teardown -yes] [-config PATH])", command)
		}
	}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	flags := cli.AddFlags(fs, "worker", command == "")
	force, yes := false, false
	switch command {
	case "reconcile":
		fs.BoolVar(&force, "force", false, "sync every sale exactly under MySQL's row lock")
	case "teardown":
		fs.BoolVar(&yes, "yes", false, "really delete the stack's keys, queues, exchanges and database")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if done, err := flags.Early(os.Stdout, os.Getenv, func(c conf.Config) string { return c.Worker.Listen }); done {
		return err
	}
	cfg, err := conf.LoadDefault(flags.Config)
	if err != nil {
		return err
	}
	log := cli.Logger(os.Stderr, cfg.Log, "worker")
	switch command {
	case "reconcile":
		return reconcileOnce(ctx, cfg, log, force)
	case "teardown":
		if !yes {
			return fmt.Errorf("teardown deletes Redis keys under %q, queues and exchanges under %q and database of %s: pass -yes",
				cfg.Redis.KeyPrefix, cfg.RabbitMQ.Prefix, cfg.MySQL.DSN)
		}
		return teardownOnce(ctx, cfg)
	}
	return fleet(ctx, cfg, log)
}

// openStores connects to Redis (scripts preloaded) and MySQL (schema ensured).
func openStores(ctx context.Context, cfg conf.Config) (redis.UniversalClient, *sql.DB, error) {
	rdb := cfg.Redis.NewClient()
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := lua.Preload(pctx, rdb)
	cancel()
	if err != nil {
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	// Every worker transaction is READ COMMITTED: set once per connection.
	db, err := schema.Open(ctx, cfg.MySQL, schema.ReadCommitted)
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return rdb, db, nil
}

// reconcileOnce runs one pass and prints a line per sale.
func reconcileOnce(ctx context.Context, cfg conf.Config, log *slog.Logger, force bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rdb, db, err := openStores(ctx, cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()
	defer db.Close()
	rec := reconcile.New(db, reservation.New(rdb, cfg.Redis.KeyPrefix), log, nil, cfg.MySQL.QueryTimeout.Duration)
	rec.SetRecoveryWindow(cfg.Backend.ReservationTTL.Duration + cfg.Worker.QueuedExpireAfter.Duration)
	reports, err := rec.Pass(ctx, force)
	for _, r := range reports {
		fmt.Println(r)
	}
	return err
}

// teardownOnce removes the stack of cfg and prints what it removed.
func teardownOnce(ctx context.Context, cfg conf.Config) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rep, err := teardown.Remove(ctx, cfg)
	fmt.Printf("teardown: %d Redis keys, queues %v, exchanges %v, database %s (present: %v)\n",
		rep.RedisKeys, rep.Queues, rep.Exchanges, rep.Database, rep.DatabaseWasPresent)
	return err
}

// fleet wires the clients and packages of a fleet member and blocks until ctx
// ends and the batches in hand are finished.
func fleet(ctx context.Context, cfg conf.Config, log *slog.Logger) error {
	stopPprof, err := profiling.Start(log)
	if err != nil {
		return err
	}
	defer stopPprof()
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rdb, db, err := openStores(startCtx, cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()
	defer db.Close()

	reg := metrics.NewRegistry("worker")
	m := workermetrics.New(reg)
	sales := reservation.New(rdb, cfg.Redis.KeyPrefix)
	topo := broker.TopologyFor(cfg.RabbitMQ)
	queues := backlog.New(rdb, sales, cfg.RabbitMQ.AMQPURL(), topo.QueueNames(), 2*time.Second)
	defer queues.Close()
	reg.MustRegister(queues)
	endRecovery := func(ctx context.Context, id int64, token string) (bool, error) {
		// Reads and restores every decided order of the sale: more than one query.
		ctx, cancel := context.WithTimeout(ctx, 4*cfg.MySQL.QueryTimeout.Duration)
		defer cancel()
		return salesdb.EndRecovery(ctx, db, sales, id, token)
	}
	consumer := consume.New(consume.ConfigFrom(cfg), sales, store.New(db, m, cfg.MySQL.QueryTimeout.Duration), endRecovery, m, log)

	// The sweeper, the reconciler and the archiver run beside the consumer
	// until ctx ends.
	var side sync.WaitGroup
	side.Add(3)
	go func() {
		defer side.Done()
		sweepLoop(ctx, cfg, rdb, sales, db, log)
	}()
	go func() {
		defer side.Done()
		rec := reconcile.New(db, sales, log, reconcile.NewMetrics(reg), cfg.MySQL.QueryTimeout.Duration)
		rec.SetRecoveryWindow(cfg.Backend.ReservationTTL.Duration + cfg.Worker.QueuedExpireAfter.Duration)
		rec.Run(ctx, cfg.Worker.ReconcileInterval.Duration)
	}()
	go func() {
		defer side.Done()
		archive.New(archive.Config{
			Interval:     cfg.Worker.ArchiveInterval.Duration,
			Grace:        cfg.Worker.ArchiveGrace.Duration,
			SummaryTTL:   cfg.Worker.ArchiveSummaryTTL.Duration,
			QueryTimeout: cfg.MySQL.QueryTimeout.Duration,
			Instance:     instanceName(),
			Locked:       archiveHold(),
		}, rdb, sales, db, log, archive.NewMetrics(reg)).Run(ctx)
	}()
	defer side.Wait()

	ln, err := net.Listen("tcp", cfg.Worker.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Worker.Listen, err)
	}
	var gate shutdown.Gate
	srv := &fasthttp.Server{
		Handler:               gate.Readyz(admin(rdb, db, consumer, metrics.Handler(reg))),
		Name:                  "seckill-worker",
		ReadTimeout:           5 * time.Second,
		WriteTimeout:          10 * time.Second,
		IdleTimeout:           time.Minute,
		NoDefaultServerHeader: true,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("worker started", "listen", ln.Addr().String(), "queues", consume.ConfigFrom(cfg).Topology.OrderQueues(), "partitions", cfg.Worker.Partitions)

	// On SIGTERM readiness fails for drain_delay while the worker still
	// consumes; then consuming stops.
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	go func() {
		select {
		case <-ctx.Done():
			gate.Drain(log, cfg.Worker.DrainDelay.Duration)
		case <-workCtx.Done():
		}
		stopWork()
	}()
	// The consumer declares the topology on every (re)connect and returns
	// once workCtx ended and its batches in hand are written, acked and settled.
	cerr := consumer.Run(workCtx)
	shutCtx, cancelShut := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancelShut()
	if err := srv.ShutdownWithContext(shutCtx); err != nil {
		log.Warn("admin server shutdown", "err", err)
	}
	if err := <-served; err != nil && cerr == nil {
		cerr = fmt.Errorf("serve %s: %w", ln.Addr(), err)
	}
	log.Info("worker stopped")
	return cerr
}

// sweepLoop runs the sweeper until ctx ends.
func sweepLoop(ctx context.Context, cfg conf.Config, rdb redis.UniversalClient, sales *reservation.Store, db *sql.DB, log *slog.Logger) {
	s := sweep.New(sweep.Config{
		Interval:     cfg.Worker.SweepInterval.Duration,
		Grace:        cfg.Worker.RepublishAfter.Duration,
		QueuedGrace:  cfg.Worker.QueuedExpireAfter.Duration,
		QueryTimeout: cfg.MySQL.QueryTimeout.Duration,
		Instance:     instanceName(),
	}, rdb, sales, db, log)
	if err := s.Run(ctx); err != nil {
		log.Error("sweeper stopped", "err", err)
	}
}

// instanceName names this process as a lease holder.
func instanceName() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}

// admin serves /healthz (the process runs), /readyz (Redis, RabbitMQ and
// MySQL reachable) and /metrics.
func admin(rdb redis.UniversalClient, db *sql.DB, c *consume.Consumer, metricsHandler fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/healthz":
			writeJSON(ctx, fasthttp.StatusOK, map[string]string{"status": "ok"})
		case "/readyz":
			checks := map[string]string{}
			ok := true
			note := func(name string, err error) {
				checks[name] = "ok"
				if err != nil {
					checks[name], ok = err.Error(), false
				}
			}
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			note("redis", rdb.Ping(cctx).Err())
			note("mysql", db.PingContext(cctx))
			cancel()
			note("rabbitmq", c.Ready())
			status, word := fasthttp.StatusOK, "ok"
			if !ok {
				status, word = fasthttp.StatusServiceUnavailable, "unavailable"
			}
			node := c.Node()
			if node == "" {
				node = "none"
			}
			writeJSON(ctx, status, map[string]any{"status": word, "checks": checks,
				"details": map[string]string{"rabbitmq": "node " + node}})
		case "/metrics":
			metricsHandler(ctx)
		default:
			writeJSON(ctx, fasthttp.StatusNotFound, map[string]string{"code": "not_found"})
		}
	}
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, _ := json.Marshal(v) // maps of strings always marshal
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
