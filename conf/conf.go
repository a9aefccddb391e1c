// Package conf holds the configuration of every seckill binary: the TOML schema,
// its defaults, the SECKILL_* environment overrides and validation.
package conf

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// DefaultPath is where the binaries look for their configuration file.
const DefaultPath = "conf/seckill.toml"

// Config is the whole file. Every binary loads all of it, so one file can drive a
// whole stack, and uses the sections it needs.
type Config struct {
	Log      Log      `toml:"log"`
	Redis    Redis    `toml:"redis"`
	MySQL    MySQL    `toml:"mysql"`
	RabbitMQ RabbitMQ `toml:"rabbitmq"`
	Proxy    Proxy    `toml:"proxy"`
	Backend  Backend  `toml:"backend"`
	Worker   Worker   `toml:"worker"`
	Bench    Bench    `toml:"bench"`
}

// Default returns the configuration used for every key the file leaves out.
func Default() Config {
	return Config{
		Log:      defaultLog(),
		Redis:    defaultRedis(),
		MySQL:    defaultMySQL(),
		RabbitMQ: defaultRabbitMQ(),
		Proxy:    defaultProxy(),
		Backend:  defaultBackend(),
		Worker:   defaultWorker(),
		Bench:    defaultBench(),
	}
}

// Error lists every problem found in a configuration, each naming its key.
type Error struct {
	Problems []string
}

func (e *Error) Error() string {
	if len(e.Problems) == 1 {
		return "config: " + e.Problems[0]
	}
	return fmt.Sprintf("config: %d problems:\n  %s", len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// problems collects validation failures so that all of them are reported at once.
type problems []string

func (p *problems) add(key, format string, args ...any) {
	*p = append(*p, key+": "+fmt.Sprintf(format, args...))
}

// Load reads the file at path (a missing file is an error), applies the
// environment overrides of env (usually os.Getenv) and validates the result.
func Load(path string, env func(string) string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return Parse(string(data), env)
}

// LoadDefault behaves as Load with os.Getenv.
func LoadDefault(path string) (Config, error) { return Load(path, os.Getenv) }

// Parse decodes a TOML document over the defaults, applies env overrides and
// validates. env may be nil.
func Parse(doc string, env func(string) string) (Config, error) {
	cfg := Default()
	// Rules are a list: a file that names any replaces the default set whole.
	md, err := toml.Decode(doc, &cfg)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return Config{}, fmt.Errorf("config: %s", perr.Error())
		}
		return Config{}, fmt.Errorf("config: %w", err)
	}
	var p problems
	if md.IsDefined("rabbitmq", "url") && md.IsDefined("rabbitmq", "urls") {
		p.add("rabbitmq.urls", "is the same setting as rabbitmq.url (a list); set one")
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, 0, len(und))
		for _, k := range und {
			keys = append(keys, k.String())
		}
		sort.Strings(keys)
		for _, k := range keys {
			p.add(k, "unknown key")
		}
	}
	if env != nil {
		cfg.applyEnv(env, &p)
	}
	cfg.validate(&p)
	if len(p) > 0 {
		return Config{}, &Error{Problems: p}
	}
	return cfg, nil
}

// Validate checks a configuration built in code (tests, tools).
func (c *Config) Validate() error {
	var p problems
	c.validate(&p)
	if len(p) > 0 {
		return &Error{Problems: p}
	}
	return nil
}

func (c *Config) validate(p *problems) {
	c.Log.validate(p)
	c.Redis.validate(p)
	c.MySQL.validate(p)
	c.RabbitMQ.validate(p)
	c.Proxy.validate(p)
	c.Backend.validate(p)
	c.Worker.validate(p)
	seen := map[int]bool{}
	for i, n := range c.Worker.Partitions {
		key := fmt.Sprintf("worker.partitions[%d]", i)
		switch {
		case n < 0 || n >= c.RabbitMQ.Partitions:
			p.add(key, "partition %d does not exist: rabbitmq.partitions = %d (0-%d)", n, c.RabbitMQ.Partitions, c.RabbitMQ.Partitions-1)
		case seen[n]:
			p.add(key, "partition %d listed twice", n)
		}
		seen[n] = true
	}
	c.Bench.validate(p)
}

// Environment variables that override the file (docs/configuration.md).
const (
	EnvRedisURL         = "SECKILL_REDIS_URL"
	EnvMySQLDSN         = "SECKILL_MYSQL_DSN"
	EnvAMQPURL          = "SECKILL_AMQP_URL"
	EnvAdminToken       = "SECKILL_ADMIN_TOKEN"
	EnvAdminTokenFile   = "SECKILL_ADMIN_TOKEN_FILE"
	EnvProxyListen      = "SECKILL_PROXY_LISTEN"
	EnvProxyAdminListen = "SECKILL_PROXY_ADMIN_LISTEN"
	EnvProxyUpstreams   = "SECKILL_PROXY_UPSTREAMS"
	EnvBackendListen    = "SECKILL_BACKEND_LISTEN"
	EnvWorkerListen     = "SECKILL_WORKER_LISTEN"
	EnvRedisKeyPrefix   = "SECKILL_REDIS_PREFIX"
	EnvAMQPQueuePrefix  = "SECKILL_AMQP_PREFIX"
	EnvWorkerPartitions = "SECKILL_WORKER_PARTITIONS" // "0,2"
	EnvAMQPPartitions   = "SECKILL_AMQP_PARTITIONS"
	EnvStockShards      = "SECKILL_STOCK_SHARDS"
)

func (c *Config) applyEnv(env func(string) string, p *problems) {
	set := func(name string, dst *string) {
		if v := env(name); v != "" {
			*dst = v
		}
	}
	set(EnvLogLevel, &c.Log.Level)
	set(EnvRedisURL, &c.Redis.URL)
	set(EnvRedisKeyPrefix, &c.Redis.KeyPrefix)
	set(EnvMySQLDSN, &c.MySQL.DSN)
	if v := env(EnvAMQPURL); v != "" {
		// The variable replaces the file's address list as a whole.
		c.RabbitMQ.URL, c.RabbitMQ.URLs = v, nil
	}
	set(EnvAMQPQueuePrefix, &c.RabbitMQ.Prefix)
	// Either variable replaces the file's token source as a whole.
	switch tok, file := env(EnvAdminToken), env(EnvAdminTokenFile); {
	case tok != "" && file != "":
		p.add(EnvAdminTokenFile, "is mutually exclusive with %s; set one", EnvAdminToken)
	case tok != "":
		c.Backend.AdminToken, c.Backend.AdminTokenFile = tok, ""
	case file != "":
		c.Backend.AdminToken, c.Backend.AdminTokenFile = "", file
	}
	set(EnvProxyListen, &c.Proxy.Listen)
	set(EnvProxyAdminListen, &c.Proxy.AdminListen)
	set(EnvBackendListen, &c.Backend.Listen)
	set(EnvWorkerListen, &c.Worker.Listen)
	if v := env(EnvAMQPPartitions); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			p.add(EnvAMQPPartitions, "want a number, got %q", v)
		}
		c.RabbitMQ.Partitions = n
	}
	if v := env(EnvStockShards); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			p.add(EnvStockShards, "want a number, got %q", v)
		}
		c.Backend.StockShards = n
	}
	if v := env(EnvWorkerPartitions); v != "" {
		c.Worker.Partitions = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				p.add(EnvWorkerPartitions, "want comma-separated partition numbers, got %q", v)
				break
			}
			c.Worker.Partitions = append(c.Worker.Partitions, n)
		}
	}
	if v := env(EnvProxyUpstreams); v != "" {
		var ups []string
		for _, u := range strings.Split(v, ",") {
			if u = strings.TrimSpace(u); u != "" {
				ups = append(ups, u)
			}
		}
		if len(ups) == 0 {
			p.add(EnvProxyUpstreams, "no upstream URL in %q", v)
		}
		c.Proxy.Upstreams = ups
	}
}
