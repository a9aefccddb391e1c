package edge

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/servicetest"
)

func killRedis(t *testing.T, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	_ = rdb.Shutdown(context.Background()).Err()
}

func pauseRedis(t *testing.T, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	servicetest.Must(t, rdb.Do(context.Background(), "CLIENT", "PAUSE", "30000", "ALL").Err(), "client pause")
	t.Cleanup(func() {
		r := redis.NewClient(&redis.Options{Addr: addr})
		_ = r.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
		_ = r.Close()
	})
}

// slowProxy forwards TCP to addr, holding every chunk from the server for d
// (internal/faultnet: later chunks of a connection wait behind it).
func slowProxy(t *testing.T, addr string, d time.Duration) string {
	t.Helper()
	p, err := faultnet.Listen("127.0.0.1:0", addr)
	servicetest.Must(t, err, "fault proxy")
	t.Cleanup(func() { p.Close() })
	p.Set(faultnet.Faults{Down: faultnet.Flow{DelayRate: 1, Delay: d}})
	return p.Addr()
}
