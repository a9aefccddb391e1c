// Command worker is a member of the worker fleet: it consumes orders from
// RabbitMQ, writes them to MySQL in batches and settles them in Redis. It
// serves /healthz, /readyz and /metrics on [worker] listen.
//
//	worker [-config PATH]    run a fleet member
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/metrics"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/lua"
	"github.com/seckill/seckill/worker/internal/consume"
	"github.com/seckill/seckill/worker/internal/store"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "worker:", err)
		}
		os.Exit(1)
	}
}

// run picks the subcommand: a first argument that is not a flag names one;
// without one the process runs as a fleet member.
func run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		return fmt.Errorf("unknown command %q (usage: worker [-config PATH])", args[0])
	}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	path := fs.String("config", conf.DefaultPath, "configuration file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg, err := conf.LoadDefault(*path)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "worker")
	return fleet(ctx, cfg, log)
}

// fleet wires the clients and packages of a fleet member and blocks until ctx
// ends and the batches in hand are finished.
func fleet(ctx context.Context, cfg conf.Config, log *slog.Logger) error {
	rdb := redis.NewClient(cfg.Redis.Options())
	defer rdb.Close()
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := lua.Preload(startCtx, rdb); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	db, err := schema.Open(startCtx, cfg.MySQL)
	if err != nil {
		return err
	}
	defer db.Close()

	reg := metrics.NewRegistry()
	m := workermetrics.New(reg)
	consumer := consume.New(consume.ConfigFrom(cfg),
		reservation.New(rdb, cfg.Redis.KeyPrefix),
		store.New(db, m, cfg.MySQL.QueryTimeout.Duration),
		m, log)

	ln, err := net.Listen("tcp", cfg.Worker.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Worker.Listen, err)
	}
	srv := &fasthttp.Server{
		Handler:               admin(rdb, db, consumer, metrics.Handler(reg)),
		Name:                  "seckill-worker",
		ReadTimeout:           5 * time.Second,
		WriteTimeout:          10 * time.Second,
		IdleTimeout:           time.Minute,
		NoDefaultServerHeader: true,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("worker started", "listen", ln.Addr().String(), "queue", consume.ConfigFrom(cfg).Topology.Queue)

	// The consumer declares the topology on every (re)connect and returns
	// once ctx ended and its batches in hand are written, acked and settled.
	cerr := consumer.Run(ctx)
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

// admin serves /healthz (the process runs), /readyz (Redis, RabbitMQ and
// MySQL reachable) and /metrics.
func admin(rdb *redis.Client, db *sql.DB, c *consume.Consumer, metricsHandler fasthttp.RequestHandler) fasthttp.RequestHandler {
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
			writeJSON(ctx, status, map[string]any{"status": word, "checks": checks})
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
