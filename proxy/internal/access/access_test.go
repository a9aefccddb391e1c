package access

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/seckill/seckill/conf"
)

func TestPolicy(t *testing.T) {
	rules := []conf.Rule{
		{Name: "admin", PathPrefix: "/admin/", Methods: []string{"PUT"}, RuleAccess: conf.RuleAccess{AllowFrom: []string{"10.0.0.0/8", "2001:db8::/32"}}},
		{Name: "buy", PathPrefix: "/api/v1/activities/", Methods: []string{"POST"}, RuleAccess: conf.RuleAccess{RequireJWT: true}},
		{Name: "plain", PathPrefix: "/"},
	}
	p, err := Compile(conf.DefaultDenyPrefixes(), rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path   string
		denied bool
	}{
		{"/admin/v1/activities/1", true}, {"/admin", true}, {"/admin/", true}, {"/ADMIN/x", true}, {"/Admin", true},
		{"/metrics", true}, {"/metricsx", true}, {"/readyz", true}, {"/healthz", true}, {"/debug/pprof", true}, {"/debug", true},
		{"/admin;jsessionid=1/v1", true}, {"/api/..;/admin/v1", true}, {"/api/v1/..;/..;/metrics", true}, {"/admin\\v1", true},
		{"/x;/readyz", false}, {"/api;x/v1/activities/1", false}, {"/debug;x", true},
		{"/adminx", false}, {"/admi", false}, {"/api/v1/metrics", false}, {"/", false}, {"", false}, {"/debugger", false},
	} {
		if got := p.Denied([]byte(tc.path)); got != tc.denied {
			t.Errorf("Denied(%q) = %v", tc.path, got)
		}
	}
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		method, path, client string
		want                 bool
	}{
		{"PUT", "/admin/v1/activities/1", "10.1.2.3", true},
		{"PUT", "/admin/v1/activities/1", "::ffff:10.1.2.3", true},
		{"PUT", "/admin/v1/activities/1", "2001:db8::1", true},
		{"PUT", "/admin/v1/activities/1", "11.0.0.1", false},
		{"GET", "/admin/v1/activities/1", "10.1.2.3", false},
		{"PUT", "/metrics", "10.1.2.3", false},
		{"PUT", "/ADMIN/v1/activities/1", "10.1.2.3", false},
	} {
		if got := p.Allowed([]byte(tc.method), []byte(tc.path), ip(tc.client)); got != tc.want {
			t.Errorf("Allowed(%s %s from %s) = %v", tc.method, tc.path, tc.client, got)
		}
	}
	if !p.RequireJWT([]byte("POST"), []byte("/api/v1/activities/1/purchase")) || p.RequireJWT([]byte("GET"), []byte("/api/v1/activities/1")) ||
		p.RequireJWT([]byte("POST"), []byte("/api/v1/orders")) {
		t.Error("RequireJWT does not follow the rules' methods and prefixes")
	}
	if _, err := Compile([]string{"admin"}, nil); err == nil {
		t.Error("a relative deny prefix compiled")
	}
	none, _ := Compile(nil, nil)
	if none.Denied([]byte("/admin/")) {
		t.Error("an empty deny list denies")
	}
}

// FuzzDenied: a path denied as sent stays denied in any ASCII case, and
// Denied never panics.
func FuzzDenied(f *testing.F) {
	p, err := Compile(conf.DefaultDenyPrefixes(), nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"/admin/", "/api/..;/admin", "/a\\b", ";", "/..;/..;/", "/metrics;x"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, path []byte) {
		d := p.Denied(path)
		if d != p.Denied(bytes.ToUpper(path)) || d != p.Denied(bytes.ToLower(path)) {
			t.Fatalf("Denied(%q) depends on case", path)
		}
		if l := lenient(path); len(l) == 0 || l[0] != '/' {
			t.Fatalf("lenient(%q) = %q", path, l)
		}
	})
}
