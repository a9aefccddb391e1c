package deploy

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

var clusterNodes = []string{"redis-node-1", "redis-node-2", "redis-node-3", "redis-node-4", "redis-node-5", "redis-node-6"}

// configFile is the content and the in-container path of config source
// mounted in service s.
func configFile(t *testing.T, p *types.Project, s types.ServiceConfig, source string) (content, target string) {
	t.Helper()
	for _, c := range s.Configs {
		if c.Source == source {
			return p.Configs[source].Content, c.Target
		}
	}
	t.Fatalf("%s does not mount config %s", s.Name, source)
	return "", ""
}

// The cluster profile, as deploy/redis-cluster.env turns it on: six nodes of
// one configuration, each announcing its own service name; a one-shot init
// after all six are healthy, naming all six; every application service on
// a redis-cluster:// URL of those nodes, started only after the init
// succeeded; the configuration each would run with loads.
func TestComposeClusterProfile(t *testing.T) {
	p := loadComposeCluster(t, []string{"SECKILL_ADMIN_TOKEN=" + composeToken})
	redisImage := p.Services["redis"].Image
	for _, name := range clusterNodes {
		s, ok := p.Services[name]
		if !ok {
			t.Errorf("cluster profile: no service %s", name)
			continue
		}
		if s.Image != redisImage {
			t.Errorf("%s: image %s, want the redis service's %s", name, s.Image, redisImage)
		}
		content, target := configFile(t, p, s, "redis-cluster-conf")
		for _, want := range []string{"port 6379", "cluster-enabled yes", "cluster-preferred-endpoint-type hostname", `save ""`, "appendonly no"} {
			if !strings.Contains(content, want+"\n") {
				t.Errorf("%s: its configuration lacks %q", name, want)
			}
		}
		want := []string{"redis-server", target, "--cluster-announce-hostname", name}
		if !slices.Equal(s.Command, want) {
			t.Errorf("%s: command %v, want %v", name, s.Command, want)
		}
		if hc := s.HealthCheck; hc == nil || !slices.Equal([]string(hc.Test), []string{"CMD", "redis-cli", "ping"}) {
			t.Errorf("%s: healthcheck %v", name, hc)
		}
		if len(s.Ports) != 0 {
			t.Errorf("%s publishes %v; the nodes stay inside the network", name, s.Ports)
		}
	}
	init, ok := p.Services["redis-cluster-init"]
	if !ok {
		t.Fatal("cluster profile: no redis-cluster-init")
	}
	for _, name := range clusterNodes {
		if d, ok := init.DependsOn[name]; !ok || d.Condition != types.ServiceConditionHealthy {
			t.Errorf("redis-cluster-init must wait for a healthy %s: %+v", name, init.DependsOn[name])
		}
	}
	var nodes []string
	if v := init.Environment["REDIS_NODES"]; v != nil {
		nodes = strings.Fields(*v)
	}
	var want []string
	for _, n := range clusterNodes {
		want = append(want, n+":6379")
	}
	if !slices.Equal(nodes, want) {
		t.Errorf("redis-cluster-init REDIS_NODES %v, want %v", nodes, want)
	}
	script, target := configFile(t, p, init, "redis-cluster-init")
	if !slices.Equal(init.Command, []string{"sh", target}) || !strings.Contains(script, "--cluster-replicas 1 --cluster-yes") {
		t.Errorf("redis-cluster-init: command %v, script %q", init.Command, script)
	}
	if init.Restart != "no" {
		t.Errorf("redis-cluster-init restart %q, want a one-shot (no)", init.Restart)
	}

	apps := checkApps(t, p)
	for _, name := range []string{"proxy", "backend", "worker-1", "worker-2", "bench"} {
		s, ok := p.Services[name]
		if _, app := apps[name]; !ok || !app {
			t.Errorf("cluster profile: no application service %s", name)
			continue
		}
		u := s.Environment["SECKILL_REDIS_URL"]
		if u == nil {
			t.Errorf("%s: no SECKILL_REDIS_URL", name)
			continue
		}
		tg, err := conf.ParseRedisURL(*u)
		if err != nil || tg.Kind != conf.RedisCluster {
			t.Errorf("%s: SECKILL_REDIS_URL %q (%v), want a redis-cluster:// URL", name, *u, err)
			continue
		}
		for _, a := range tg.Addrs {
			if !slices.Contains(want, a) {
				t.Errorf("%s: seed %s is no cluster node", name, a)
			}
		}
		// The bench depends on the others, which wait for the init.
		if name == "bench" {
			continue
		}
		if d, ok := s.DependsOn["redis-cluster-init"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("%s must start after redis-cluster-init succeeded: %+v", name, s.DependsOn)
		}
	}
}

// The profile's node configuration and init script, run as they are on six
// local redis-servers: each node started from the compose file's config
// content and command line (announcing "localhost" for its service name;
// port, bus port and directory its own), then the init script with
// REDIS_NODES naming them. It forms 3 masters + 3 replicas, every node
// answers cluster_state:ok when it exits, clients are sent to the announced
// name, conf's cluster client works on it; run again it leaves the cluster
// alone. What it cannot show: the containers, their DNS and network.
//
// The nodes listen on every address "localhost" resolves to, as a node in
// its container listens on all of its own (the compose config has no bind):
// redis-cli --cluster create resolves the first node's name and has the
// others meet it at the first address, which is ::1 wherever localhost is
// also ::1 (a standard Debian; glibc sorts ::1 first whatever the order in
// /etc/hosts). Bound to 127.0.0.1 alone, the nodes never met there and the
// create waited forever.
func TestComposeClusterInitRuns(t *testing.T) {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-cli not installed (CI requires it)")
		}
		t.Skip("redis-cli not installed")
	}
	t.Parallel()
	p := loadComposeCluster(t, []string{"SECKILL_ADMIN_TOKEN=" + composeToken})
	dir := t.TempDir()
	content, target := configFile(t, p, p.Services[clusterNodes[0]], "redis-cluster-conf")
	confPath := filepath.Join(dir, "cluster.conf")
	servicetest.Must(t, os.WriteFile(confPath, []byte(content), 0o644), "write config")
	binds := localAddrs(t, "localhost")
	var addrs []string
	for _, name := range clusterNodes {
		cmd := slices.Clone(p.Services[name].Command)
		if cmd[0] != "redis-server" || cmd[1] != target || cmd[3] != name {
			t.Fatalf("%s: command %v", name, cmd)
		}
		cmd[3] = "localhost" // the service name, as this machine resolves one
		nodeDir := filepath.Join(dir, name)
		servicetest.Must(t, os.Mkdir(nodeDir, 0o755), "node dir")
		n := servicetest.StartRedisArgs(t, func(port int) []string {
			args := append(append([]string{confPath}, cmd[2:]...), "--port", strconv.Itoa(port), "--bind")
			return append(append(args, binds...), "--cluster-port", strconv.Itoa(servicetest.FreePort(t)), "--dir", nodeDir)
		})
		_, port, _ := strings.Cut(n.Addr, ":")
		addrs = append(addrs, "localhost:"+port)
	}
	script, _ := configFile(t, p, p.Services["redis-cluster-init"], "redis-cluster-init")
	scriptPath := filepath.Join(dir, "cluster-init.sh")
	servicetest.Must(t, os.WriteFile(scriptPath, []byte(script), 0o644), "write script")
	runInit := func() string {
		// Longer than the script's own bounds (~2.5 min in all: each
		// redis-cli call, the create, the wait for the nodes to agree), so
		// that its error, naming the step, is what a failure shows.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c := servicetest.CommandContext(ctx, t, "sh", scriptPath)
		c.Env = append(os.Environ(), "REDIS_NODES="+strings.Join(addrs, " "))
		t0 := time.Now()
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("init script (%v): %v\n%s", time.Since(t0).Round(time.Millisecond), err, out)
		}
		t.Logf("init script: %v", time.Since(t0).Round(time.Millisecond))
		return string(out)
	}
	if out := runInit(); !strings.Contains(out, "redis cluster formed") {
		t.Fatalf("init script output:\n%s", out)
	}
	// Exited 0: every node already agrees; three of them are replicas
	// synced with their master.
	replicas := 0
	for _, a := range addrs {
		rdb := redis.NewClient(&redis.Options{Addr: a})
		info, err := rdb.ClusterInfo(context.Background()).Result()
		repl, rerr := rdb.Info(context.Background(), "replication").Result()
		_ = rdb.Close()
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_size:3") {
			t.Errorf("node %s after the init: %v\n%s", a, err, info)
		}
		if strings.Contains(repl, "role:slave") {
			replicas++
			if !strings.Contains(repl, "master_link_status:up") {
				t.Errorf("replica %s not synced after the init: %v\n%s", a, rerr, repl)
			}
		}
	}
	if replicas != 3 {
		t.Errorf("%d replicas after the init, want 3", replicas)
	}

	rc := conf.Default().Redis
	rc.URL = "redis-cluster://" + strings.Join(addrs[:3], ",")
	rdb := rc.NewClient()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	slots, err := rdb.ClusterSlots(ctx).Result()
	servicetest.Must(t, err, "cluster slots")
	if len(slots) != 3 {
		t.Errorf("%d slot ranges, want 3 masters: %+v", len(slots), slots)
	}
	// (A replica shows in CLUSTER SLOTS only once its master sent it
	// something, repl-ping-replica-period: up to 10 s on an idle cluster.)
	for _, s := range slots {
		for _, n := range s.Nodes {
			if !strings.HasPrefix(n.Addr, "localhost:") {
				t.Errorf("slots %d-%d announced at %s, want the node's name (localhost)", s.Start, s.End, n.Addr)
			}
		}
	}
	for i := range 30 {
		k := fmt.Sprintf("compose:{k%d}", i)
		servicetest.Must(t, rdb.Set(ctx, k, i, time.Minute).Err(), "set %s", k)
		if v, err := rdb.Get(ctx, k).Int(); err != nil || v != i {
			t.Errorf("%s: %d, %v", k, v, err)
		}
	}
	if out := runInit(); !strings.Contains(out, "already formed") {
		t.Errorf("the init run again:\n%s", out)
	}
}

// localAddrs is 127.0.0.1 (where servicetest checks a node answers) and
// every other address host resolves to that can be bound here; an address
// that cannot (::1 with IPv6 off) is left out with a note: the resolver
// sorts such an address last, so no cluster meets there.
func localAddrs(t *testing.T, host string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resolved, err := net.DefaultResolver.LookupHost(ctx, host)
	servicetest.Must(t, err, "resolve %s", host)
	addrs := []string{"127.0.0.1"}
	for _, a := range resolved {
		if slices.Contains(addrs, a) {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(a, "0"))
		if err != nil {
			t.Logf("%s resolves to %s, which cannot be bound here: the nodes leave it out (%v)", host, a, err)
			continue
		}
		_ = ln.Close()
		addrs = append(addrs, a)
	}
	t.Logf("%s resolves to %v; the nodes bind %v", host, resolved, addrs)
	return addrs
}
