package conf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisKind is the deployment a [redis] url names.
type RedisKind string

// The Redis deployments seckill runs on.
const (
	RedisNode     RedisKind = "node"     // redis://, rediss://, unix://
	RedisCluster  RedisKind = "cluster"  // redis-cluster://, rediss-cluster://
	RedisSentinel RedisKind = "sentinel" // redis-sentinel://, rediss-sentinel://
)

// RedisTarget is a parsed [redis] url.
type RedisTarget struct {
	Kind RedisKind
	// Addrs: the node (one), the cluster's seed nodes, or the Sentinels.
	Addrs      []string
	MasterName string // Sentinel only
	DB         int
	Username   string
	Password   string
	TLS        bool
	// node is go-redis's own parse of a one-node URL (it keeps the query
	// options redis.ParseURL knows).
	node *redis.Options
}

// ParseRedisURL parses redis://[user:pass@]host:port/db (also rediss:// and
// unix://, as go-redis's ParseURL), redis-cluster://[user:pass@]host:port,host:port
// (seed nodes; db 0 only) and
// redis-sentinel://[user:pass@]host:port,host:port/<master-name>[/<db>]; the
// rediss-cluster:// and rediss-sentinel:// forms use TLS. The error says what
// is wrong, for the caller to prefix with the key.
func ParseRedisURL(raw string) (RedisTarget, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return RedisTarget{}, fmt.Errorf("%q is not a URL (want redis://host:port/db, redis-cluster://host:port,host:port or redis-sentinel://host:port,host:port/master/db)", raw)
	}
	t := RedisTarget{}
	switch scheme {
	case "redis", "rediss", "unix":
		o, err := redis.ParseURL(raw)
		if err != nil {
			return RedisTarget{}, err
		}
		t.Kind, t.Addrs, t.DB, t.Username, t.Password, t.TLS, t.node = RedisNode, []string{o.Addr}, o.DB, o.Username, o.Password, o.TLSConfig != nil, o
		return t, nil
	case "redis-cluster", "rediss-cluster":
		t.Kind, t.TLS = RedisCluster, scheme == "rediss-cluster"
	case "redis-sentinel", "rediss-sentinel":
		t.Kind, t.TLS = RedisSentinel, scheme == "rediss-sentinel"
	default:
		return RedisTarget{}, fmt.Errorf("unknown scheme %q (want redis, rediss, unix, redis-cluster, rediss-cluster, redis-sentinel or rediss-sentinel)", scheme)
	}
	if strings.ContainsAny(rest, "?#") {
		return RedisTarget{}, fmt.Errorf("%s:// takes no query or fragment", scheme)
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndex(hosts, "@"); at >= 0 {
		user, err := url.PathUnescape(hosts[:at])
		if err != nil {
			return RedisTarget{}, fmt.Errorf("bad user info: %v", err)
		}
		t.Username, t.Password, _ = strings.Cut(user, ":")
		hosts = hosts[at+1:]
	}
	for _, h := range strings.Split(hosts, ",") {
		addr, err := hostPort(h)
		if err != nil {
			return RedisTarget{}, err
		}
		t.Addrs = append(t.Addrs, addr)
	}
	parts := strings.Split(path, "/")
	if path == "" {
		parts = nil
	}
	switch t.Kind {
	case RedisCluster:
		// A cluster has only database 0; "/0" is accepted for symmetry.
		if len(parts) > 1 || (len(parts) == 1 && parts[0] != "0") {
			return RedisTarget{}, fmt.Errorf("a cluster has only database 0, got path %q", "/"+path)
		}
	case RedisSentinel:
		if len(parts) == 0 || parts[0] == "" {
			return RedisTarget{}, errors.New("no master name: want redis-sentinel://host:port,host:port/<master-name>/<db>")
		}
		if len(parts) > 2 {
			return RedisTarget{}, fmt.Errorf("path %q: want /<master-name>/<db>", "/"+path)
		}
		t.MasterName = parts[0]
		if len(parts) == 2 {
			db, err := strconv.Atoi(parts[1])
			if err != nil || db < 0 || db > 15 {
				return RedisTarget{}, fmt.Errorf("database %q: want a number 0-15", parts[1])
			}
			t.DB = db
		}
	}
	return t, nil
}

func hostPort(h string) (string, error) {
	if h == "" {
		return "", errors.New("empty address in the host list")
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		return "", fmt.Errorf("address %q: want host:port", h)
	}
	if host == "" {
		return "", fmt.Errorf("address %q: no host", h)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("address %q: port must be 1-65535", h)
	}
	return net.JoinHostPort(host, port), nil
}

// String names the target without its password, for logs and errors.
func (t RedisTarget) String() string {
	s := string(t.Kind) + " " + strings.Join(t.Addrs, ",")
	if t.MasterName != "" {
		s += " master " + t.MasterName
	}
	return s + "/" + strconv.Itoa(t.DB)
}

// Target is the parsed url of this section (validate has accepted it).
func (r Redis) Target() RedisTarget {
	t, err := ParseRedisURL(r.URL)
	if err != nil {
		// validate rejects a bad URL; reaching here is a programming error.
		panic(fmt.Sprintf("conf: redis.url not validated: %v", err))
	}
	return t
}

// NewClient opens the one Redis client type every binary uses: a node, a
// cluster or a Sentinel-managed master, by the url's scheme.
//
// Client-level retries are off everywhere: a command whose reply was lost
// (EOF, a read timeout) may have run, and running a script again is the
// caller's decision (the purchase path undoes instead; docs/faults.md). On a
// cluster, MOVED and ASK are still followed (the node refused the command
// without running it); the cluster client's own retry of a lost reply is
// turned off per script by package lua (its commands say NoRetry).
func (r Redis) NewClient() redis.UniversalClient {
	t := r.Target()
	tlsConf, err := r.tlsConfig(t)
	var dialer func(context.Context, string, string) (net.Conn, error)
	if err != nil {
		// validate read the files at start; one gone since fails every
		// dial with the reason rather than talking without it.
		dialer = func(context.Context, string, string) (net.Conn, error) { return nil, err }
	}
	switch t.Kind {
	case RedisCluster:
		cc := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:    t.Addrs,
			Username: t.Username, Password: t.Password, TLSConfig: tlsConf, Dialer: dialer,
			PoolSize:    r.PoolSize,
			DialTimeout: r.DialTimeout.Duration, ReadTimeout: r.ReadTimeout.Duration, WriteTimeout: r.WriteTimeout.Duration,
			ContextTimeoutEnabled: true,
			MaxRetries:            -1,
			MaxRedirects:          3,
			// A backstop; a lost node triggers a reload at once (below).
			ClusterStateReloadInterval: 5 * time.Second,
		})
		// go-redis reloads the slot map on MOVED, which a dead master never
		// sends: without this, calls to its slots would fail until the next
		// periodic reload although a replica took over seconds ago.
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(reloadOnNodeError{cc}) })
		return cc
	case RedisSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: t.MasterName, SentinelAddrs: t.Addrs, DB: t.DB,
			Username: t.Username, Password: t.Password, TLSConfig: tlsConf, Dialer: dialer,
			PoolSize:    r.PoolSize,
			DialTimeout: r.DialTimeout.Duration, ReadTimeout: r.ReadTimeout.Duration, WriteTimeout: r.WriteTimeout.Duration,
			ContextTimeoutEnabled: true,
			MaxRetries:            -1,
		})
	}
	o := *t.node
	o.TLSConfig = tlsConf
	if dialer != nil {
		o.Dialer = dialer
	}
	o.PoolSize = r.PoolSize
	o.DialTimeout = r.DialTimeout.Duration
	o.ReadTimeout = r.ReadTimeout.Duration
	o.WriteTimeout = r.WriteTimeout.Duration
	// Every call gets its own deadline from the caller's context.
	o.ContextTimeoutEnabled = true
	o.MaxRetries = -1
	return redis.NewClient(&o)
}

// keyError is a problem of one configuration key (validate names it).
type keyError struct {
	key string
	err error
}

func (e keyError) Error() string { return e.key + ": " + e.err.Error() }

// tlsConfig is the TLS the url's scheme asks for with the tls_* keys
// applied, nil for a plain URL; the files are read here.
func (r Redis) tlsConfig(t RedisTarget) (*tls.Config, error) {
	keys := []struct{ key, v string }{{"redis.tls_ca_file", r.TLSCAFile}, {"redis.tls_cert_file", r.TLSCertFile},
		{"redis.tls_key_file", r.TLSKeyFile}, {"redis.tls_server_name", r.TLSServerName}}
	if !t.TLS {
		for _, k := range keys {
			if k.v != "" {
				return nil, keyError{k.key, errors.New("is set, but redis.url does not use TLS (rediss://, rediss-cluster:// or rediss-sentinel://)")}
			}
		}
		return nil, nil
	}
	var c *tls.Config
	if t.Kind == RedisNode {
		c = t.node.TLSConfig.Clone() // go-redis's: the URL's host, its skip_verify
	} else {
		// No ServerName: crypto/tls then verifies each connection by the
		// host it dials, so every cluster node (by the address the cluster
		// announces), every Sentinel and the master it names is checked
		// against its own name, not the first seed's.
		c = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if r.TLSServerName != "" {
		c.ServerName = r.TLSServerName
	}
	if r.TLSCAFile != "" {
		pem, err := os.ReadFile(r.TLSCAFile)
		if err != nil {
			return nil, keyError{"redis.tls_ca_file", err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, keyError{"redis.tls_ca_file", fmt.Errorf("%s holds no PEM certificate", r.TLSCAFile)}
		}
		c.RootCAs = pool
	}
	switch {
	case r.TLSCertFile != "" && r.TLSKeyFile == "":
		return nil, keyError{"redis.tls_key_file", errors.New("is required with redis.tls_cert_file")}
	case r.TLSCertFile == "" && r.TLSKeyFile != "":
		return nil, keyError{"redis.tls_cert_file", errors.New("is required with redis.tls_key_file")}
	case r.TLSCertFile != "":
		cert, err := tls.LoadX509KeyPair(r.TLSCertFile, r.TLSKeyFile)
		if err != nil {
			return nil, keyError{"redis.tls_cert_file", err}
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// reloadOnNodeError asks a cluster client to reload its slot map (coalesced,
// in the background) when a node fails to answer: refused, reset, timed out.
type reloadOnNodeError struct{ c *redis.ClusterClient }

func nodeFailed(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, redis.Nil) {
		return false
	}
	var re redis.Error
	return !errors.As(err, &re) // a reply from Redis means the node is there
}

func (h reloadOnNodeError) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil && ctx.Err() == nil {
			h.c.ReloadState(ctx)
		}
		return c, err
	}
}

func (h reloadOnNodeError) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if nodeFailed(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnNodeError) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if nodeFailed(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}
