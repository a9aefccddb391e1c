package ordermsg

import "testing"

// TestOrderIDShards: both forms parse back to their activity, shard and
// shard count, and non-canonical or impossible shards are refused (one id
// per order).
func TestOrderIDShards(t *testing.T) {
	for _, c := range []struct{ k, n, wantN int }{{0, 1, 0}, {0, 8, 0}, {1, 2, 2}, {9, 16, 16}, {63, 64, 64}} {
		oid := NewShardOrderID(42, c.k, c.n)
		id, shard, shards, err := Parse(oid)
		if err != nil || id != 42 || shard != c.k || shards != c.wantN {
			t.Errorf("Parse(%q) = %d, %d, %d, %v; want 42, %d, %d", oid, id, shard, shards, err, c.k, c.wantN)
		}
		if err := (Order{V: Version, OrderID: oid, ActivityID: 42, UserID: "u", Quantity: 1}).Validate(); err != nil {
			t.Errorf("Validate %s: %v", oid, err)
		}
	}
	if NewOrderID(42)[:3] != "42-" || NewShardOrderID(42, 0, 8)[:3] != "42-" {
		t.Errorf("shard 0 keeps the unsharded form")
	}
	tail := NewOrderID(1)[2:]
	for _, bad := range []string{"42.0.8-" + tail, "42.01.8-" + tail, "42.8.8-" + tail, "42.9.8-" + tail, "42.1.65-" + tail,
		"42.+1.2-" + tail, "42.1-" + tail, "42.1.-" + tail, ".1.2-" + tail, "42.1.2.3-" + tail, "042.1.2-" + tail,
		"42.x.2-" + tail, "42.1.02-" + tail, "42.100.200-" + tail} {
		if _, _, _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
