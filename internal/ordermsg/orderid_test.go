package ordermsg

import "testing"

// TestOrderIDShards: both forms parse back to their activity and shard, and
// non-canonical shard numbers are refused (one id per order).
func TestOrderIDShards(t *testing.T) {
	for _, k := range []int{0, 1, 9, 63} {
		oid := NewShardOrderID(42, k)
		id, shard, err := Parse(oid)
		if err != nil || id != 42 || shard != k {
			t.Errorf("Parse(%q) = %d, %d, %v; want 42, %d", oid, id, shard, err, k)
		}
		if err := (Order{V: Version, OrderID: oid, ActivityID: 42, UserID: "u", Quantity: 1}).Validate(); err != nil {
			t.Errorf("Validate %s: %v", oid, err)
		}
	}
	if NewOrderID(42)[:3] != "42-" {
		t.Errorf("shard 0 keeps the unsharded form: %s", NewOrderID(42))
	}
	tail := NewOrderID(1)[2:]
	for _, bad := range []string{"42.0-" + tail, "42.01-" + tail, "42.64-" + tail, "42.+1-" + tail,
		"42.-" + tail, ".3-" + tail, "42.3.4-" + tail, "042.3-" + tail, "42.x-" + tail} {
		if _, _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
