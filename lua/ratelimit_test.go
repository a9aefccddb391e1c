package lua

import (
	"context"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/servicetest"
)

// The script: grants min(need, free) plus a lease capped by free/(2*live),
// scores slot 1 now (now+short with first=1), names the earliest future
// member of a full window, waiters' slots at now+short and the lease at
// now+lease; answers "full" only for the window without room and writes
// nothing then; gives back named members before counting; never shortens the
// TTL; and rejects malformed ARGV before any write.
func TestRateLimitScript(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	ctx := context.Background()
	ip, g := prefix+"{rl:a:1}:r", prefix+"{rl:a:1}:s"
	type win struct {
		limit, need, extra int
		back               string
	}
	run := func(seq int, ws ...win) []int64 {
		t.Helper()
		keys := []string{ip, g}[:len(ws)]
		args := []any{"i1", seq, 1, 0}
		for _, w := range ws {
			args = append(args, w.limit, 2000, w.need, w.extra, 100, 500, w.back)
		}
		v, err := RateLimit.Run(ctx, rdb, keys, args...).Int64Slice()
		servicetest.Must(t, err, "run")
		return v
	}
	// free 10, need 3, extra 100: 3 + floor(7/2) = 6 granted.
	start := time.Now()
	v := run(1, win{10, 3, 100, ""})
	if v[0] != 1 || v[2] != 3 || v[3] != 6 || v[4] != 0 || v[5] != 4 {
		t.Fatalf("first call %v", v)
	}
	now := v[1]
	zs := rdb.ZRangeWithScores(ctx, ip, 0, -1).Val()
	scores := map[string]int64{}
	for _, z := range zs {
		scores[z.Member.(string)] = int64(z.Score)
	}
	if scores["i1:1:1:1"] != now || scores["i1:1:1:2"] != now+100_000 || scores["i1:1:1:3"] != now+100_000 ||
		scores["i1:1:1:4"] != now+500_000 || len(scores) != 6 {
		t.Fatalf("scores %v (now %d)", scores, now)
	}
	// The TTL was set to window + lease (2.5s, +1ms) when the call ran, at
	// most `el` ago.
	if ttl, el := rdb.PTTL(ctx, ip).Val(), time.Since(start); ttl > 2501*time.Millisecond || ttl+el < 2500*time.Millisecond {
		t.Fatalf("ttl %v read %v after the call, want window + lease", ttl, el)
	}
	// Give back slots 4..6 and take 4 more in the same call: 3 left + 4 = 7.
	v = run(2, win{10, 4, 0, "1:1:4:6"})
	if v[3] != 4 || v[5] != 3 {
		t.Fatalf("give back + take: %v", v)
	}
	v = run(3, win{10, 3, 0, ""})
	// The oldest slot is the first call's: the window resets 2000ms after
	// it, so at most the time since then (a loaded machine may take 100ms
	// between two calls) less than 2000ms.
	if el := time.Since(start).Milliseconds(); v[0] != 1 || v[3] != 3 || v[5] != 0 || v[6] > 2000 || v[6] < 2000-el {
		t.Fatalf("filling call %v: want 3 granted, 0 left, reset 2000ms after the first call (%dms ago)", v, el)
	}
	// Full, and every future member is the caller's own: back_ms -1. As
	// seen by another instance, the earliest future member (the first
	// call's waiter slots, now+100ms) may come back after it.
	if v[7] != -1 {
		t.Fatalf("filling call %v: back_ms %d, want -1 (own leases only)", v, v[7])
	}
	o, err := RateLimit.Run(ctx, rdb, []string{ip}, "i2", 1, 1, 0, 10, 2000, 1, 0, 100, 500, "").Int64Slice()
	servicetest.Must(t, err, "other instance")
	if o[0] != 0 || o[7] < 0 || o[7] > 100 {
		t.Fatalf("other instance on the full window: %v, want refused with back_ms 0..100", o)
	}
	// ip full, g empty: refused, full named for ip only, nothing written to g.
	v = run(4, win{10, 1, 0, ""}, win{5, 1, 0, ""})
	if v[0] != 0 || v[3] != 0 || v[4] != 1 || v[8] != 0 || v[9] != 0 || v[10] != 5 || v[12] != -1 {
		t.Fatalf("one full window: %v", v)
	}
	if n := rdb.ZCard(ctx, g).Val(); n != 0 {
		t.Fatalf("refused call wrote %d slots to the other window", n)
	}
	if n := rdb.ZCard(ctx, ip).Val(); n != 10 {
		t.Fatalf("log holds %d, want exactly the limit 10", n)
	}
	// Give back only (need 0): answers allowed 0, full 0.
	v = run(5, win{10, 0, 0, "3:1:1:3"})
	if v[0] != 0 || v[4] != 0 || v[5] != 3 {
		t.Fatalf("give back only: %v", v)
	}
	for _, bad := range [][]any{
		{"i1", 1, 1, 0, 0, 2000, 1, 0, 0, 0, ""},        // limit 0
		{"i1", 1, 0, 0, 5, 2000, 1, 0, 0, 0, ""},        // live 0
		{"i1", 1, 1, 2, 5, 2000, 1, 0, 0, 0, ""},        // first not 0 or 1
		{"i1", 1, 1, 0, 5, 2000, 1, 0, 0, 0, "1:1:5:2"}, // reversed range
		{"i1", 1, 1, 0, 5},                              // short ARGV
	} {
		if err := RateLimit.Run(ctx, rdb, []string{prefix + "{rl:bad}:x"}, bad...).Err(); err == nil {
			t.Fatalf("malformed ARGV %v accepted", bad)
		}
	}
	if n := rdb.Exists(ctx, prefix+"{rl:bad}:x").Val(); n != 0 {
		t.Fatal("a rejected call wrote")
	}
	// Two windows, one with 2 free: both grant the 2 requests every window
	// can take, not more (no unspent slots in the roomier one).
	a, b := prefix+"{rl:a:2}:r", prefix+"{rl:a:2}:s"
	v, err = RateLimit.Run(ctx, rdb, []string{a, b}, "i1", 6, 1, 1, 2, 2000, 5, 0, 100, 500, "", 10, 2000, 5, 0, 100, 500, "").Int64Slice()
	servicetest.Must(t, err, "two windows")
	if v[0] != 1 || v[2] != 2 || v[3] != 2 || v[8] != 2 || v[10] != 8 {
		t.Fatalf("two windows, need 5, free 2 and 10: %v, want 2 admitted in each", v)
	}
	// first = 1: slot 1 is scored like the waiters' slots (now + short).
	if sc := rdb.ZScore(ctx, b, "i1:6:2:1").Val(); int64(sc) != v[1]+100_000 {
		t.Fatalf("first=1: slot 1 scored %d, want now+short %d", int64(sc), v[1]+100_000)
	}
	// Heartbeat: a second instance makes live 2.
	inst := prefix + "{rl}:instances"
	servicetest.Must(t, Instances.Run(ctx, rdb, []string{inst}, "i1", 3000).Err(), "heartbeat")
	n, err := Instances.Run(ctx, rdb, []string{inst}, "i2", 3000).Int64()
	servicetest.Must(t, err, "heartbeat")
	if n != 2 {
		t.Fatalf("live %d, want 2", n)
	}
}
