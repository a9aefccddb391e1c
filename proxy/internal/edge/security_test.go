package edge

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/seckill/seckill/conf"
)

// Internal paths: with the default deny list, the backend's admin API and
// every operational endpoint are 404 at the edge in all their spellings,
// and the upstream sees none of them; a rule allowing a trusted range lets
// that range (and only it) through.
func TestDenyPrefixes(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	cfg.Proxy.Rules = []conf.Rule{rule("api", 1000, 0, time.Second)}
	px := startProxy(t, cfg)
	c := client(px.addr)

	for _, tc := range []struct{ method, path string }{
		{"PUT", "/admin/v1/activities/1"}, {"GET", "/admin/v1/activities/1"}, {"GET", "/admin"},
		{"GET", "/metrics"}, {"GET", "/readyz"}, {"GET", "/healthz"}, {"GET", "/debug/pprof/"},
		{"GET", "/ADMIN/v1/activities/1"}, {"GET", "/Metrics"}, {"GET", "/readyz?x=1"}, {"GET", "/metrics/x"},
	} {
		resp := get(t, c, tc.method, tc.path)
		if resp.StatusCode() != 404 || !strings.Contains(string(resp.Header.ContentType()), "problem+json") {
			t.Errorf("%s %s: %d %s, want 404 problem+json", tc.method, tc.path, resp.StatusCode(), resp.Header.ContentType())
		}
	}
	// Spellings that normalize to a denied path, sent raw so no client
	// cleans them first.
	for _, uri := range []string{"//admin/v1/activities/1", "/api/../admin/v1/activities/1", "/%61dmin/v1/activities/1",
		"/./metrics", "/readyz/", "http://x/admin/v1/activities/1", "/api/v1/..%2f..%2fadmin/v1",
		"/admin;jsessionid=1/v1/activities/1", "/api/..;/admin/v1/activities/1", "/api/v1/%2e%2e/..;/metrics"} {
		got := raw(t, px.addr, "GET "+uri+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 2*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 404") {
			t.Errorf("GET %s: %.60q, want 404", uri, got)
		}
	}
	if n := up.hits.Load(); n != 0 {
		t.Fatalf("the upstream saw %d denied requests", n)
	}
	if n := counted(px.p.Handler.Security.Denied); n != 21 {
		t.Errorf("denied counter %d, want 21", n)
	}
	// The control: other paths are forwarded.
	if s := get(t, c, "GET", "/api/v1/activities/1").StatusCode(); s != 200 || up.hits.Load() != 1 {
		t.Fatalf("an ordinary path: %d, %d upstream hits", s, up.hits.Load())
	}

	// An allow rule for the proxy's own range (the test client is 127.0.0.1),
	// another that allows a range the client is not in, and one for GET only.
	allow := func(name, prefix string, methods []string, cidrs ...string) conf.Rule {
		r := rule(name, 100, 0, time.Second)
		r.PathPrefix, r.Methods, r.AllowFrom = prefix, methods, cidrs
		return r
	}
	cfg2 := baseConfig(t, up.addr)
	cfg2.Proxy.Rules = []conf.Rule{
		allow("admin", "/admin/", []string{"PUT"}, "127.0.0.0/8"),
		allow("metrics", "/metrics", nil, "10.0.0.0/8"),
		allow("ready", "/readyz", []string{"GET"}, "::1/128", "127.0.0.1/32"),
	}
	px2 := startProxy(t, cfg2)
	c2 := client(px2.addr)
	before := up.hits.Load()
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"PUT", "/admin/v1/activities/1", 200},
		{"GET", "/admin/v1/activities/1", 404}, // the rule allows PUT only
		{"GET", "/metrics", 404},               // allowed for 10/8 only
		{"GET", "/readyz", 200},
		{"POST", "/readyz", 404},
		{"GET", "/healthz", 404}, // no rule
	} {
		if s := get(t, c2, tc.method, tc.path).StatusCode(); s != tc.want {
			t.Errorf("allow rules: %s %s = %d, want %d", tc.method, tc.path, s, tc.want)
		}
	}
	if n := up.hits.Load() - before; n != 2 {
		t.Errorf("allow rules: %d requests reached the upstream, want the 2 allowed", n)
	}

	// Behind a trusted proxy the source is the forwarded client address.
	cfg3 := baseConfig(t, up.addr)
	cfg3.Proxy.TrustedProxies = []string{"127.0.0.1/32"}
	cfg3.Proxy.Rules = []conf.Rule{allow("admin", "/admin/", nil, "10.0.0.0/8")}
	px3 := startProxy(t, cfg3)
	c3 := client(px3.addr)
	if s := get(t, c3, "PUT", "/admin/v1/activities/1", "X-Forwarded-For", "10.1.2.3").StatusCode(); s != 200 {
		t.Errorf("admin from 10.1.2.3 via a trusted proxy: %d, want 200", s)
	}
	for _, xff := range []string{"203.0.113.9", "10.1.2.3, 203.0.113.9", ""} {
		if s := get(t, c3, "PUT", "/admin/v1/activities/1", "X-Forwarded-For", xff).StatusCode(); s != 404 {
			t.Errorf("admin with X-Forwarded-For %q: %d, want 404", xff, s)
		}
	}
}

// X-User-ID: a client's own header never passes an untrusted peer, in any
// case of its name and however often sent; a trusted proxy's passes.
func TestUserIDFromUntrustedPeerIsDropped(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	cfg.Proxy.Rules = []conf.Rule{rule("api", 1000, 0, time.Second)}
	px := startProxy(t, cfg)
	c := client(px.addr)
	get(t, c, "POST", "/api/v1/activities/1/purchase", "X-User-ID", "victim", "x-user-id", "victim2")
	if h := strings.ToLower(*up.last.Load()); strings.Contains(h, "x-user-id") || strings.Contains(h, "victim") {
		t.Fatalf("a spoofed X-User-ID reached the upstream:\n%s", h)
	}
	got := raw(t, px.addr, "POST /api/v1/activities/1/purchase HTTP/1.1\r\nHost: x\r\nX-USER-ID: victim3\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 2*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 200") || strings.Contains(strings.ToLower(*up.last.Load()), "victim") {
		t.Fatalf("raw X-USER-ID: %.40q, upstream saw:\n%s", got, *up.last.Load())
	}
	if n := counted(px.p.Handler.Security.Spoofed); n != 2 {
		t.Errorf("stripped counter %d, want 2", n)
	}

	cfg2 := baseConfig(t, up.addr)
	cfg2.Proxy.TrustedProxies = []string{"127.0.0.0/8"}
	cfg2.Proxy.Rules = []conf.Rule{rule("api", 1000, 0, time.Second)}
	px2 := startProxy(t, cfg2)
	get(t, client(px2.addr), "GET", "/api/v1/orders/1", "X-User-ID", "from-auth-layer")
	if h := *up.last.Load(); !strings.Contains(h, "from-auth-layer") {
		t.Fatalf("a trusted peer's X-User-ID was dropped:\n%s", h)
	}
}

func writeSecret(t *testing.T, secret string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "jwt.key")
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func hsToken(t *testing.T, secret, sub string, exp time.Time) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "iss": "shop", "exp": exp.Unix()}).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// JWT identity at the edge: a rule that requires a token answers 401
// without a valid one (nothing forwarded); a valid token's claim replaces
// whatever X-User-ID the client sent; a reload rotates the key.
func TestJWTIdentity(t *testing.T) {
	t.Parallel()
	const secret = "jwt-secret-for-the-edge-test-0123456789"
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	cfg.Proxy.Identity.JWT = &conf.JWT{Header: "Authorization", Alg: "HS256", KeyFile: writeSecret(t, secret), Claim: "sub", Issuer: "shop"}
	purchase := rule("purchase", 1000, 0, time.Second)
	purchase.PathPrefix, purchase.Methods, purchase.RequireJWT = "/api/v1/activities/", []string{"POST"}, true
	cfg.Proxy.Rules = []conf.Rule{purchase, rule("any", 1000, 0, time.Second)}
	px := startProxy(t, cfg)
	c := client(px.addr)
	const path = "/api/v1/activities/1/purchase"
	good := hsToken(t, secret, "alice", time.Now().Add(time.Hour))

	resp := get(t, c, "POST", path, "Authorization", "Bearer "+good, "X-User-ID", "mallory")
	if resp.StatusCode() != 200 {
		t.Fatalf("valid token: %d %s", resp.StatusCode(), resp.Body())
	}
	if h := *up.last.Load(); !strings.Contains(h, "X-User-Id: alice\r\n") || strings.Contains(h, "mallory") {
		t.Fatalf("upstream headers for a valid token:\n%s", h)
	}
	hits := up.hits.Load()
	for name, hdr := range map[string][]string{
		"no token":      {"X-User-ID", "alice"},
		"expired":       {"Authorization", "Bearer " + hsToken(t, secret, "alice", time.Now().Add(-time.Hour))},
		"wrong secret":  {"Authorization", "Bearer " + hsToken(t, "another-secret-another-secret-0123", "alice", time.Now().Add(time.Hour))},
		"garbage":       {"Authorization", "Bearer not.a.jwt"},
		"basic scheme":  {"Authorization", "Basic YWxpY2U6cHc="},
		"token in body": {"Content-Type", "application/json"},
	} {
		resp := get(t, c, "POST", path, hdr...)
		var body struct {
			Status int    `json:"status"`
			Code   string `json:"code"`
		}
		_ = json.Unmarshal(resp.Body(), &body)
		if resp.StatusCode() != 401 || body.Status != 401 || body.Code != "unauthorized" ||
			!strings.Contains(string(resp.Header.ContentType()), "problem+json") ||
			!strings.HasPrefix(string(resp.Header.Peek("WWW-Authenticate")), "Bearer") {
			t.Errorf("%s: %d %s %s (WWW-Authenticate %q), want a 401 problem", name, resp.StatusCode(), resp.Header.ContentType(), resp.Body(), resp.Header.Peek("WWW-Authenticate"))
		}
	}
	if n := up.hits.Load() - hits; n != 0 {
		t.Fatalf("%d requests without a valid token reached the upstream", n)
	}
	// A path whose rules do not require a token is forwarded; an invalid
	// token there gives no identity.
	get(t, c, "GET", "/api/v1/orders/1", "Authorization", "Bearer not.a.jwt", "X-User-ID", "mallory")
	if h := *up.last.Load(); strings.Contains(strings.ToLower(h), "x-user-id") {
		t.Fatalf("optional path with an invalid token carried an identity:\n%s", h)
	}
	get(t, c, "GET", "/api/v1/orders/1", "Authorization", "Bearer "+good)
	if h := *up.last.Load(); !strings.Contains(h, "X-User-Id: alice\r\n") {
		t.Fatalf("optional path with a valid token:\n%s", h)
	}
	m := px.p.Handler.Security.JWT
	if counted(m.Valid) != 2 || counted(m.Refused) != 6 {
		t.Errorf("jwt counters valid=%d refused=%d, want 2 and 6", counted(m.Valid), counted(m.Refused))
	}

	// Key rotation on reload: the old key's tokens stop working.
	const next = "the-rotated-jwt-secret-0123456789abcdef"
	cfg.Proxy.Identity.JWT.KeyFile = writeSecret(t, next)
	if err := px.p.Reload(cfg.Proxy); err != nil {
		t.Fatal(err)
	}
	if s := get(t, c, "POST", path, "Authorization", "Bearer "+good).StatusCode(); s != 401 {
		t.Errorf("old key after rotation: %d, want 401", s)
	}
	if s := get(t, c, "POST", path, "Authorization", "Bearer "+hsToken(t, next, "alice", time.Now().Add(time.Hour))).StatusCode(); s != 200 {
		t.Errorf("new key after rotation: %d, want 200", s)
	}
	// A reload whose key cannot be read keeps the running gate.
	bad := cfg.Proxy
	bad.Identity.JWT = &conf.JWT{Header: "Authorization", Alg: "HS256", KeyFile: filepath.Join(t.TempDir(), "missing"), Claim: "sub"}
	if err := px.p.Reload(bad); err == nil || !strings.Contains(err.Error(), "key_file") {
		t.Fatalf("reload with a missing key: %v", err)
	}
	if s := get(t, c, "POST", path, "Authorization", "Bearer "+hsToken(t, next, "bob", time.Now().Add(time.Hour))).StatusCode(); s != 200 {
		t.Errorf("after a rejected reload: %d, want 200", s)
	}
}

// BenchmarkServeNoGate is BenchmarkServe without a deny list: the baseline
// of the gate's cost (BenchmarkServe runs the default deny list and the
// X-User-ID check).
func BenchmarkServeNoGate(b *testing.B) {
	benchProxyWith(b, 10_000_000, time.Second, 200, func(c *conf.Config) { c.Proxy.DenyPrefixes = nil })
}

// BenchmarkServeJWT verifies an HS256 token on every request of a rule
// that requires one (the claim set as X-User-ID, then limits and forwarding).
func BenchmarkServeJWT(b *testing.B) {
	const secret = "bench-jwt-secret-0123456789abcdefghij"
	dir := b.TempDir()
	key := filepath.Join(dir, "k")
	if err := os.WriteFile(key, []byte(secret), 0o600); err != nil {
		b.Fatal(err)
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "bench-user", "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(secret))
	if err != nil {
		b.Fatal(err)
	}
	benchProxyWith(b, 10_000_000, time.Second, 200, func(c *conf.Config) {
		c.Proxy.Identity.JWT = &conf.JWT{Alg: "HS256", KeyFile: key}
		c.Proxy.Rules[0].RequireJWT = true
	}, "Authorization", "Bearer "+tok)
}

// counted is a counter's value.
func counted(c prometheus.Counter) int {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return int(m.GetCounter().GetValue())
}

// Keyed windows count by a header or cookie only when someone vouches for
// its value: a trusted peer (TestKeyedWindows), or the proxy's own JWT
// verification for the X-User-ID it set and the token's header. From an
// untrusted peer a made-up value per request counts by the address, and so
// does any other header of a verified request.
func TestKeyedWindowsNeedVouching(t *testing.T) {
	t.Parallel()
	const secret = "jwt-secret-for-the-keyed-window-test-0123"
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr) // no trusted proxies: the test's peer is not one
	cfg.Proxy.RedisTimeout = conf.D(2 * time.Second)
	cfg.Proxy.Identity.JWT = &conf.JWT{Header: "Authorization", Alg: "HS256", KeyFile: writeSecret(t, secret), Claim: "sub", Issuer: "shop"}
	keyed := func(name, prefix, key string, limit int) conf.Rule {
		r := rule(name, limit, 0, 10*time.Second)
		r.PathPrefix, r.PerIP.Key = prefix, key
		return r
	}
	cfg.Proxy.Rules = []conf.Rule{
		keyed("apikey", "/apikey/", "header:X-Api-Key", 3),
		keyed("user", "/user/", "header:X-User-ID", 2),
		keyed("token", "/token/", "header:Authorization", 2),
	}
	px := startProxy(t, cfg)
	c := client(px.addr)
	admitted := func(n int, path string, hdr func(i int) []string) int {
		ok := 0
		for i := range n {
			r := get(t, c, "GET", path, hdr(i)...)
			switch r.StatusCode() {
			case 200:
				ok++
			case 429:
			default:
				t.Fatalf("%s: %d %s", path, r.StatusCode(), r.Body())
			}
		}
		return ok
	}
	alice, bob := hsToken(t, secret, "alice", time.Now().Add(time.Hour)), hsToken(t, secret, "bob", time.Now().Add(time.Hour))
	// A new X-Api-Key per request from an untrusted peer: the address's 3.
	if n := admitted(8, "/apikey/x", func(i int) []string { return []string{"X-Api-Key", fmt.Sprint("made-up-", i)} }); n != 3 {
		t.Fatalf("made-up X-Api-Key values from an untrusted peer: %d admitted, want 3 (counted by the address)", n)
	}
	// ... and with a verified token too: the token vouches for X-User-ID,
	// not for X-Api-Key (the address's window is spent).
	if n := admitted(3, "/apikey/x", func(i int) []string {
		return []string{"Authorization", "Bearer " + alice, "X-Api-Key", fmt.Sprint("other-", i)}
	}); n != 0 {
		t.Fatalf("made-up X-Api-Key with a verified token: %d admitted, want 0 (the address's window)", n)
	}
	// Verified users: each their own window of 2, from one address.
	for _, tok := range []string{alice, bob} {
		if n := admitted(4, "/user/x", func(int) []string { return []string{"Authorization", "Bearer " + tok} }); n != 2 {
			t.Fatalf("verified user: %d admitted, want 2 (its own window)", n)
		}
	}
	// No token: a client-sent X-User-ID is dropped; the address counts.
	if n := admitted(4, "/user/x", func(i int) []string { return []string{"X-User-ID", fmt.Sprint("mallory-", i)} }); n != 2 {
		t.Fatalf("client-sent X-User-IDs without a token: %d admitted, want 2 (the address's window)", n)
	}
	// The token's own header is vouched for once it verified; an invalid
	// one is not (counted by the address).
	if n := admitted(3, "/token/x", func(int) []string { return []string{"Authorization", "Bearer " + alice} }); n != 2 {
		t.Fatalf("verified token: %d admitted, want 2", n)
	}
	if n := admitted(4, "/token/x", func(i int) []string { return []string{"Authorization", fmt.Sprint("Bearer not.a.jwt", i)} }); n != 2 {
		t.Fatalf("invalid tokens: %d admitted, want 2 (the address's window)", n)
	}
}
