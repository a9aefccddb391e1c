package redisnodes_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/redisnodes"
	"github.com/seckill/seckill/internal/servicetest"
)

// CommandCalls counts per master: STRLEN (a command nothing else here
// sends) on keys of every master shows up on each key's master only, as
// many times as it was sent there; on one node, all on that node.
func TestCommandCalls(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		url  func() string
	}{
		{"node", func() string { return "redis://" + servicetest.PrivateRedis(t).Addr + "/0" }},
		{"cluster", func() string { return servicetest.Cluster(t, 27000) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, prefix := servicetest.RedisAt(t, tc.url())
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			before, err := redisnodes.CommandCalls(ctx, rdb)
			servicetest.Must(t, err, "before")
			want := map[string]int64{}
			for i := range 40 {
				k := fmt.Sprintf("%s{c%d}", prefix, i)
				servicetest.Must(t, rdb.StrLen(ctx, k).Err(), "strlen")
				addr := "node"
				if cc, ok := rdb.(*redis.ClusterClient); ok {
					n, err := cc.MasterForKey(ctx, k)
					servicetest.Must(t, err, "master of %s", k)
					addr = n.Options().Addr
				} else {
					addr = rdb.(*redis.Client).Options().Addr
				}
				want[addr]++
			}
			after, err := redisnodes.CommandCalls(ctx, rdb)
			servicetest.Must(t, err, "after")
			if n := map[string]int{"node": 1, "cluster": 3}[tc.name]; len(after) != n {
				t.Errorf("read %d masters, want %d: %v", len(after), n, after)
			}
			for addr, a := range after {
				d := a.Since(before[addr])
				if d["strlen"] != want[addr] {
					t.Errorf("%s: strlen %d calls over the run, want %d (delta %v)", addr, d["strlen"], want[addr], d)
				}
				if d["info"] != 1 {
					t.Errorf("%s: the earlier INFO counted %d times, want 1", addr, d["info"])
				}
			}
		})
	}
}

func TestParseCommandStats(t *testing.T) {
	c := redisnodes.ParseCommandStats("# Commandstats\r\ncmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=1\r\n" +
		"cmdstat_cluster|slots:calls=3,usec=9\r\ncmdstat_bad:calls=x\r\nother:calls=5\r\n")
	if len(c) != 2 || c["evalsha"] != 12 || c["cluster|slots"] != 3 {
		t.Errorf("parsed %v", c)
	}
	d := redisnodes.Calls{"evalsha": 15, "get": 2, "set": 1}.Since(redisnodes.Calls{"evalsha": 12, "get": 5, "set": 1})
	if len(d) != 2 || d["evalsha"] != 3 || d["get"] != 2 {
		t.Errorf("since: %v (a count that went down counts from zero)", d)
	}
}
