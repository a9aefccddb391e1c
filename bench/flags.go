package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/seckill/seckill/bench/internal/ceiling"
	"github.com/seckill/seckill/bench/internal/proccpu"
	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/cli"
)

// options are the flags beyond the configuration file.
type options struct {
	adminToken  string
	jsonPath    string
	htmlPath    string
	quiet       bool
	beforeDrain string
	rabbitmqctl string
	// cpu names the processes whose CPU is accounted over the scenario.
	cpu []proccpu.Group
	// ceilings is a file written by `bench ceilings` in the same run.
	ceilings ceiling.Results
}

// configFlag is a flag that overrides one key of the configuration file: it
// is declared once, here, with the key it sets.
type configFlag struct {
	name, key, usage string
	field            func(*conf.Config) any // pointer to the field it sets
}

var configFlags = []configFlag{
	{"targets", "[bench] targets", "comma-separated target URLs (the proxies)", func(c *conf.Config) any { return &c.Bench.Targets }},
	{"admin-url", "[bench] admin_url", "backend URL the sale is created through", func(c *conf.Config) any { return &c.Bench.AdminURL }},
	{"activity", "[bench] activity_id", "activity id; 0 picks a fresh one", func(c *conf.Config) any { return &c.Bench.ActivityID }},
	{"stock", "[bench] stock", "units of the sale", func(c *conf.Config) any { return &c.Bench.Stock }},
	{"limit", "[bench] per_user_limit", "per-user limit", func(c *conf.Config) any { return &c.Bench.PerUserLimit }},
	{"users", "[bench] users", "distinct users", func(c *conf.Config) any { return &c.Bench.Users }},
	{"duration", "[bench] duration", "length of the rush", func(c *conf.Config) any { return &c.Bench.Duration }},
	{"warmup", "[bench] warmup", "warm-up before the rush", func(c *conf.Config) any { return &c.Bench.Warmup }},
	{"tail", "[bench] tail", "sold-out tail after the rush", func(c *conf.Config) any { return &c.Bench.Tail }},
	{"rate", "[bench] rate", "open loop: requests/s (0: closed loop)", func(c *conf.Config) any { return &c.Bench.Rate }},
	{"connections", "[bench] connections", "closed loop: concurrent clients", func(c *conf.Config) any { return &c.Bench.Connections }},
	{"max-in-flight", "[bench] max_in_flight", "open loop: bound of outstanding requests", func(c *conf.Config) any { return &c.Bench.MaxInFlight }},
	{"source-ips", "[bench] source_ips", "distinct client source addresses (0: default address)", func(c *conf.Config) any { return &c.Bench.SourceIPs }},
	{"source-net", "[bench] source_net", "loopback CIDR the source addresses come from", func(c *conf.Config) any { return &c.Bench.SourceNet }},
	{"hot-share", "[bench] hot_share", "fraction of users behind a few shared addresses", func(c *conf.Config) any { return &c.Bench.HotShare }},
	{"replay-share", "[bench] replay_share", "fraction of the tail's keyed purchases that replay a key answered 202 earlier in the run", func(c *conf.Config) any { return &c.Bench.ReplayShare }},
	{"unkeyed-share", "[bench] unkeyed_share", "fraction of purchases sent without an Idempotency-Key (never retried)", func(c *conf.Config) any { return &c.Bench.UnkeyedShare }},
	{"forwarded-for", "[bench] forwarded_for", "send client addresses in X-Forwarded-For instead of binding them", func(c *conf.Config) any { return &c.Bench.ForwardedFor }},
	{"retries", "[bench] retries", "retries with the same Idempotency-Key", func(c *conf.Config) any { return &c.Bench.Retries }},
	{"request-timeout", "[bench] request_timeout", "bound of one attempt", func(c *conf.Config) any { return &c.Bench.RequestTimeout }},
	{"drain-timeout", "[bench] drain_timeout", "bound of the drain wait", func(c *conf.Config) any { return &c.Bench.DrainTimeout }},
	{"state-poll-rate", "[bench] state_poll_rate", "read mix: sale-state GETs/s through the warm-up", func(c *conf.Config) any { return &c.Bench.StatePollRate }},
	{"order-wait", "[bench] order_wait", "read mix: long-poll of each accepted order, per request (0: none)", func(c *conf.Config) any { return &c.Bench.OrderWait }},
	{"mysql-dsn", "[mysql] dsn, $SECKILL_MYSQL_DSN", "verifier: MySQL DSN", func(c *conf.Config) any { return &c.MySQL.DSN }},
	{"redis-url", "[redis] url, $SECKILL_REDIS_URL", "verifier: Redis URL", func(c *conf.Config) any { return &c.Redis.URL }},
	{"redis-prefix", "[redis] key_prefix, $SECKILL_REDIS_PREFIX", "verifier: Redis key prefix", func(c *conf.Config) any { return &c.Redis.KeyPrefix }},
	{"amqp-url", "[rabbitmq] url, $SECKILL_AMQP_URL", "drain: RabbitMQ URL(s), several comma-separated", func(c *conf.Config) any { return &c.RabbitMQ.URL }},
	{"amqp-prefix", "[rabbitmq] prefix, $SECKILL_AMQP_PREFIX", "drain: RabbitMQ name prefix", func(c *conf.Config) any { return &c.RabbitMQ.Prefix }},
}

// raw holds a flag's text until the file is loaded; the flags win over it.
type raw struct {
	value  string
	isBool bool
}

func (r *raw) String() string { return r.value }

func (r *raw) Set(s string) error { r.value = s; return nil }

// IsBoolFlag lets -forwarded-for stand alone.
func (r *raw) IsBoolFlag() bool { return r.isBool }

// parseFlags reads the command line, loads the file (or, when the default
// file is absent, the defaults and the environment), applies the flags over
// it, validates, and resolves the admin token and rabbitmqctl.
func parseFlags(args []string, stdout, stderr io.Writer) (conf.Config, options, error) {
	fs, common, op, raws := newFlagSet(stderr)
	err := fs.Parse(args)
	o := *op // after Parse: the flags write through op
	if err != nil {
		return conf.Config{}, o, err
	}
	if fs.NArg() > 0 {
		return conf.Config{}, o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if done, err := common.Early(stdout, os.Getenv, nil); done {
		if err == nil {
			err = errDone
		}
		return conf.Config{}, o, err
	}
	cfg, err := loadConfig(common.Config, set["config"])
	if err != nil {
		return cfg, o, err
	}
	if err := applyFlags(&cfg, raws, set); err != nil {
		return cfg, o, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, o, err
	}
	if err := resolveOptions(&o, cfg, set["admin-token"]); err != nil {
		return cfg, o, err
	}
	return cfg, o, nil
}

// errDone marks a command line that was fully handled (-version, a valid -check).
var errDone = errors.New("done")

func newFlagSet(stderr io.Writer) (*flag.FlagSet, *cli.Flags, *options, map[string]*raw) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	common := cli.AddFlags(fs, "bench", false)
	o := new(options)
	fs.StringVar(&o.adminToken, "admin-token", "", "bearer token of the admin API (default $SECKILL_ADMIN_TOKEN, else [backend] admin_token or admin_token_file)")
	fs.StringVar(&o.jsonPath, "json", "", "write the report as JSON to this file")
	fs.StringVar(&o.htmlPath, "html", "", "write the report as a self-contained HTML page to this file")
	fs.StringVar(&o.beforeDrain, "before-drain", "", "shell command run after the load and before the drain wait (e.g. start or resume workers); killed after 1m")
	fs.StringVar(&o.rabbitmqctl, "rabbitmqctl", "auto", "rabbitmqctl used to read unacknowledged messages; \"\" to skip, auto: from PATH (skipped when [rabbitmq] url names several nodes)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress output")
	fs.Func("cpu", "account CPU per process over the scenario: name=pid[+pid...],... (e.g. proxy=12,worker=14+15)", func(s string) error {
		g, err := proccpu.ParseGroups(s)
		o.cpu = g
		return err
	})
	fs.Func("ceilings", "JSON file of `bench ceilings` (same run): figures beside the raw ceilings", func(path string) error {
		cs, err := readCeilings(path)
		o.ceilings = cs
		return err
	})
	raws := map[string]*raw{}
	var probe conf.Config
	for _, f := range configFlags {
		_, isBool := f.field(&probe).(*bool)
		r := &raw{isBool: isBool}
		raws[f.name] = r
		fs.Var(r, f.name, f.usage+" (default "+f.key+")")
	}
	return fs, common, o, raws
}

// loadConfig reads the file; without one at the default path (and no
// -config) it takes the defaults and the environment.
func loadConfig(path string, explicit bool) (conf.Config, error) {
	if _, err := os.Stat(path); err != nil && !explicit && errors.Is(err, os.ErrNotExist) {
		return conf.Parse("", os.Getenv)
	}
	return conf.LoadDefault(path)
}

// applyFlags writes every flag given onto its key.
func applyFlags(cfg *conf.Config, raws map[string]*raw, set map[string]bool) error {
	for _, f := range configFlags {
		if !set[f.name] {
			continue
		}
		s := raws[f.name].value
		var err error
		switch dst := f.field(cfg).(type) {
		case *string:
			*dst = s
		case *[]string:
			*dst = nil
			for _, t := range strings.Split(s, ",") {
				if t = strings.TrimSpace(t); t != "" {
					*dst = append(*dst, t)
				}
			}
		case *int:
			*dst, err = strconv.Atoi(s)
		case *int64:
			*dst, err = strconv.ParseInt(s, 10, 64)
		case *float64:
			*dst, err = strconv.ParseFloat(s, 64)
		case *bool:
			*dst, err = strconv.ParseBool(s)
		case *conf.Duration:
			dst.Duration, err = time.ParseDuration(s)
		default:
			return fmt.Errorf("-%s: unsupported field type %T", f.name, dst)
		}
		if err != nil {
			return fmt.Errorf("-%s: invalid value %q: %w", f.name, s, err)
		}
	}
	return nil
}

// resolveOptions fills the admin token (flag, else $SECKILL_ADMIN_TOKEN, else
// the file) and finds rabbitmqctl.
func resolveOptions(o *options, cfg conf.Config, tokenSet bool) error {
	if !tokenSet {
		o.adminToken = os.Getenv(conf.EnvAdminToken)
		if o.adminToken == "" {
			// admin_token or admin_token_file, as the backend reads them.
			tok, err := cfg.Backend.ReadAdminToken()
			if err != nil {
				return err
			}
			o.adminToken = tok
		}
	}
	if o.adminToken == "" {
		return errors.New("no admin token: set -admin-token or SECKILL_ADMIN_TOKEN")
	}
	if o.rabbitmqctl == "auto" {
		o.rabbitmqctl = ""
		// rabbitmqctl asks the local default node: the broker of a
		// one-address [rabbitmq] url at most. Several addresses are a
		// cluster of other nodes (their names and cookie unknown here):
		// the drain then relies on the queue depth and MySQL alone.
		if len(cfg.RabbitMQ.AMQPURLs()) > 1 {
			return nil
		}
		if p, err := exec.LookPath("rabbitmqctl"); err == nil {
			o.rabbitmqctl = p
		}
	}
	return nil
}
