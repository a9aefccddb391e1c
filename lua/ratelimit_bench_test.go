package lua

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/servicetest"
)

// The script's own cost per decision for a crowd batch: 300 decisions of
// distinct clients (per-client window 5 per second, new each time) and one
// global window (3000 per second), the global window binding (every
// decision refused by it) or not (every decision admitted). Reported as
// redis-server CPU µs per decision (its own server: nothing else counts).
func BenchmarkRateLimitCrowdBatch(b *testing.B) {
	for _, mode := range []string{"global-binding", "global-open"} {
		b.Run(mode, func(b *testing.B) {
			srv := servicetest.PrivateRedis(b)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer rdb.Close()
			ctx := context.Background()
			limit := 3000
			if mode == "global-open" {
				limit = 10_000_000
			}
			const batch = 300
			global := "{g}"
			if mode == "global-binding" {
				fill := make([]any, 0, 3*limit)
				for i := range limit {
					fill = append(fill, 0, "pre:"+strconv.Itoa(i))
				}
				// scored far ahead so they count all run long
				t, _ := rdb.Time(ctx).Result()
				for i := 0; i < len(fill); i += 2 {
					fill[i] = float64(t.UnixMicro() + 3_600_000_000)
				}
				servicetest.Must(b, rdb.ZAdd(ctx, global, zs(fill)...).Err(), "fill")
			}
			cpu0 := redisCPU(b, rdb)
			b.ReportAllocs()
			b.ResetTimer()
			for n := range b.N {
				keys := []string{global}
				args := []any{"b", n, 1, 50}
				for i := range batch {
					keys = append(keys, fmt.Sprintf("{c:%d:%d}", n, i))
					args = append(args, 1, 2, i+2, 5, 1000, 0, 1, limit, 1000, 0)
				}
				if err := RateLimit.Run(ctx, rdb, keys, args...).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric((redisCPU(b, rdb)-cpu0)/float64(b.N*batch), "redis-us/decision")
		})
	}
}

func zs(fill []any) []redis.Z {
	out := make([]redis.Z, 0, len(fill)/2)
	for i := 0; i < len(fill); i += 2 {
		out = append(out, redis.Z{Score: fill[i].(float64), Member: fill[i+1]})
	}
	return out
}

// redisCPU is the server's user + system CPU so far, µs.
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	servicetest.Must(b, err, "info cpu")
	us := 0.0
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			us += f * 1e6
		}
	}
	return us
}
