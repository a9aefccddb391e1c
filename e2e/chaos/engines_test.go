package chaos

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// engine marks a failover test of a Redis engine of the test's own: it
// disturbs no shared service, but is long (seconds of failover, a full
// drain), so it runs under make chaos (SECKILL_CHAOS=1) only.
func engine(t *testing.T) {
	t.Helper()
	if os.Getenv(EnvChaos) != "1" {
		t.Skipf("long form; run with %s=1 (make chaos)", EnvChaos)
	}
	if testing.Short() {
		t.Skip("fault injection")
	}
	t.Parallel()
}

// outage records the answers from a fault until the first 202 after it.
type outage struct {
	mu        sync.Mutex
	at        time.Time // the fault; zero before it
	recovered time.Time
	answers   map[string]int
}

func (o *outage) start() {
	o.mu.Lock()
	o.at, o.answers = time.Now(), map[string]int{}
	o.mu.Unlock()
}

func (o *outage) answer(a string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.at.IsZero() || !o.recovered.IsZero() {
		return
	}
	if a == "202" {
		o.recovered = time.Now()
		return
	}
	o.answers[a]++
}

// report is "downtime 3.1s; answers meanwhile: 503 unavailable ×120, ...".
func (o *outage) report() (time.Duration, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.recovered.IsZero() {
		return -1, "no 202 after the fault"
	}
	var parts []string
	for a, n := range o.answers {
		parts = append(parts, fmt.Sprintf("%s ×%d", a, n))
	}
	sort.Strings(parts)
	d := o.recovered.Sub(o.at)
	return d, fmt.Sprintf("downtime %v (kill to the first 202); answers meanwhile: %s", d.Round(10*time.Millisecond), strings.Join(parts, ", "))
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	servicetest.Must(t, err, "address %q", addr)
	n, err := strconv.Atoi(p)
	servicetest.Must(t, err, "port of %q", addr)
	return n
}

// slotMaster is the address of the online master serving key's slot, ""
// while none is (a failover in progress).
func slotMaster(t *testing.T, rdb *redis.ClusterClient, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	servicetest.Must(t, err, "keyslot")
	shards, err := rdb.ClusterShards(ctx).Result()
	servicetest.Must(t, err, "cluster shards")
	for _, s := range shards {
		for _, r := range s.Slots {
			if r.Start <= slot && slot <= r.End {
				for _, n := range s.Nodes {
					if n.Role == "master" && n.Health == "online" {
						return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
					}
				}
			}
		}
	}
	return ""
}

// The master holding a sale's slot is killed (kill -9) mid-sale on a
// 3-master cluster; its replica is promoted (cluster-node-timeout 2s). Every
// purchase of that sale goes to that one slot, so the sale stops until the
// promotion: the answers meanwhile must be 503 (nothing kept) or transport
// errors retried, never a 202 without a reservation. After the drain I1–I5
// hold. Redis replication is asynchronous: writes the master acknowledged
// in its last moments may not have reached the replica, so the verdict runs
// with RedisLost (MySQL decides; Redis records may be missing), as after
// FLUSHDB.
//
// Sharded: the same with the sale's stock in 3 stock shards, one per
// master, and the master of shard 1 killed: buyers homed on that shard get
// 503 until the promotion, the others buy on, and a move that needs the
// dead shard answers 503, never a false sold-out.
func TestRedisClusterMasterFailover(t *testing.T) {
	engine(t)
	for _, tc := range []struct {
		name          string
		port          int
		shards, shard int // the sale's stock shards, the one whose master dies
	}{
		{"one slot", 26500, 1, 0},
		{"3 stock shards", 26550, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clusterFailover(t, tc.port, tc.shards, tc.shard)
		})
	}
}

func clusterFailover(t *testing.T, port, shards, shard int) {
	e := servicetest.StartCluster(t, port)
	cfg := strings.Replace(stack.Fast(""), "[backend]\n", fmt.Sprintf("[backend]\nstock_shards = %d\n", shards), 1)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3, RedisURL: e.URL, Config: cfg})
	s.RedisLost = true
	sale := s.CreateSale(t, saleID(), 1200, 2)
	cc := s.Redis.(*redis.ClusterClient)
	tag := reservation.ShardKeys("", sale.ID, shard, shards).Base
	victim := slotMaster(t, cc, tag)
	if victim == "" {
		t.Fatalf("no master serves the slot of %s before the fault", tag)
	}
	if shards > 1 {
		masters := map[string]bool{}
		for k := 0; k < shards; k++ {
			masters[slotMaster(t, cc, reservation.ShardKeys("", sale.ID, k, shards).Base)] = true
		}
		t.Logf("%d stock shards on %d masters; killing %s (shard %d)", shards, len(masters), victim, shard)
	}
	c := stack.NewCrowd(sale, 500, 3, "cf")
	c.Spread = 10 * time.Second
	var o outage
	c.OnAnswer = o.answer
	during(t, s, c, func() {
		midSale(c, 0.2, 0.35)
		o.start()
		servicetest.Must(t, syscall.Kill(e.Pid(t, portOf(t, victim)), syscall.SIGKILL), "kill -9 %s", victim)
		// The promotion, seen by the cluster.
		deadline := time.Now().Add(30 * time.Second)
		for m := victim; m == victim || m == ""; m = slotMaster(t, cc, tag) {
			if time.Now().After(deadline) {
				t.Fatalf("no replica took over from %s in 30s", victim)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("replica promoted %v after the kill", time.Since(o.at).Round(10*time.Millisecond))
		// The old master comes back as a replica of the new one.
		e.Restart(t, portOf(t, victim))
	})
	c.ExpectContract(t, true)
	d, rep := o.report()
	t.Log(rep)
	if d < 0 {
		t.Fatalf("sales did not resume after the failover: %s", rep)
	}
	s.Finish(t, fmt.Sprintf("redis cluster: kill -9 of the sale's master (down %v)", d.Round(100*time.Millisecond)), sale, c)
}

// Sentinel: the master of a 1 master + 1 replica + 3 Sentinel set is killed
// mid-sale; the Sentinels promote the replica (down-after 1s) and the
// clients (go-redis's failover client) follow it. I1–I5 after the drain, as
// for the cluster.
func TestRedisSentinelFailover(t *testing.T) {
	engine(t)
	e := servicetest.StartSentinel(t, 26600)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3, RedisURL: e.URL, Config: stack.Fast("")})
	s.RedisLost = true
	sale := s.CreateSale(t, saleID(), 1200, 2)
	sentinelAddr := strings.Split(strings.TrimPrefix(e.URL, "redis-sentinel://"), ",")[0]
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinelAddr})
	t.Cleanup(func() { _ = sc.Close() })
	master := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a, err := sc.GetMasterAddrByName(ctx, "seckill").Result()
		servicetest.Must(t, err, "sentinel master")
		return net.JoinHostPort(a[0], a[1])
	}
	victim := master()
	c := stack.NewCrowd(sale, 500, 3, "sf")
	c.Spread = 10 * time.Second
	var o outage
	c.OnAnswer = o.answer
	during(t, s, c, func() {
		midSale(c, 0.2, 0.35)
		o.start()
		servicetest.Must(t, syscall.Kill(e.Pid(t, portOf(t, victim)), syscall.SIGKILL), "kill -9 %s", victim)
		deadline := time.Now().Add(30 * time.Second)
		for master() == victim {
			if time.Now().After(deadline) {
				t.Fatalf("the Sentinels did not promote a replica in 30s")
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("Sentinels switched the master %v after the kill", time.Since(o.at).Round(10*time.Millisecond))
	})
	c.ExpectContract(t, true)
	d, rep := o.report()
	t.Log(rep)
	if d < 0 {
		t.Fatalf("sales did not resume after the failover: %s", rep)
	}
	s.Finish(t, fmt.Sprintf("redis sentinel: kill -9 of the master (down %v)", d.Round(100*time.Millisecond)), sale, c)
}
