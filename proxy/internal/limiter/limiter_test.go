package limiter

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

func TestMatch(t *testing.T) {
	rs, err := Compile([]conf.Rule{
		{Name: "buy", Methods: []string{"POST"}, PathPrefix: "/api/v1/activities/", PerIP: &conf.Window{Limit: 1, Window: conf.D(time.Second)}},
		{Name: "api", PathPrefix: "/api/", Global: &conf.Window{Limit: 1, Window: conf.D(time.Second)}},
	}, "p:", nil)
	servicetest.Must(t, err, "compile")
	for _, tc := range []struct {
		method, path string
		want         int
	}{{"POST", "/api/v1/activities/1/purchase", 2}, {"GET", "/api/v1/activities/1", 1}, {"GET", "/other", 0}} {
		if got := len(rs.Match(nil, []byte(tc.method), []byte(tc.path))); got != tc.want {
			t.Errorf("%s %s: %d rules, want %d", tc.method, tc.path, got, tc.want)
		}
	}
	if _, err := Compile([]conf.Rule{{Name: "x", PathPrefix: "/"}}, "", nil); err == nil {
		t.Error("rule without windows compiled")
	}
}

// BenchmarkCheckLeased: the hot path once leases are warm (one client, limits
// that never trigger): no Redis round trip for most requests.
func BenchmarkCheckLeased(b *testing.B) {
	rdb, prefix := servicetest.Redis(b)
	m := NewMetrics(prometheus.NewRegistry())
	rs, err := Compile([]conf.Rule{{Name: "b", PathPrefix: "/",
		PerIP:  &conf.Window{Limit: 10_000_000, Window: conf.D(time.Second)},
		Global: &conf.Window{Limit: 10_000_000, Window: conf.D(time.Second)}}}, prefix, m)
	servicetest.Must(b, err, "compile")
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: 50 * time.Millisecond, Instance: "bench", Metrics: m})
	req := Request{Method: []byte("GET"), Path: []byte("/x"), Addr: []byte("127.0.0.1")}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var d Decision
		for pb.Next() {
			d.Reset()
			l.Check(rs, req, &d)
			if d.Outcome != Admit {
				b.Fatal("limited")
			}
		}
	})
	b.ReportMetric(float64(m.Calls())/float64(b.N), "redis-calls/op")
}
