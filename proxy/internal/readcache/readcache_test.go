package readcache

import (
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
)

func TestActivityOf(t *testing.T) {
	for path, want := range map[string]int64{
		"/api/v1/activities/42":                  42,
		"/api/v1/activities/42/purchase":         0,
		"/api/v1/activities/":                    0,
		"/api/v1/activities/0042":                0,
		"/api/v1/activities/x":                   0,
		"/api/v1/orders/42-abc":                  0,
		"/api/v1/activities/9223372036854775807": 9223372036854775807,
		"/api/v1/activities/9223372036854775808": 0,
	} {
		if got, _ := ActivityOf([]byte(path)); got != want {
			t.Errorf("ActivityOf(%q) = %d, want %d", path, got, want)
		}
	}
}

func TestTTLPerRule(t *testing.T) {
	rules := []conf.Rule{
		{Name: "purchase", Methods: []string{"POST"}, PathPrefix: "/api/v1/activities/", ReadCacheTTL: conf.D(time.Second)},
		{Name: "orders", PathPrefix: "/api/v1/orders/"},
		{Name: "state", Methods: []string{"GET"}, PathPrefix: "/api/v1/activities/", ReadCacheTTL: conf.D(100 * time.Millisecond)},
	}
	c := New(rules, nil)
	for _, tc := range []struct {
		method, path string
		want         time.Duration
	}{
		{"GET", "/api/v1/activities/1", 100 * time.Millisecond},
		{"POST", "/api/v1/activities/1", 0},
		{"HEAD", "/api/v1/activities/1", 0},
		{"GET", "/api/v1/orders/1-x", 0},
		{"GET", "/other", 0},
	} {
		if got := c.TTL([]byte(tc.method), []byte(tc.path)); got != tc.want {
			t.Errorf("TTL(%s %s) = %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
	if c.SetRules(rules[:2]) || c.TTL([]byte("GET"), []byte("/api/v1/activities/1")) != 0 {
		t.Error("a reload without read-cache rules left the cache on")
	}
}
