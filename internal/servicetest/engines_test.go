package servicetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/redisnodes"
)

// A started cluster has 3 masters with a replica each and every slot served;
// keys of many hash tags spread over all masters and Scan finds them all.
func TestStartCluster(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	e := StartCluster(t, 26200)
	t.Logf("cluster up in %v", time.Since(t0))
	if !strings.HasPrefix(e.URL, "redis-cluster://") {
		t.Fatalf("url %q", e.URL)
	}
	rdb, prefix := RedisAt(t, e.URL)
	c := rdb.(*redis.ClusterClient)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nodes, err := c.ClusterNodes(ctx).Result()
	Must(t, err, "cluster nodes")
	masters, replicas := 0, 0
	for _, l := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 8 && strings.Contains(f[2], "master"):
			masters++
		case len(f) > 3 && strings.Contains(f[2], "slave") && f[3] != "-":
			replicas++
		}
	}
	if masters != 3 || replicas != 3 {
		t.Fatalf("%d masters with slots and %d replicas, want 3 and 3:\n%s", masters, replicas, nodes)
	}
	for i := 0; i < 300; i++ {
		Must(t, rdb.Set(ctx, fmt.Sprintf("%s{x%d}", prefix, i), 1, 0).Err(), "set")
	}
	var mu sync.Mutex
	perMaster := map[string]int64{}
	Must(t, c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		k, err := n.DBSize(ctx).Result()
		mu.Lock()
		perMaster[n.Options().Addr] = k
		mu.Unlock()
		return err
	}), "dbsize")
	for a, k := range perMaster {
		if k == 0 {
			t.Errorf("master %s holds no key of 300 hash tags", a)
		}
	}
	keys, err := redisnodes.Scan(ctx, rdb, prefix+"*")
	Must(t, err, "scan")
	if len(keys) != 300 {
		t.Errorf("scan found %d keys, want 300", len(keys))
	}
}

func TestStartSentinel(t *testing.T) {
	t.Parallel()
	e := StartSentinel(t, 26450)
	rdb, prefix := RedisAt(t, e.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	Must(t, rdb.Set(ctx, prefix+"k", "v", 0).Err(), "set")
	info, err := rdb.Info(ctx, "replication").Result()
	Must(t, err, "info")
	if !strings.Contains(info, "role:master") || !strings.Contains(info, "connected_slaves:1") {
		t.Errorf("the Sentinel client is not on a master with one replica:\n%s", info)
	}
}
