package conf

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestParseRedisURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want RedisTarget
	}{
		{"redis://127.0.0.1:6390/3", RedisTarget{Kind: RedisNode, Addrs: []string{"127.0.0.1:6390"}, DB: 3}},
		{"rediss://u:p@h:6380/0", RedisTarget{Kind: RedisNode, Addrs: []string{"h:6380"}, Username: "u", Password: "p", TLS: true}},
		{"redis-cluster://127.0.0.1:7000,127.0.0.1:7001", RedisTarget{Kind: RedisCluster, Addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001"}}},
		{"redis-cluster://127.0.0.1:7000/0", RedisTarget{Kind: RedisCluster, Addrs: []string{"127.0.0.1:7000"}}},
		{"rediss-cluster://:secret@n1:7000,[::1]:7001", RedisTarget{Kind: RedisCluster, Addrs: []string{"n1:7000", "[::1]:7001"}, Password: "secret", TLS: true}},
		{"redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/2", RedisTarget{Kind: RedisSentinel, Addrs: []string{"127.0.0.1:26379", "127.0.0.1:26380"}, MasterName: "mymaster", DB: 2}},
		{"redis-sentinel://s1:26379/m", RedisTarget{Kind: RedisSentinel, Addrs: []string{"s1:26379"}, MasterName: "m"}},
		{"rediss-sentinel://a%40b:pw@s1:26379/m/1", RedisTarget{Kind: RedisSentinel, Addrs: []string{"s1:26379"}, MasterName: "m", DB: 1, Username: "a@b", Password: "pw", TLS: true}},
	} {
		got, err := ParseRedisURL(tc.url)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		got.node = nil
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.url, got, tc.want)
		}
	}
}

func TestParseRedisURLErrors(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"127.0.0.1:6379", "is not a URL"},
		{"http://x", "unknown scheme \"http\""},
		{"redis-cluster://127.0.0.1:7000/3", "a cluster has only database 0"},
		{"redis-cluster://127.0.0.1:7000/0/1", "a cluster has only database 0"},
		{"redis-cluster://127.0.0.1:70000", "port must be 1-65535"},
		{"redis-cluster://127.0.0.1:x", "port must be 1-65535"},
		{"redis-cluster://127.0.0.1", "want host:port"},
		{"redis-cluster://127.0.0.1:7000,,127.0.0.1:7001", "empty address"},
		{"redis-cluster://:7000", "no host"},
		{"redis-cluster://h:7000?pool_size=3", "takes no query"},
		{"redis-sentinel://h:26379", "no master name"},
		{"redis-sentinel://h:26379/", "no master name"},
		{"redis-sentinel://h:26379/m/16", "want a number 0-15"},
		{"redis-sentinel://h:26379/m/x", "want a number 0-15"},
		{"redis-sentinel://h:26379/m/1/2", "want /<master-name>/<db>"},
	} {
		_, err := ParseRedisURL(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to say %q", tc.url, err, tc.want)
		}
	}
	// Through the file: the key is named, nothing else changes.
	_, err := Parse("[redis]\nurl = \"redis-cluster://127.0.0.1:7000/2\"", func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "redis.url: a cluster has only database 0") {
		t.Errorf("file with a cluster db 2: %v", err)
	}
	_, err = Parse("", func(k string) string {
		if k == EnvRedisURL {
			return "redis-sentinel://127.0.0.1:26379"
		}
		return ""
	})
	if err == nil || !strings.Contains(err.Error(), "redis.url: no master name") {
		t.Errorf("env sentinel URL without master: %v", err)
	}
}

// Every kind of client keeps go-redis's retries off and takes the section's
// pool and timeouts. A client reports its options after go-redis normalised
// them: MaxRetries -1 (none) reads back as 0; an unset 0 would read back 3.
func TestRedisNewClient(t *testing.T) {
	r := Default().Redis
	r.PoolSize = 7
	r.URL = "redis://127.0.0.1:6390/3"
	node := r.NewClient().(*redis.Client)
	defer node.Close()
	if o := node.Options(); o.Addr != "127.0.0.1:6390" || o.DB != 3 || o.PoolSize != 7 || o.MaxRetries != 0 || !o.ContextTimeoutEnabled {
		t.Errorf("node options = %+v", o)
	}

	r.URL = "rediss-cluster://:pw@n1:7000,n2:7001"
	cl := r.NewClient().(*redis.ClusterClient)
	defer cl.Close()
	co := cl.Options()
	if !reflect.DeepEqual(co.Addrs, []string{"n1:7000", "n2:7001"}) || co.Password != "pw" || co.PoolSize != 7 ||
		co.MaxRetries != -1 || co.MaxRedirects != 3 || co.ReadOnly || co.RouteByLatency || co.RouteRandomly ||
		!co.ContextTimeoutEnabled || co.TLSConfig == nil || co.TLSConfig.ServerName != "" {
		t.Errorf("cluster options = %+v", co)
	}

	// A failover client answers to *redis.Client; its options name the
	// master by the Sentinels' "FailoverClient" address.
	r.URL = "redis-sentinel://127.0.0.1:26379/mymaster/2"
	fo := r.NewClient().(*redis.Client)
	defer fo.Close()
	if o := fo.Options(); o.DB != 2 || o.PoolSize != 7 || o.MaxRetries != 0 || !o.ContextTimeoutEnabled || o.Addr != "FailoverClient" {
		t.Errorf("sentinel options = %+v", o)
	}
}

// The tls_* keys: refused on a plain URL, their files read and checked at
// start, the error naming the key; nothing else is reported.
func TestRedisTLSKeys(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct{ keys, want string }{
		{`url = "redis://127.0.0.1:6379/0"` + "\ntls_ca_file = \"" + notPEM + `"`, "redis.tls_ca_file: is set, but redis.url does not use TLS"},
		{`url = "redis-cluster://127.0.0.1:7000"` + "\ntls_server_name = \"r\"", "redis.tls_server_name: is set, but redis.url does not use TLS"},
		{`url = "rediss://127.0.0.1:6379/0"` + "\ntls_ca_file = \"" + missing + `"`, "redis.tls_ca_file: open " + missing + ": no such file"},
		{`url = "rediss-cluster://127.0.0.1:7000"` + "\ntls_ca_file = \"" + notPEM + `"`, "redis.tls_ca_file: " + notPEM + " holds no PEM certificate"},
		{`url = "rediss-sentinel://127.0.0.1:26379/m/0"` + "\ntls_cert_file = \"" + notPEM + `"`, "redis.tls_key_file: is required with redis.tls_cert_file"},
		{`url = "rediss://127.0.0.1:6379/0"` + "\ntls_key_file = \"" + notPEM + `"`, "redis.tls_cert_file: is required with redis.tls_key_file"},
		{`url = "rediss://127.0.0.1:6379/0"` + "\ntls_cert_file = \"" + notPEM + "\"\ntls_key_file = \"" + notPEM + `"`, "redis.tls_cert_file: tls: failed to find any PEM data"},
	} {
		_, err := Parse("[redis]\n"+tc.keys, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Count(err.Error(), "redis.") != strings.Count(tc.want, "redis.") {
			t.Errorf("%s:\n error %v\n want %q alone", tc.keys, err, tc.want)
		}
	}
	// A server name and no files on a TLS URL of each kind is fine.
	for _, u := range []string{"rediss://127.0.0.1:6379/0", "rediss-cluster://127.0.0.1:7000", "rediss-sentinel://127.0.0.1:26379/m/0"} {
		c, err := Parse("[redis]\nurl = \""+u+"\"\ntls_server_name = \"redis.internal\"", nil)
		if err != nil {
			t.Errorf("%s: %v", u, err)
			continue
		}
		tc, err := c.Redis.tlsConfig(c.Redis.Target())
		if err != nil || tc == nil || tc.ServerName != "redis.internal" || tc.RootCAs != nil {
			t.Errorf("%s: tls config %+v, %v", u, tc, err)
		}
	}
}

func FuzzParseRedisURL(f *testing.F) {
	for _, s := range []string{"redis://h:1/0", "redis-cluster://a:1,b:2", "redis-sentinel://a:1/m/0", "rediss-cluster://u:p@[::1]:7/0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseRedisURL(s)
		if err != nil {
			return
		}
		if len(tg.Addrs) == 0 || (tg.Kind == RedisSentinel && tg.MasterName == "") || (tg.Kind == RedisCluster && tg.DB != 0) {
			t.Fatalf("%q accepted as %+v", s, tg)
		}
	})
}
