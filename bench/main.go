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
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/bench/internal/load"
	"github.com/seckill/seckill/bench/internal/proccpu"
	"github.com/seckill/seckill/bench/internal/report"
	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/cli"
	"github.com/seckill/seckill/internal/redisnodes"
	"github.com/seckill/seckill/internal/verify"
)

// errVerdict marks a run that completed with a FAIL verdict.
var errVerdict = errors.New("verdict FAIL")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(os.Stderr, err))
}

// exitCode: 0 verdict ok (or -h, -version, a valid -check), 1 verdict FAIL
// (or an invalid -check), 2 the run could not be made.
func exitCode(stderr io.Writer, err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errDone):
		return 0
	case errors.Is(err, cli.ErrCheckFailed):
		return 1
	case errors.Is(err, errVerdict):
		return 1
	}
	fmt.Fprintln(stderr, "bench:", err)
	return 2
}

// bucketFor picks the timeline resolution: about 150 points, 100 ms to 5 s.
func bucketFor(total time.Duration) time.Duration {
	b := (total / 150).Round(100 * time.Millisecond)
	return min(max(b, 100*time.Millisecond), 5*time.Second)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "ceilings" {
		return runCeilings(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "fairness" {
		return runFairness(ctx, args[1:], stdout, stderr)
	}
	cfg, o, err := parseFlags(args, stdout, stderr)
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
	if nodes, err := broker.NodesFor(cfg.RabbitMQ); err != nil {
		return err
	} else if c, err := nodes.Dial(); err != nil {
		return fmt.Errorf("rabbitmq %s: %w", conf.Redact(cfg.RabbitMQ.AMQPURL()), err)
	} else {
		_ = c.Close()
	}

	lc := load.Config{
		Targets: b.Targets, ActivityID: b.ActivityID, Users: b.Users, UserPrefix: "u", Quantity: 1,
		Warmup: b.Warmup.Duration, Rush: b.Duration.Duration, Tail: b.Tail.Duration,
		Rate: b.Rate, Connections: b.Connections, MaxInFlight: b.MaxInFlight,
		HotShare: b.HotShare, UnkeyedShare: b.UnkeyedShare, ReplayShare: b.ReplayShare, ForwardedFor: b.ForwardedFor,
		RequestTimeout: b.RequestTimeout.Duration, Retries: b.Retries,
		StatePollRate: b.StatePollRate, OrderWait: b.OrderWait.Duration,
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
	// Each master's command counts around the load (the report's per-node
	// calls); unreadable ones only leave that part out.
	var problems []string
	callsBefore, cerr := redisnodes.CommandCalls(ctx, rdb)
	// CPU is counted from the rush's start (the warm-up's reads are not
	// purchases) until the queue is drained.
	cpuStart := make(chan proccpu.Sample, 1)
	if o.cpu != nil {
		go func() {
			time.Sleep(time.Until(tl.RushStart))
			cpuStart <- proccpu.Take(o.cpu)
		}()
	}
	prog := newProgress(stderr, o.quiet, rec, tl)
	prog.start(ctx)
	err = runner.Run(ctx, tl)
	prog.stop()
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	var redisCalls []report.NodeCalls
	if cerr == nil {
		var callsAfter map[string]redisnodes.Calls
		if callsAfter, cerr = redisnodes.CommandCalls(ctx, rdb); cerr == nil {
			redisCalls = report.RedisCallsOver(callsBefore, callsAfter)
		}
	}
	if cerr != nil {
		problems = append(problems, "redis calls per node: "+cerr.Error())
	}
	if o.beforeDrain != "" {
		if err := runHook(ctx, o.beforeDrain, stderr, hookBound); err != nil {
			return err
		}
	}
	snap := rec.Snapshot()
	drainer := &verify.Drainer{DB: db, Redis: rdb, Prefix: cfg.Redis.KeyPrefix, AMQPURL: cfg.RabbitMQ.AMQPURL(),
		Queue: topo.Queue, Partitions: topo.OrderQueues()[1:], DeadQueue: topo.DeadQueue, Rabbitmqctl: o.rabbitmqctl, Accepted: acceptedIDs(snap.Accepted)}
	dprog := newProgress(stderr, o.quiet, nil, tl)
	// CPU is counted until the drain was first seen complete (the start of
	// the empty observations that end the wait), as the drain time is: the
	// rabbitmqctl rounds that confirm it are the bench's own work.
	var cpuEnd proccpu.Sample
	empty := false
	dres, err := drainer.Wait(ctx, b.ActivityID, b.DrainTimeout.Duration, func(st verify.DrainStatus, elapsed time.Duration) {
		dprog.drainTick(st, elapsed)
		if o.cpu != nil && st.Empty() && !empty {
			cpuEnd = proccpu.Take(o.cpu)
		}
		empty = st.Empty()
	})
	dprog.done()
	if err != nil {
		return err
	}
	if o.cpu != nil && !dres.Drained {
		cpuEnd = proccpu.Take(o.cpu)
	}
	if dres.Problem != "" {
		problems = append(problems, "drain: "+dres.Problem)
	}

	// The order waits end as their orders settle (by now all have, or the
	// drain reported why not); a short bound for the last long-polls.
	wctx, cancelWaits := context.WithTimeout(ctx, b.OrderWait.Duration+b.RequestTimeout.Duration)
	runner.WaitReads(wctx)
	cancelWaits()
	reads := runner.Reads()

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
		SourceIPs: b.SourceIPs, HotShare: b.HotShare, UnkeyedShare: b.UnkeyedShare, ReplayShare: b.ReplayShare, ForwardedFor: b.ForwardedFor, Retries: b.Retries,
		Redis: string(cfg.Redis.Target().Kind)}
	if model == "closed" {
		rr.Connections = b.Connections
	}
	rep := report.Build(rr, snap, tl, dres, api, v)
	rep.Problems = problems
	rep.RedisCalls = redisCalls
	if o.cpu != nil {
		rep.CPU = report.NewCPU(o.cpu, <-cpuStart, cpuEnd, rep.Summary.Accepted, rep.Summary.Purchases)
	}
	if o.ceilings != nil {
		rep.Compare(o.ceilings)
	}
	rep.Reads = &reads
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

func openStores(ctx context.Context, cfg conf.Config) (*sql.DB, redis.UniversalClient, error) {
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
	rc := cfg.Redis
	rc.PoolSize = 4
	rdb := rc.NewClient()
	if err := rdb.Ping(cctx).Err(); err != nil {
		_ = db.Close()
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("redis %s: %w", rc.Target(), err)
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

// hookBound bounds the -before-drain command: it resumes or starts the
// workers, a matter of seconds; the bench's own context has no deadline.
const hookBound = time.Minute

// runHook runs the -before-drain shell command, killed after bound.
// WaitDelay: a process the command left running with its output (a worker
// started with &) cannot hold the bench past the command's own end.
func runHook(ctx context.Context, hook string, out io.Writer, bound time.Duration) error {
	hctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	cmd := exec.CommandContext(hctx, "sh", "-c", hook)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		if hctx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("-before-drain %q: not done within %v: %w", hook, bound, err)
		}
		return fmt.Errorf("-before-drain %q: %w", hook, err)
	}
	return nil
}
