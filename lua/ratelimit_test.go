package lua

import (
	"context"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/servicetest"
)

// The script: admits only while count < limit, grants leases capped by
// free/(2*live), writes unique members, sets the TTL to the window, returns
// the exact retry time, and rejects malformed ARGV before any write.
func TestRateLimitScript(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	ctx := context.Background()
	inst, key := prefix+"{rl}:instances", prefix+"{rl}:w:t:g"
	run := func(seq, limit, want int) []int64 {
		v, err := RateLimit.Run(ctx, rdb, []string{inst, key}, "i1", seq, 3000, limit, 2000, want).Int64Slice()
		servicetest.Must(t, err, "run")
		return v
	}
	v := run(1, 10, 100) // free 10, live 1: lease floor(10/2) = 5
	if v[0] != 1 || v[1] != 1 || v[2] != 5 || v[3] != 5 {
		t.Fatalf("first call %v", v)
	}
	v = run(2, 10, 1)
	if v[2] != 1 || v[3] != 4 {
		t.Fatalf("second call %v", v)
	}
	for i := 0; i < 4; i++ {
		run(3+i, 10, 1)
	}
	v = run(9, 10, 1)
	if v[1] != 0 || v[2] != 0 || v[4] < 1900 || v[4] > 2000 {
		t.Fatalf("full window: %v, want denied with retry ~2000ms", v)
	}
	if n := rdb.ZCard(ctx, key).Val(); n != 10 {
		t.Fatalf("log holds %d, want exactly the limit 10", n)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 2*time.Second {
		t.Fatalf("ttl %v, want the window", ttl)
	}
	if err := RateLimit.Run(ctx, rdb, []string{inst, key}, "i1", 1, 3000, 0, 2000, 1).Err(); err == nil {
		t.Fatal("limit 0 accepted")
	}
	if err := RateLimit.Run(ctx, rdb, []string{inst, key}, "i1", 1, 3000, 5).Err(); err == nil {
		t.Fatal("short ARGV accepted")
	}
	// Heartbeat only: a second instance makes live 2.
	v2, err := RateLimit.Run(ctx, rdb, []string{inst}, "i2", 1, 3000).Int64Slice()
	servicetest.Must(t, err, "heartbeat")
	if len(v2) != 2 || v2[0] != 2 {
		t.Fatalf("heartbeat %v, want live 2", v2)
	}
}
