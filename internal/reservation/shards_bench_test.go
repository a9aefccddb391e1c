package reservation_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// BenchmarkShardNodeCalls: how a hot sale's Redis calls spread over the
// masters of a cluster with 1, 3, 4 and 6 stock shards (INFO commandstats of
// every master, the delta over the run): the script calls (EVALSHA, EVAL:
// what the purchase path sends), and every command (commandstats counts the
// commands scripts run too; the cluster's chatter — INFO, CLUSTER, PING —
// left out). One op is one purchase by a new user, 32 at a
// time; "fill" sells out the sale halfway (stock = ops/2), so the moves
// between shards and the sold-out checks are counted too. Needs
// SECKILL_TEST_REDIS_CLUSTER_URL:
//
//	SECKILL_TEST_REDIS_CLUSTER_URL=redis-cluster://... go test -run '^$' \
//	  -bench ShardNodeCalls -benchtime 20000x ./internal/reservation
func BenchmarkShardNodeCalls(b *testing.B) {
	url := servicetest.Cluster(b, 17600)
	var runs atomic.Int64
	for _, fill := range []bool{false, true} {
		for _, shards := range []int{1, 3, 4, 6} {
			b.Run(fmt.Sprintf("shards=%d/fill=%v", shards, fill), func(b *testing.B) {
				rdb, prefix := servicetest.RedisAt(b, url)
				c := rdb.(*redis.ClusterClient)
				st := reservation.New(rdb, prefix)
				ctx := context.Background()
				id := 900 + runs.Add(1) // b.Run runs a benchmark more than once
				stock := int64(10 * b.N)
				if fill {
					stock = int64(b.N / 2)
				}
				warmShards(b, st, rdb, id, stock, 1, shards)
				homes := map[string][]int{}
				for k := 0; k < shards; k++ {
					m := masterOf(b, c, st.ShardKeys(id, k, shards).Meta)
					homes[m] = append(homes[m], k)
				}
				before := nodeCalls(b, c)
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				for w := 0; w < 32; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := next.Add(1)
							if i > int64(b.N) {
								return
							}
							if _, err := buy(ctx, st, id, "bench"+strconv.FormatInt(i, 10), "", 1); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				after := nodeCalls(b, c)
				var total, top, inner int64
				var line []string
				addrs := make([]string, 0, len(after))
				for a := range after {
					addrs = append(addrs, a)
				}
				sort.Strings(addrs)
				for _, a := range addrs {
					d := after[a].calls - before[a].calls
					in := after[a].all - before[a].all
					total, inner = total+d, inner+in
					top = max(top, d)
					line = append(line, fmt.Sprintf("%s %d scripts, %d commands (shards %v)", a, d, in, homes[a]))
				}
				b.ReportMetric(float64(top)/float64(max(total, 1)), "top-node-share")
				b.ReportMetric(float64(total)/float64(b.N), "scripts/op")
				b.ReportMetric(float64(inner)/float64(b.N), "cmds/op")
				b.Logf("%d purchases, %d script calls, %d commands: %s", b.N, total, inner, strings.Join(line, "; "))
			})
		}
	}
}

// nodeStats are one master's command counts: script calls, and every
// command (those scripts ran included).
type nodeStats struct{ calls, all int64 }

func nodeCalls(t testing.TB, c *redis.ClusterClient) map[string]nodeStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	out := map[string]nodeStats{}
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		s, err := n.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		var st nodeStats
		for _, l := range strings.Split(s, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(l), ":calls=")
			if !ok {
				continue
			}
			calls, _, _ := strings.Cut(rest, ",")
			k, _ := strconv.ParseInt(calls, 10, 64)
			switch strings.TrimPrefix(name, "cmdstat_") {
			case "info", "cluster|slots", "cluster|shards", "cluster|nodes", "cluster", "ping", "command", "command|docs", "readonly", "hello", "client|setinfo", "script|load":
				continue
			case "evalsha", "eval":
				st.calls += k
			}
			st.all += k
		}
		mu.Lock()
		out[n.Options().Addr] = st
		mu.Unlock()
		return nil
	})
	servicetest.Must(t, err, "commandstats")
	return out
}

// BenchmarkShardTagCold: the cost of a shard's tag the first time a process
// names it (ShardTag caches it after): ~4,096 CRC16s of a few digits.
func BenchmarkShardTagCold(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		reservation.ShardTag(int64(1_000_000+i), 1+i%63, 64)
	}
}
