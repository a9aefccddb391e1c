// Command bench runs a flash sale against a seckill stack and says whether it
// kept its promises: it creates a sale through the admin API, sends purchases
// from many users and client addresses through the proxies (warm-up, rush,
// sold-out tail), waits for the queue to drain, verifies I1–I5 against MySQL
// and Redis, and reports latency, throughput and the verdict.
//
// Exit status: 0 verdict ok, 1 verdict FAIL, 2 the run could not be made.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/bench/internal/load"
	"github.com/seckill/seckill/bench/internal/report"
	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/verify"
)

// errVerdict marks a run that completed with a FAIL verdict.
var errVerdict = errors.New("verdict FAIL")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, errVerdict):
		os.Exit(1)
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
}

// options are the flags beyond the [bench] section.
type options struct {
	configPath  string
	adminToken  string
	jsonPath    string
	htmlPath    string
	quiet       bool
	beforeDrain string
	rabbitmqctl string
}

func parseFlags(args []string, stderr io.Writer) (conf.Config, options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var (
		targets, adminURL, sourceNet                    string
		activity                                        int64
		stock, limit, users, rate, conns, inflight, ips int
		retries                                         int
		duration, warmup, tail, drain, reqTimeout       time.Duration
		hot                                             float64
		xff                                             bool
		mysqlDSN, redisURL, redisPrefix                 string
		amqpURL, amqpPrefix                             string
	)
	fs.StringVar(&o.configPath, "config", conf.DefaultPath, "configuration file; flags override its [bench] section")
	fs.StringVar(&targets, "targets", "", "comma-separated target URLs (the proxies) [bench] targets")
	fs.StringVar(&adminURL, "admin-url", "", "backend URL the sale is created through [bench] admin_url")
	fs.StringVar(&o.adminToken, "admin-token", "", "bearer token of the admin API (default $SECKILL_ADMIN_TOKEN, else [backend] admin_token or admin_token_file)")
	fs.Int64Var(&activity, "activity", -1, "activity id; 0 picks a fresh one [bench] activity_id")
	fs.IntVar(&stock, "stock", 0, "units of the sale [bench] stock")
	fs.IntVar(&limit, "limit", 0, "per-user limit [bench] per_user_limit")
	fs.IntVar(&users, "users", 0, "distinct users [bench] users")
	fs.DurationVar(&duration, "duration", 0, "length of the rush [bench] duration")
	fs.DurationVar(&warmup, "warmup", -1, "warm-up before the rush [bench] warmup")
	fs.DurationVar(&tail, "tail", -1, "sold-out tail after the rush [bench] tail")
	fs.IntVar(&rate, "rate", -1, "open loop: requests/s (0: closed loop) [bench] rate")
	fs.IntVar(&conns, "connections", 0, "closed loop: concurrent clients [bench] connections")
	fs.IntVar(&inflight, "max-in-flight", 0, "open loop: bound of outstanding requests [bench] max_in_flight")
	fs.IntVar(&ips, "source-ips", -1, "distinct client source addresses (0: default address) [bench] source_ips")
	fs.StringVar(&sourceNet, "source-net", "", "loopback CIDR the source addresses come from [bench] source_net")
	fs.Float64Var(&hot, "hot-share", -1, "fraction of users behind a few shared addresses [bench] hot_share")
	fs.BoolVar(&xff, "forwarded-for", false, "send client addresses in X-Forwarded-For instead of binding them [bench] forwarded_for")
	fs.IntVar(&retries, "retries", -1, "retries with the same Idempotency-Key [bench] retries")
	fs.DurationVar(&reqTimeout, "request-timeout", 0, "bound of one attempt [bench] request_timeout")
	fs.DurationVar(&drain, "drain-timeout", 0, "bound of the drain wait [bench] drain_timeout")
	fs.StringVar(&o.jsonPath, "json", "", "write the report as JSON to this file")
	fs.StringVar(&o.htmlPath, "html", "", "write the report as a self-contained HTML page to this file")
	fs.StringVar(&mysqlDSN, "mysql-dsn", "", "verifier: MySQL DSN (default [mysql] dsn / $SECKILL_MYSQL_DSN)")
	fs.StringVar(&redisURL, "redis-url", "", "verifier: Redis URL (default [redis] url / $SECKILL_REDIS_URL)")
	fs.StringVar(&redisPrefix, "redis-prefix", "", "verifier: Redis key prefix (default [redis] key_prefix / $SECKILL_REDIS_PREFIX)")
	fs.StringVar(&amqpURL, "amqp-url", "", "drain: RabbitMQ URL (default [rabbitmq] url / $SECKILL_AMQP_URL)")
	fs.StringVar(&amqpPrefix, "amqp-prefix", "", "drain: RabbitMQ name prefix (default [rabbitmq] prefix / $SECKILL_AMQP_PREFIX)")
	fs.StringVar(&o.beforeDrain, "before-drain", "", "shell command run after the load and before the drain wait (e.g. start or resume workers)")
	fs.StringVar(&o.rabbitmqctl, "rabbitmqctl", "auto", "rabbitmqctl used to read unacknowledged messages; \"\" to skip, auto: from PATH")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress output")
	if err := fs.Parse(args); err != nil {
		return conf.Config{}, o, err
	}
	if fs.NArg() > 0 {
		return conf.Config{}, o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var cfg conf.Config
	var err error
	if _, statErr := os.Stat(o.configPath); statErr != nil && !set["config"] && errors.Is(statErr, os.ErrNotExist) {
		cfg, err = conf.Parse("", os.Getenv) // no file here: defaults and env
	} else {
		cfg, err = conf.LoadDefault(o.configPath)
	}
	if err != nil {
		return cfg, o, err
	}
	b := &cfg.Bench
	if set["targets"] {
		b.Targets = nil
		for _, t := range strings.Split(targets, ",") {
			if t = strings.TrimSpace(t); t != "" {
				b.Targets = append(b.Targets, t)
			}
		}
	}
	str := func(name string, dst *string, v string) {
		if set[name] {
			*dst = v
		}
	}
	num := func(name string, dst *int, v int) {
		if set[name] {
			*dst = v
		}
	}
	dur := func(name string, dst *conf.Duration, v time.Duration) {
		if set[name] {
			dst.Duration = v
		}
	}
	str("admin-url", &b.AdminURL, adminURL)
	if set["activity"] {
		b.ActivityID = activity
	}
	num("stock", &b.Stock, stock)
	num("limit", &b.PerUserLimit, limit)
	num("users", &b.Users, users)
	dur("duration", &b.Duration, duration)
	dur("warmup", &b.Warmup, warmup)
	dur("tail", &b.Tail, tail)
	num("rate", &b.Rate, rate)
	num("connections", &b.Connections, conns)
	num("max-in-flight", &b.MaxInFlight, inflight)
	num("source-ips", &b.SourceIPs, ips)
	str("source-net", &b.SourceNet, sourceNet)
	if set["hot-share"] {
		b.HotShare = hot
	}
	if set["forwarded-for"] {
		b.ForwardedFor = xff
	}
	num("retries", &b.Retries, retries)
	dur("request-timeout", &b.RequestTimeout, reqTimeout)
	dur("drain-timeout", &b.DrainTimeout, drain)
	str("mysql-dsn", &cfg.MySQL.DSN, mysqlDSN)
	str("redis-url", &cfg.Redis.URL, redisURL)
	str("redis-prefix", &cfg.Redis.KeyPrefix, redisPrefix)
	str("amqp-url", &cfg.RabbitMQ.URL, amqpURL)
	str("amqp-prefix", &cfg.RabbitMQ.Prefix, amqpPrefix)
	if err := cfg.Validate(); err != nil {
		return cfg, o, err
	}
	if !set["admin-token"] {
		o.adminToken = os.Getenv(conf.EnvAdminToken)
		if o.adminToken == "" {
			// admin_token or admin_token_file, as the backend reads them.
			tok, err := cfg.Backend.ReadAdminToken()
			if err != nil {
				return cfg, o, err
			}
			o.adminToken = tok
		}
	}
	if o.adminToken == "" {
		return cfg, o, errors.New("no admin token: set -admin-token or SECKILL_ADMIN_TOKEN")
	}
	if o.rabbitmqctl == "auto" {
		o.rabbitmqctl = ""
		if p, err := exec.LookPath("rabbitmqctl"); err == nil {
			o.rabbitmqctl = p
		}
	}
	return cfg, o, nil
}

// bucketFor picks the timeline resolution: about 150 points, 100 ms to 5 s.
func bucketFor(total time.Duration) time.Duration {
	b := (total / 150).Round(100 * time.Millisecond)
	return min(max(b, 100*time.Millisecond), 5*time.Second)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	b := cfg.Bench
	if b.ActivityID == 0 {
		b.ActivityID = time.Now().UnixMilli()
	}

	// The verifier's connections first: a run that cannot be verified is not
	// worth starting.
	db, rdb, err := openStores(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	defer rdb.Close()
	if n, err := existingOrders(ctx, db, b.ActivityID); err != nil {
		return err
	} else if n > 0 {
		return fmt.Errorf("activity %d already has %d orders in MySQL: pick a fresh -activity (0 picks one)", b.ActivityID, n)
	}
	topo := broker.TopologyFor(cfg.RabbitMQ)
	if c, err := amqp.Dial(cfg.RabbitMQ.URL); err != nil {
		return fmt.Errorf("rabbitmq %s: %w", redactURL(cfg.RabbitMQ.URL), err)
	} else {
		_ = c.Close()
	}

	lc := load.Config{
		Targets: b.Targets, ActivityID: b.ActivityID, Users: b.Users, UserPrefix: "u", Quantity: 1,
		Warmup: b.Warmup.Duration, Rush: b.Duration.Duration, Tail: b.Tail.Duration,
		Rate: b.Rate, Connections: b.Connections, MaxInFlight: b.MaxInFlight,
		HotShare: b.HotShare, ForwardedFor: b.ForwardedFor,
		RequestTimeout: b.RequestTimeout.Duration, Retries: b.Retries,
	}
	if b.SourceIPs > 0 {
		if lc.Sources, err = load.SourceAddrs(b.SourceNet, b.SourceIPs); err != nil {
			return err
		}
	}
	total := lc.Warmup + lc.Rush + lc.Tail
	start := time.Now()
	rec := load.NewRecorder(start, bucketFor(total), b.Users, b.SourceIPs)
	runner, err := load.NewRunner(lc, rec)
	if err != nil {
		return err
	}
	tl := runner.Plan(start)
	sale := load.Sale{ID: b.ActivityID, Stock: b.Stock, PerUserLimit: b.PerUserLimit,
		StartsAt: tl.RushStart, EndsAt: tl.RushStart.Add(b.SaleLength.Duration)}
	if err := load.CreateSale(ctx, b.AdminURL, o.adminToken, sale); err != nil {
		return err
	}
	prog := newProgress(stderr, o.quiet, rec, tl)
	prog.start(ctx)
	err = runner.Run(ctx, tl)
	prog.stop()
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}

	var problems []string
	if o.beforeDrain != "" {
		cmd := exec.CommandContext(ctx, "sh", "-c", o.beforeDrain)
		cmd.Stdout, cmd.Stderr = stderr, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("-before-drain %q: %w", o.beforeDrain, err)
		}
	}
	snap := rec.Snapshot()
	drainer := &verify.Drainer{DB: db, Redis: rdb, Prefix: cfg.Redis.KeyPrefix, AMQPURL: cfg.RabbitMQ.URL,
		Queue: topo.Queue, DeadQueue: topo.DeadQueue, Rabbitmqctl: o.rabbitmqctl, Accepted: acceptedIDs(snap.Accepted)}
	dprog := newProgress(stderr, o.quiet, nil, tl)
	dres, err := drainer.Wait(ctx, b.ActivityID, b.DrainTimeout.Duration, dprog.drainTick)
	dprog.done()
	if err != nil {
		return err
	}
	if dres.Problem != "" {
		problems = append(problems, "drain: "+dres.Problem)
	}

	var api *verify.APIState
	if st, err := load.FetchState(ctx, b.AdminURL, b.ActivityID); err != nil {
		problems = append(problems, err.Error())
	} else {
		api = &st
	}
	checker := &verify.Checker{DB: db, Redis: rdb, Prefix: cfg.Redis.KeyPrefix}
	v, err := checker.Check(ctx, verify.Input{ActivityID: b.ActivityID, Stock: int64(b.Stock),
		Limit: int64(b.PerUserLimit), Accepted: snap.Accepted, API: api})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	model := "closed"
	if b.Rate > 0 {
		model = "open"
	}
	rr := report.Run{StartedAt: start, Targets: b.Targets, AdminURL: b.AdminURL, ActivityID: b.ActivityID,
		Stock: b.Stock, PerUserLimit: b.PerUserLimit, Users: b.Users, Model: model, Rate: b.Rate,
		Warmup: lc.Warmup.Seconds(), Rush: lc.Rush.Seconds(), Tail: lc.Tail.Seconds(),
		SourceIPs: b.SourceIPs, HotShare: b.HotShare, ForwardedFor: b.ForwardedFor, Retries: b.Retries}
	if model == "closed" {
		rr.Connections = b.Connections
	}
	rep := report.Build(rr, snap, tl, dres, api, v)
	rep.Problems = problems
	if o.jsonPath != "" {
		if err := report.WriteFile(o.jsonPath, rep.WriteJSON); err != nil {
			return err
		}
	}
	if o.htmlPath != "" {
		if err := report.WriteFile(o.htmlPath, rep.WriteHTML); err != nil {
			return err
		}
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if !v.OK {
		return errVerdict
	}
	return nil
}

func acceptedIDs(acc []verify.Accepted) []string {
	seen := make(map[string]bool, len(acc))
	ids := make([]string, 0, len(acc))
	for _, a := range acc {
		if !seen[a.OrderID] {
			seen[a.OrderID] = true
			ids = append(ids, a.OrderID)
		}
	}
	return ids
}

func openStores(ctx context.Context, cfg conf.Config) (*sql.DB, *redis.Client, error) {
	dc, err := cfg.MySQL.Driver()
	if err != nil {
		return nil, nil, fmt.Errorf("mysql dsn: %w", err)
	}
	connector, err := mysql.NewConnector(dc)
	if err != nil {
		return nil, nil, fmt.Errorf("mysql: %w", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(4)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := db.PingContext(cctx); err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("mysql %s@%s/%s: %w", dc.User, dc.Addr, dc.DBName, err)
	}
	opt := cfg.Redis.Options()
	opt.PoolSize = 4
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(cctx).Err(); err != nil {
		_ = db.Close()
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("redis %s: %w", opt.Addr, err)
	}
	return db, rdb, nil
}

// existingOrders counts the activity's orders; a missing table counts 0 (the
// backend creates the schema).
func existingOrders(ctx context.Context, db *sql.DB, id int64) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM orders WHERE activity_id = ?", id).Scan(&n)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1146 { // table doesn't exist
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("mysql: %w", err)
	}
	return n, nil
}

func redactURL(u string) string {
	if i := strings.Index(u, "@"); i > 0 {
		if j := strings.Index(u, "://"); j > 0 && j < i {
			return u[:j+3] + "…" + u[i:]
		}
	}
	return u
}
