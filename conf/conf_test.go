package conf

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func noEnv(string) string { return "" }

func TestShippedFileLoadsAndMatchesDefaults(t *testing.T) {
	cfg, err := Load("seckill.toml", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	def := Default()
	// worker.partitions: the file's [] is the default's nil (all).
	if len(cfg.Worker.Partitions) != 0 || len(def.Worker.Partitions) != 0 {
		t.Errorf("worker.partitions: file %v, default %v; want all (empty)", cfg.Worker.Partitions, def.Worker.Partitions)
	}
	cfg.Worker.Partitions, def.Worker.Partitions = nil, nil
	// The file documents the defaults: every scalar it sets equals them.
	if cfg.Redis != def.Redis || cfg.MySQL != def.MySQL || !reflect.DeepEqual(cfg.RabbitMQ, def.RabbitMQ) || !reflect.DeepEqual(cfg.Worker, def.Worker) {
		t.Errorf("shipped file and defaults disagree:\nfile %+v %+v %+v %+v\ndefault %+v %+v %+v %+v",
			cfg.Redis, cfg.MySQL, cfg.RabbitMQ, cfg.Worker, def.Redis, def.MySQL, def.RabbitMQ, def.Worker)
	}
	if len(cfg.Proxy.Rules) == 0 {
		t.Error("shipped file has no proxy rules")
	}
}

func TestEmptyFileGivesDefaults(t *testing.T) {
	cfg, err := Parse("", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.URL != "redis://127.0.0.1:6379/0" || cfg.MySQL.DSN != "root@tcp(127.0.0.1:3306)/seckill" ||
		cfg.RabbitMQ.URL != "amqp://guest:guest@127.0.0.1:5672/" {
		t.Errorf("defaults do not point at the local services: %+v %+v %+v", cfg.Redis, cfg.MySQL, cfg.RabbitMQ)
	}
	if cfg.Backend.ReservationTTL.Duration != 30*time.Second {
		t.Errorf("reservation_ttl default = %v", cfg.Backend.ReservationTTL)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.toml"), noEnv)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("want a not-exist error, got %v", err)
	}
}

func TestGoodFiles(t *testing.T) {
	cases := []struct {
		name, doc string
		check     func(t *testing.T, c Config)
	}{
		{"durations", `
[backend]
reservation_ttl = "1m30s"
publish_timeout = "250ms"`, func(t *testing.T, c Config) {
			if c.Backend.ReservationTTL.Duration != 90*time.Second || c.Backend.PublishTimeout.Duration != 250*time.Millisecond {
				t.Errorf("got %v %v", c.Backend.ReservationTTL, c.Backend.PublishTimeout)
			}
		}},
		{"rules replace defaults", `
[[proxy.rules]]
name = "only"
path_prefix = "/"
global = { limit = 7, window = "2s" }`, func(t *testing.T, c Config) {
			if len(c.Proxy.Rules) != 1 || c.Proxy.Rules[0].Global.Limit != 7 || c.Proxy.Rules[0].Global.Window.Duration != 2*time.Second {
				t.Errorf("rules = %+v", c.Proxy.Rules)
			}
			if c.Proxy.Rules[0].OnRedisError != "local" {
				t.Errorf("on_redis_error default = %q", c.Proxy.Rules[0].OnRedisError)
			}
		}},
		{"partial section keeps other defaults", `
[worker]
batch_size = 50`, func(t *testing.T, c Config) {
			if c.Worker.BatchSize != 50 || c.Worker.Prefetch != Default().Worker.Prefetch {
				t.Errorf("worker = %+v", c.Worker)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.doc, noEnv)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestBadFiles(t *testing.T) {
	cases := []struct {
		name, doc string
		want      []string // each must appear in the error
	}{
		{"syntax", `[redis`, []string{"config:"}},
		{"unknown key", "[redis]\nurll = \"x\"", []string{"redis.urll: unknown key"}},
		{"unknown section", "[nope]\na = 1", []string{"nope.a: unknown key"}},
		{"wrong type", "[worker]\nbatch_size = \"ten\"", []string{"batch_size"}},
		{"bad duration", "[backend]\nreservation_ttl = \"soon\"", []string{"reservation_ttl", "invalid duration"}},
		{"negative duration", "[backend]\nredis_timeout = \"-1s\"", []string{"backend.redis_timeout: must be a positive duration"}},
		{"unknown limiter", "[proxy]\nlimiter = \"memcached\"", []string{`proxy.limiter: must be "redis"`, `"memcached"`}},
		{"zero batch", "[worker]\nbatch_size = 0", []string{"worker.batch_size: must be between 1 and 5000, got 0"}},
		{"prefetch below batch", "[worker]\nprefetch = 10\nbatch_size = 20", []string{"worker.prefetch: must be at least worker.batch_size"}},
		{"zero archive grace", "[worker]\narchive_grace = \"0s\"", []string{"worker.archive_grace"}},
		{"bad listen", "[backend]\nlisten = \"8090\"", []string{"backend.listen: must be host:port"}},
		{"bad redis url", "[redis]\nurl = \"http://x\"", []string{"redis.url:"}},
		{"partitions", "[rabbitmq]\npartitions = 0", []string{"rabbitmq.partitions"}},
		{"stock shards 0", "[backend]\nstock_shards = 0", []string{"backend.stock_shards"}},
		{"stock shards 65", "[backend]\nstock_shards = 65", []string{"backend.stock_shards"}},
		{"worker partition out of range", "[rabbitmq]\npartitions = 3\n[worker]\npartitions = [0, 3]", []string{"worker.partitions[1]: partition 3 does not exist: rabbitmq.partitions = 3 (0-2)"}},
		{"worker partition twice", "[rabbitmq]\npartitions = 3\n[worker]\npartitions = [1, 1]", []string{"worker.partitions[1]: partition 1 listed twice"}},
		{"dsn without db", "[mysql]\ndsn = \"root@tcp(127.0.0.1:3306)/\"", []string{"mysql.dsn: must name a database"}},
		{"bad amqp scheme", "[rabbitmq]\nurl = \"http://x/\"", []string{"rabbitmq.url: scheme must be amqp"}},
		{"token and token file", "[backend]\nadmin_token = \"abc\"\nadmin_token_file = \"/x\"", []string{"backend.admin_token_file: is mutually exclusive with backend.admin_token"}},
		{"bad failure limit", "[backend]\nadmin_failure_limit = { limit = 0, window = \"1m\" }", []string{"backend.admin_failure_limit.limit"}},
		{"relative deny prefix", "[proxy]\ndeny_prefixes = [\"admin/\"]", []string{"proxy.deny_prefixes[0]: must start with /"}},
		{"bad allow_from", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/admin/\"\nallow_from = [\"10.0.0.1\"]\nper_ip = { limit = 1, window = \"1s\" }", []string{"proxy.rules[0].allow_from[0]: must be a CIDR"}},
		{"require_jwt without jwt", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nrequire_jwt = true\nper_ip = { limit = 1, window = \"1s\" }", []string{"proxy.rules[0].require_jwt: needs [proxy.identity] jwt"}},
		{"jwt alg none", "[proxy.identity]\njwt = { alg = \"none\", key_file = \"/k\" }", []string{"proxy.identity.jwt.alg: must be one of HS256, RS256, ES256"}},
		{"jwt without key", "[proxy.identity]\njwt = { alg = \"HS256\" }", []string{"proxy.identity.jwt.key_file: is required"}},
		{"jwt header and cookie", "[proxy.identity]\njwt = { alg = \"HS256\", key_file = \"/k\", header = \"A\", cookie = \"c\" }", []string{"proxy.identity.jwt: header and cookie are mutually exclusive"}},
		{"jwt bad header", "[proxy.identity]\njwt = { alg = \"HS256\", key_file = \"/k\", header = \"X Token\" }", []string{"proxy.identity.jwt.header: must be an HTTP header name"}},
		{"jwt unknown key", "[proxy.identity]\njwt = { alg = \"HS256\", key_file = \"/k\", algs = [] }", []string{"proxy.identity.jwt.algs: unknown key"}},
		{"publish not below ttl", "[backend]\npublish_timeout = \"40s\"", []string{"backend.publish_timeout: must be shorter"}},
		{"bad cidr", "[proxy]\ntrusted_proxies = [\"10.0.0.0/33\"]", []string{"proxy.trusted_proxies[0]: must be a CIDR"}},
		{"tiny client state bound", "[proxy]\nmax_client_states = 10", []string{"proxy.max_client_states: must be between 64 and 100000000, got 10"}},
		{"bad upstream", "[proxy]\nupstreams = [\"ftp://x\"]", []string{"proxy.upstreams[0]"}},
		{"rule without windows", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"", []string{"proxy.rules[0]: needs per_ip, global or both"}},
		{"rule bad mode", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nglobal = { limit = 1, window = \"1s\" }\non_redis_error = \"maybe\"", []string{"proxy.rules[0].on_redis_error"}},
		{"rule zero limit", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nper_ip = { limit = 0, window = \"1s\" }", []string{"proxy.rules[0].per_ip.limit"}},
		{"duplicate rule", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nper_ip = { limit = 1, window = \"1s\" }\n[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/a\"\nper_ip = { limit = 1, window = \"1s\" }", []string{"proxy.rules[1].name: duplicate rule name"}},
		{"bad window key source", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nper_ip = { limit = 1, window = \"1s\", key = \"query:u\" }", []string{"proxy.rules[0].per_ip.key: must be \"ip\""}},
		{"empty header name", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nper_ip = { limit = 1, window = \"1s\", key = \"header:\" }", []string{"proxy.rules[0].per_ip.key: header name must be 1 to 64"}},
		{"bad header name", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nper_ip = { limit = 1, window = \"1s\", key = \"header:X User\" }", []string{"proxy.rules[0].per_ip.key: header name \"X User\""}},
		{"header Cookie", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nper_ip = { limit = 1, window = \"1s\", key = \"header:cookie\" }", []string{"proxy.rules[0].per_ip.key: header:Cookie"}},
		{"global with key", "[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nglobal = { limit = 1, window = \"1s\", key = \"header:X-User-ID\" }", []string{"proxy.rules[0].global.key: a global window"}},
		{"several at once", "[worker]\nbatch_size = 0\n[backend]\nlisten = \"x\"", []string{"2 problems", "worker.batch_size", "backend.listen"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.doc, noEnv)
			if err == nil {
				t.Fatal("accepted a bad file")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestEnvOverrides(t *testing.T) {
	env := map[string]string{
		EnvRedisURL:         "redis://127.0.0.1:6380/2",
		EnvMySQLDSN:         "root@tcp(127.0.0.1:3307)/other",
		EnvAMQPURL:          "amqp://u:p@127.0.0.1:5673/vh",
		EnvAdminToken:       "a-long-enough-token",
		EnvProxyListen:      "127.0.0.1:9080",
		EnvProxyAdminListen: "127.0.0.1:9081",
		EnvProxyUpstreams:   "http://127.0.0.1:1, http://127.0.0.1:2",
		EnvBackendListen:    "127.0.0.1:9090",
		EnvWorkerListen:     "127.0.0.1:9091",
		EnvRedisKeyPrefix:   "iso:",
		EnvAMQPQueuePrefix:  "iso",
	}
	c, err := Parse("", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	got := []string{c.Redis.URL, c.MySQL.DSN, c.RabbitMQ.URL, c.Backend.AdminToken, c.Proxy.Listen,
		c.Proxy.AdminListen, strings.Join(c.Proxy.Upstreams, ","), c.Backend.Listen, c.Worker.Listen,
		c.Redis.KeyPrefix, c.RabbitMQ.Prefix}
	want := []string{env[EnvRedisURL], env[EnvMySQLDSN], env[EnvAMQPURL], env[EnvAdminToken], env[EnvProxyListen],
		env[EnvProxyAdminListen], "http://127.0.0.1:1,http://127.0.0.1:2", env[EnvBackendListen], env[EnvWorkerListen],
		"iso:", "iso"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("override %d: got %q want %q", i, got[i], want[i])
		}
	}
	// An override is validated like the file.
	_, err = Parse("", func(k string) string {
		if k == EnvBackendListen {
			return "nonsense"
		}
		return ""
	})
	if err == nil || !strings.Contains(err.Error(), "backend.listen") {
		t.Errorf("bad override accepted or not named: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	data, err := os.ReadFile("seckill.toml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(data))
	f.Add("[redis]\nurl = 1")
	f.Add("[[proxy.rules]]\nname=\"a\"\npath_prefix=\"/\"\nper_ip={limit=1,window=\"1s\"}")
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := Parse(doc, noEnv)
		if err != nil {
			return
		}
		// Whatever Parse accepts must pass validation again.
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config fails Validate: %v", err)
		}
	})
}

func TestParseKey(t *testing.T) {
	for _, tc := range []struct{ in, source, name string }{
		{"", KeyAddress, ""}, {"ip", KeyAddress, ""}, {"header:X-User-ID", KeyHeader, "X-User-ID"},
		{"header:Authorization", KeyHeader, "Authorization"}, {"cookie:session_id", KeyCookie, "session_id"},
	} {
		src, name, err := ParseKey(tc.in)
		if err != nil || src != tc.source || name != tc.name {
			t.Errorf("ParseKey(%q) = %q %q %v", tc.in, src, name, err)
		}
	}
}

// FuzzParseKey: an accepted key names a known source and a token name that
// survives a round trip; nothing panics.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"ip", "header:X-User-ID", "cookie:s", "header:", "x:y", "header:a:b", "cookie:\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		src, name, err := ParseKey(s)
		if err != nil {
			return
		}
		switch src {
		case KeyAddress:
			if name != "" {
				t.Fatalf("%q: address key with name %q", s, name)
			}
		case KeyHeader, KeyCookie:
			if s != src+":"+name || name == "" || len(name) > 64 {
				t.Fatalf("%q: parsed as %q %q", s, src, name)
			}
			for i := 0; i < len(name); i++ {
				if !tokenChar(name[i]) {
					t.Fatalf("%q: name byte %q", s, name[i])
				}
			}
		default:
			t.Fatalf("%q: source %q", s, src)
		}
	})
}

func TestStockShardsOverride(t *testing.T) {
	c, err := Parse("[backend]\nstock_shards = 2", func(k string) string { return map[string]string{EnvStockShards: "8"}[k] })
	if err != nil || c.Backend.StockShards != 8 {
		t.Errorf("stock_shards %d %v, want 8 from %s", c.Backend.StockShards, err, EnvStockShards)
	}
	if d, _ := Parse("", func(string) string { return "" }); d.Backend.StockShards != 1 {
		t.Errorf("default stock_shards %d, want 1", d.Backend.StockShards)
	}
	for _, v := range []string{"x", "0", "65"} {
		if _, err := Parse("", func(k string) string { return map[string]string{EnvStockShards: v}[k] }); err == nil {
			t.Errorf("%s=%s accepted", EnvStockShards, v)
		}
	}
}

func TestPartitionOverrides(t *testing.T) {
	env := map[string]string{EnvAMQPPartitions: "3", EnvWorkerPartitions: "2, 0"}
	c, err := Parse("", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.RabbitMQ.Partitions != 3 || !reflect.DeepEqual(c.Worker.Partitions, []int{2, 0}) {
		t.Errorf("partitions %d, worker %v", c.RabbitMQ.Partitions, c.Worker.Partitions)
	}
	for _, bad := range []map[string]string{
		{EnvWorkerPartitions: "0,x"},
		{EnvAMQPPartitions: "three"},
		{EnvAMQPPartitions: "2", EnvWorkerPartitions: "2"},
	} {
		if _, err := Parse("", func(k string) string { return bad[k] }); err == nil {
			t.Errorf("accepted %v", bad)
		}
	}
}
