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
	v, err := RateLimit.Run(ctx, rdb, keys, "i1", 7, 1, 50,
		2, 2, 1, 3, 2000, 0, 2, 10, 2000, 0,
		2, 1, 1, 3, 2000, 0,
		1, 1, 1, 3, 2000, 0).Int64Slice()
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
	v, err = RateLimit.Run(ctx, rdb, keys[:1], "i2", 1, 1, 50, 1, 1, 1, 3, 2000, 0, 4, 1, 1, 3, 2000, 0).Int64Slice()
	servicetest.Must(t, err, "full")
	if v[1] != 0 || v[2] != 1 || v[3] != 0 || v[4] > 1950 || v[4] < 1500 || v[5] != 0 || v[6] != 1 || v[8] != 2000 {
		t.Fatalf("full window: %v, want refused, reset within ~1950ms; weight 4 refused with reset 2000", v)
	}
	// Malformed calls are refused and write nothing.
	for _, args := range [][]any{
		{"i3", 1, 1, 50},                         // no op
		{"i3", 1, 0, 50, 1, 1, 1, 3, 2000, 0},    // live 0
		{"i3", 1, 1, 50, -1, 1, 1, 3, 2000, 0},   // weight < 0
		{"i3", 1, 1, 50, 1, 1, 3, 3, 2000, 0},    // key index past KEYS
		{"i3", 1, 1, 50, 1, 1, 1, 0, 2000, 0},    // limit 0
		{"i3", 1, 1, 50, 1, 1, 1, 3, 2000, -1},   // lease < 0
		{"i3", 1, 1, 50, 1, 2, 1, 3, 2000, 0},    // a window short
		{"i3", 1, 1, 50, 1, 1, 1, 3, "2000x", 0}, // not a number
	} {
		if err := RateLimit.Run(ctx, rdb, keys[:1], args...).Err(); err == nil || !strings.Contains(err.Error(), "ratelimit:") {
			t.Errorf("%v: err %v, want a ratelimit error", args, err)
		}
	}
	if n := rdb.ZCard(ctx, a).Val(); n != 3 {
		t.Fatalf("%d members after refused calls, want 3", n)
	}
}

// Leases: granted only to an admitted op, at most what keeps 2 x live x
// lease free, scored at the end of the spending time; they count (remaining,
// later refusals) like any hit, but a window full while leased slots may
// still come back resets at the end of their spending time.
func TestRateLimitLeases(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	ctx := context.Background()
	a := prefix + "{rl:g:l}:x"
	// live 2, spend 50 ms, limit 100: op 1 asks 50, gets floor(99/4) = 24;
	// op 2 asks 50, gets floor(74/4) = 18; op 3 (weight 200) is refused and
	// gets none.
	v, err := RateLimit.Run(ctx, rdb, []string{a}, "i1", 3, 2, 50,
		1, 1, 1, 100, 2000, 50,
		1, 1, 1, 100, 2000, 50,
		200, 1, 1, 100, 2000, 50).Int64Slice()
	servicetest.Must(t, err, "run")
	now := v[0]
	want := []int64{now, 1, 0, 75, 2000, 24, 1, 0, 56, 2000, 18, 0, 1, 56, 2000, 0}
	if len(v) != len(want) {
		t.Fatalf("reply %v, want %v", v, want)
	}
	for i := range want {
		if v[i] != want[i] {
			t.Fatalf("reply %v, want %v", v, want)
		}
	}
	zs := rdb.ZRangeWithScores(ctx, a, 0, -1).Val()
	leased := 0
	for _, z := range zs {
		name := z.Member.(string)
		switch {
		case strings.Contains(name, ":l"):
			leased++
			if int64(z.Score) != now+50000 {
				t.Fatalf("lease member %s scored %v, want the end of the spending time %d", name, z.Score, now+50000)
			}
		case int64(z.Score) != now:
			t.Fatalf("member %s scored %v, want %d", name, z.Score, now)
		}
	}
	if leased != 42 || len(zs) != 44 {
		t.Fatalf("%d members, %d leased; want 44 and 42", len(zs), leased)
	}
	if ttl := rdb.PTTL(ctx, a).Val(); ttl < 2900*time.Millisecond || ttl > 3050*time.Millisecond {
		t.Fatalf("ttl %v, want window + spend + 1s", ttl)
	}
	// A lease alone (weight 0): nothing of its own, 14 slots of 56 free.
	v, err = RateLimit.Run(ctx, rdb, []string{a}, "i1", 5, 2, 50, 0, 1, 1, 100, 2000, 50).Int64Slice()
	servicetest.Must(t, err, "lease alone")
	if len(v) != 6 || v[1] != 1 || v[2] != 0 || v[3] != 42 || v[5] != 14 {
		t.Fatalf("lease alone: %v, want admitted, 42 left, 14 leased", v)
	}

	// Limit 64, live 1: op 1 leases 4 (5 counted); op 2 (weight 61) refused:
	// it fits once rank 1 (a lease member) slides out (2050 ms) or once the
	// lease's unspent slots come back at the end of its spending time: 51 ms;
	// op 3 (weight 57) admitted at now, sorted before the lease members; op 4
	// (weight 4) refused: again 51 ms.
	b := prefix + "{rl:g:m}:x"
	v, err = RateLimit.Run(ctx, rdb, []string{b}, "i1", 4, 1, 50,
		1, 1, 1, 64, 2000, 4,
		61, 1, 1, 64, 2000, 0,
		57, 1, 1, 64, 2000, 0,
		4, 1, 1, 64, 2000, 0).Int64Slice()
	servicetest.Must(t, err, "ranks")
	want = []int64{v[0], 1, 0, 59, 2000, 4, 0, 1, 59, 51, 1, 0, 2, 2000, 0, 1, 2, 51}
	if len(v) != len(want) {
		t.Fatalf("reply %v, want %v (leased only where asked)", v, want)
	}
	for i := range want {
		if v[i] != want[i] {
			t.Fatalf("reply %v, want %v", v, want)
		}
	}
	// Narrower than 64 or shorter than 500 ms: never leased.
	for _, w := range [][2]int{{63, 2000}, {100, 499}} {
		v, err = RateLimit.Run(ctx, rdb, []string{prefix + "{rl:g:narrow}"}, "i1", 5, 1, 50, 1, 1, 1, w[0], w[1], 50).Int64Slice()
		servicetest.Must(t, err, "narrow")
		if v[5] != 0 {
			t.Fatalf("limit %d per %d ms leased %d", w[0], w[1], v[5])
		}
	}
}

// The reset of a refused window holding leases of several instances is the
// EARLIEST end of their spending times (the first slots that may come
// back), and a decision that takes the last slot says so too.
func TestRateLimitResetAtEarliestLeaseEnd(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	ctx := context.Background()
	k := prefix + "{rl:g:early}"
	// A leases 20 (spend 50 ms), 30 ms later C leases 20.
	va, err := RateLimit.Run(ctx, rdb, []string{k}, "A", 1, 1, 50, 1, 1, 1, 100, 2000, 20).Int64Slice()
	servicetest.Must(t, err, "A")
	time.Sleep(30 * time.Millisecond)
	vc, err := RateLimit.Run(ctx, rdb, []string{k}, "C", 1, 1, 50, 1, 1, 1, 100, 2000, 20).Int64Slice()
	servicetest.Must(t, err, "C")
	if va[5] != 20 || vc[5] != 20 {
		t.Fatalf("leases %v %v, want 20 each", va, vc)
	}
	// B takes the last 58 slots (remaining 0), then is refused.
	vb, err := RateLimit.Run(ctx, rdb, []string{k}, "B", 1, 1, 50, 58, 1, 1, 100, 2000, 0, 1, 1, 1, 100, 2000, 0).Int64Slice()
	servicetest.Must(t, err, "B")
	firstEnd := va[0] + 50000
	for _, at := range []int{4, 8} { // the last slot's reset, the refusal's
		want := (firstEnd-vb[0]+999)/1000 + 1
		if vb[at] != want {
			t.Fatalf("reply %v: reset %d ms at %d, want %d (A's lease end, not C's)", vb, vb[at], at, want)
		}
	}
	if vb[2] != 0 || vb[6] != 1 {
		t.Fatalf("reply %v: want the last slot taken (remaining 0), then a refusal", vb)
	}
}
