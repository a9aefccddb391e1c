package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/seckill/seckill/bench/internal/ceiling"
	"github.com/seckill/seckill/bench/internal/report"
	"github.com/seckill/seckill/conf"
)

// runCeilings is `bench ceilings`: the raw ceilings on the services of the
// configuration (its Redis, MySQL server and RabbitMQ), one after the other,
// each in names of its own (key prefix + "ceiling:", queue prefix +
// ".ceiling", database + "_ceiling"), removed afterwards.
func runCeilings(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench ceilings", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", conf.DefaultPath, "configuration file (services and name prefixes; $SECKILL_* override it)")
	each := fs.Duration("duration", 3*time.Second, "how long each ceiling runs")
	window := fs.Int("publish-window", 256, "publish: messages awaiting their confirm at most")
	txConns := fs.Int("tx-connections", 2, "transaction: concurrent connections (the default is the demo's 2 workers)")
	scriptConns := fs.Int("reserve-connections", 64, "reserve: concurrent callers")
	jsonPath := fs.String("json", "", "write the results as JSON to this file (for bench -ceilings)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("ceilings: unexpected arguments: %v", fs.Args())
	}
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "config" })
	cfg, err := loadConfig(*path, set)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *each <= 0 || *window <= 0 || *txConns <= 0 || *scriptConns <= 0 {
		return errors.New("ceilings: -duration, -publish-window, -tx-connections and -reserve-connections must be positive")
	}
	dc, err := cfg.MySQL.Driver()
	if err != nil {
		return fmt.Errorf("ceilings: mysql dsn: %w", err)
	}
	db := dc.DBName
	if db == "" {
		db = "seckill"
	}
	rc := cfg.Redis
	rc.PoolSize = *scriptConns
	rdb := rc.NewClient()
	defer rdb.Close()

	var out ceiling.Results
	for _, c := range []func() (ceiling.Result, error){
		func() (ceiling.Result, error) {
			return ceiling.PublishConfirm(ctx, cfg.RabbitMQ.AMQPURLs()[0], // the first node: a ceiling of one node
				cfg.RabbitMQ.Prefix+".ceiling", *each, *window)
		},
		func() (ceiling.Result, error) {
			return ceiling.Transactions(ctx, cfg.MySQL, db+"_ceiling", *each, *txConns)
		},
		func() (ceiling.Result, error) {
			return ceiling.Scripts(ctx, rdb, cfg.Redis.KeyPrefix+"ceiling:", time.Now().UnixMilli(), *each, *scriptConns)
		},
	} {
		r, err := c()
		if err != nil {
			return err
		}
		out = append(out, r)
		fmt.Fprintf(stdout, "%-12s %10.0f %-9s %s\n", r.Name, r.PerSecond, r.Unit, r.Detail)
	}
	if *jsonPath != "" {
		return report.WriteFile(*jsonPath, func(w io.Writer) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		})
	}
	return nil
}

// readCeilings reads the file `bench ceilings -json` wrote.
func readCeilings(path string) (ceiling.Results, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cs ceiling.Results
	if err := json.Unmarshal(raw, &cs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(cs) == 0 {
		return nil, fmt.Errorf("%s: no ceilings", path)
	}
	for _, c := range cs {
		if c.Name == "" || c.PerSecond <= 0 {
			return nil, fmt.Errorf("%s: ceiling %q has no rate", path, c.Name)
		}
	}
	return cs, nil
}
