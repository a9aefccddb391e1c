package lua

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/servicetest"
)

// The script: ops decided in order, each against all of its windows at one
// moment; members scored with that moment and named <id>:<seq>:<op>:<j>;
// nothing written for a refused op; full/remaining/reset per window (reset
// of a full window: until the weight fits); the TTL covers the newest
// member; malformed ARGV rejected before any write.
func TestRateLimitScript(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	ctx := context.Background()
	a, b := prefix+"{rl:a:1}:r", prefix+"{rl:a:1}:s"
	keys := []string{a, b}
	// op 1: weight 2 on a (limit 3) and b (limit 10); op 2: weight 2 on a
	// alone (only 1 left: refused); op 3: weight 1 on a (the last slot).
	v, err := RateLimit.Run(ctx, rdb, keys, "i1", 7,
		2, 2, 1, 3, 2000, 2, 10, 2000,
		2, 1, 1, 3, 2000,
		1, 1, 1, 3, 2000).Int64Slice()
	servicetest.Must(t, err, "run")
	now := v[0]
	want := []int64{now, 1, 0, 1, 2000, 0, 8, 2000, 0, 1, 1, 2000, 1, 0, 0, 2000}
	if len(v) != len(want) {
		t.Fatalf("reply %v, want %v", v, want)
	}
	for i := range want {
		if v[i] != want[i] {
			t.Fatalf("reply %v, want %v", v, want)
		}
	}
	zs := rdb.ZRangeWithScores(ctx, a, 0, -1).Val()
	var names []string
	for _, z := range zs {
		if int64(z.Score) != now {
			t.Fatalf("member %v scored %v, want the decision's moment %d", z.Member, z.Score, now)
		}
		names = append(names, z.Member.(string))
	}
	if got := strings.Join(names, " "); got != "i1:7:1:1 i1:7:1:2 i1:7:3:1" {
		t.Fatalf("members %q, want op 1's two and op 3's one (op 2 wrote nothing)", got)
	}
	if ttl := rdb.PTTL(ctx, a).Val(); ttl > 3000*time.Millisecond || ttl < 2500*time.Millisecond {
		t.Fatalf("ttl %v, want window + 1s", ttl)
	}
	// Full for weight 1: reset is when the oldest slides out; for weight 3
	// (all three must go) the same moment, all share it; weight 4 > limit:
	// the window (never).
	time.Sleep(50 * time.Millisecond)
	v, err = RateLimit.Run(ctx, rdb, keys[:1], "i2", 1, 1, 1, 1, 3, 2000, 4, 1, 1, 3, 2000).Int64Slice()
	servicetest.Must(t, err, "full")
	if v[1] != 0 || v[2] != 1 || v[3] != 0 || v[4] > 1950 || v[4] < 1500 || v[5] != 0 || v[6] != 1 || v[8] != 2000 {
		t.Fatalf("full window: %v, want refused, reset within ~1950ms; weight 4 refused with reset 2000", v)
	}
	// Malformed calls are refused and write nothing.
	for _, args := range [][]any{
		{"i3", 1},                      // no op
		{"i3", 1, 0, 1, 1, 3, 2000},    // weight 0
		{"i3", 1, 1, 1, 3, 3, 2000},    // key index past KEYS
		{"i3", 1, 1, 1, 1, 0, 2000},    // limit 0
		{"i3", 1, 1, 2, 1, 3, 2000},    // a window short
		{"i3", 1, 1, 1, 1, 3, "2000x"}, // not a number
	} {
		if err := RateLimit.Run(ctx, rdb, keys[:1], args...).Err(); err == nil || !strings.Contains(err.Error(), "ratelimit:") {
			t.Errorf("%v: err %v, want a ratelimit error", args, err)
		}
	}
	if n := rdb.ZCard(ctx, a).Val(); n != 3 {
		t.Fatalf("%d members after refused calls, want 3", n)
	}
}
