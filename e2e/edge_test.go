package e2e

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
)

// shippedConfig is the repository's conf/seckill.toml, as an operator
// starts with it.
const shippedConfig = "../conf/seckill.toml"

func do(t *testing.T, c *http.Client, method, url string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader("{}"))
	servicetest.Must(t, err, "request")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	servicetest.Must(t, err, "%s %s", method, url)
	_ = resp.Body.Close()
	return resp
}

// With the shipped configuration the public listener forwards none of the
// backend's internal paths: the admin API, /metrics, /readyz, /healthz and
// /debug/ answer 404 from the proxy and the upstream sees not one of them.
// A rule allowing /admin/ for a trusted range lets exactly that range in.
func TestProxyKeepsInternalPathsInternal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bin/proxy")
	}
	t.Parallel()
	up := startRecorder(t)
	px := startProxyWith(t, up.addr, shippedConfig)
	c := &http.Client{Timeout: 5 * time.Second}
	base := "http://" + px.Addr
	for _, tc := range []struct{ method, path string }{
		{"PUT", "/admin/v1/activities/42"}, {"GET", "/metrics"}, {"GET", "/readyz"}, {"GET", "/healthz"},
		{"GET", "/debug/pprof/"}, {"PUT", "/Admin/v1/activities/42"}, {"GET", "/api/../metrics"},
	} {
		resp := do(t, c, tc.method, base+tc.path, "Authorization", "Bearer guess")
		if resp.StatusCode != 404 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("%s %s through the proxy: %d %s, want 404 problem+json", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	if n := up.hits.Load(); n != 0 {
		t.Fatalf("the upstream saw %d requests to internal paths", n)
	}
	if resp := do(t, c, "GET", base+"/api/v1/activities/42"); resp.StatusCode != 200 || up.hits.Load() != 1 {
		t.Fatalf("a public path: %d, upstream hits %d", resp.StatusCode, up.hits.Load())
	}

	// An operator's allow rule: /admin/ from 127.0.0.0/8 (this test's
	// range) passes, /metrics stays denied, and the same rule for another
	// range lets nothing in.
	dir := t.TempDir()
	allowed := filepath.Join(dir, "allowed.toml")
	servicetest.Must(t, writeFile(allowed, `
[[proxy.rules]]
name = "admin"
path_prefix = "/admin/"
allow_from = ["127.0.0.0/8"]
per_ip = { limit = 5, window = "1s" }
`), "config")
	other := filepath.Join(dir, "other.toml")
	servicetest.Must(t, writeFile(other, `
[[proxy.rules]]
name = "admin"
path_prefix = "/admin/"
allow_from = ["10.0.0.0/8"]
per_ip = { limit = 5, window = "1s" }
`), "config")
	pa, po := startProxyWith(t, up.addr, allowed), startProxyWith(t, up.addr, other)
	before := up.hits.Load()
	if resp := do(t, c, "PUT", "http://"+pa.Addr+"/admin/v1/activities/42"); resp.StatusCode != 200 {
		t.Errorf("admin from an allowed range: %d, want the upstream's 200", resp.StatusCode)
	}
	if resp := do(t, c, "GET", "http://"+pa.Addr+"/metrics"); resp.StatusCode != 404 {
		t.Errorf("/metrics with an /admin/ allow rule: %d, want 404", resp.StatusCode)
	}
	if resp := do(t, c, "PUT", "http://"+po.Addr+"/admin/v1/activities/42"); resp.StatusCode != 404 {
		t.Errorf("admin from outside the allowed range: %d, want 404", resp.StatusCode)
	}
	if n := up.hits.Load() - before; n != 1 {
		t.Errorf("%d requests reached the upstream, want the 1 allowed", n)
	}
	if m := get(t, "http://"+px.AdminAddr+"/metrics"); !strings.Contains(m, "seckill_proxy_denied_total 7") {
		t.Errorf("proxy /metrics does not count the 7 denied requests")
	}
}

// A client's X-User-ID never passes the proxy from an untrusted peer (the
// default: trusted_proxies empty), in whatever case or number it is sent.
func TestProxyDropsSpoofedUserID(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bin/proxy")
	}
	t.Parallel()
	up := startRecorder(t)
	px := startProxyWith(t, up.addr, shippedConfig)
	got := rawExchange(t, px.Addr, "POST /api/v1/activities/1/purchase HTTP/1.1\r\nHost: x\r\nX-User-ID: victim\r\nx-user-id: victim2\r\nX-USER-ID: victim3\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
	if !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("purchase through the proxy: %.60q", got)
	}
	up.mu.Lock()
	h := up.last
	up.mu.Unlock()
	if v := h.Values("X-User-Id"); len(v) != 0 {
		t.Fatalf("the upstream received X-User-ID %q from an untrusted client", v)
	}
}

// backendExit runs bin/backend with env and returns its exit code and log
// once it stops (it must, within the bound).
func backendExit(t *testing.T, dir, config string, env ...string) (int, string) {
	t.Helper()
	p := stack.NewProc(t, stack.Binary(t, "backend"), fmt.Sprintf("backend-%d", time.Now().UnixNano()), stack.FreeAddr(t), dir,
		append(envWithout("SECKILL_"), env...), "-config", config)
	p.Start(t)
	select {
	case <-p.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("the backend did not stop; log:\n%s", p.LogText())
	}
	return p.ExitCode(), p.LogText()
}

// The shipped configuration's sample token, compose's old default, a short
// token and a token file holding a sample each stop the backend at start
// with a message naming the key, before it touches any service; dev_mode
// lets the same tokens through.
func TestBackendRefusesPublishedAdminTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bin/backend")
	}
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	servicetest.Must(t, os.WriteFile(file, []byte("change-me\n"), 0o600), "token file")
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"shipped sample", nil, "backend.admin_token: is a default token"},
		{"compose default", []string{conf.EnvAdminToken + "=change-me"}, "backend.admin_token: is a default token"},
		{"short", []string{conf.EnvAdminToken + "=0123456789abcdef"}, "backend.admin_token: is 16 bytes, needs at least 32"},
		{"file with a sample", []string{conf.EnvAdminTokenFile + "=" + file}, "backend.admin_token_file: is a default token"},
	} {
		code, log := backendExit(t, dir, shippedConfig, tc.env...)
		if code == 0 || !strings.Contains(log, tc.want) || !strings.Contains(log, "dev_mode") {
			t.Errorf("%s: exit %d, log %q; want a failure naming %q", tc.name, code, log, tc.want)
		}
		if strings.Contains(log, "change-me") || strings.Contains(log, "0123456789abcdef") {
			t.Errorf("%s: the log shows the token: %s", tc.name, log)
		}
	}

	// dev_mode = true: the sample token serves the admin API.
	s := stack.New(t, stack.Options{Backends: 1, Config: "[backend]\ndev_mode = true\n",
		BackendEnv: map[int][]string{0: {conf.EnvAdminToken + "=change-me"}}})
	c := &http.Client{Timeout: 5 * time.Second}
	if resp := adminPut(t, c, s.Backends[0].URL(), 61, "change-me"); resp != 201 {
		t.Fatalf("dev_mode with the sample token: admin PUT %d, want 201", resp)
	}
}

func adminPut(t *testing.T, c *http.Client, base string, id int64, tok string) int {
	t.Helper()
	body := fmt.Sprintf(`{"stock":5,"per_user_limit":1,"starts_at":%q,"ends_at":%q}`,
		time.Now().Add(-time.Minute).UTC().Format(time.RFC3339), time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/admin/v1/activities/%d", base, id), strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := c.Do(req)
	servicetest.Must(t, err, "admin PUT")
	_ = resp.Body.Close()
	return resp.StatusCode
}

// admin_token_file: read at start, re-read on SIGHUP (the old token stops
// working, the new one works); a reload to a sample token is refused and
// the running token kept.
func TestAdminTokenFileReload(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bin/backend")
	}
	t.Parallel()
	file := filepath.Join(t.TempDir(), "admin-token")
	first, second := "first-"+strings.Repeat("a", 40), "second-"+strings.Repeat("b", 40)
	servicetest.Must(t, os.WriteFile(file, []byte(first+"\n"), 0o600), "token file")
	s := stack.New(t, stack.Options{Backends: 1,
		BackendEnv: map[int][]string{0: {conf.EnvAdminToken + "=", conf.EnvAdminTokenFile + "=" + file}}})
	b := s.Backends[0]
	c := &http.Client{Timeout: 5 * time.Second}
	if st := adminPut(t, c, b.URL(), 71, first); st != 201 {
		t.Fatalf("token from the file: %d, want 201", st)
	}
	servicetest.Must(t, os.WriteFile(file, []byte(second+"\n"), 0o600), "token file")
	b.Signal(t, syscall.SIGHUP)
	stack.WaitFor(t, "the reloaded token", 10*time.Second, func() bool { return adminPut(t, c, b.URL(), 71, second) == 200 })
	if st := adminPut(t, c, b.URL(), 71, first); st != 401 {
		t.Errorf("the replaced token after SIGHUP: %d, want 401", st)
	}
	servicetest.Must(t, os.WriteFile(file, []byte("dev-admin-token-change-me\n"), 0o600), "token file")
	b.Signal(t, syscall.SIGHUP)
	stack.WaitFor(t, "the rejected reload", 10*time.Second, func() bool {
		return strings.Contains(b.LogText(), "reload rejected, admin token kept")
	})
	if st := adminPut(t, c, b.URL(), 71, second); st != 200 {
		t.Errorf("the running token after a rejected reload: %d, want 200", st)
	}
	if st := adminPut(t, c, b.URL(), 71, "dev-admin-token-change-me"); st != 401 {
		t.Errorf("the refused sample token: %d, want 401", st)
	}
	for _, secret := range []string{first, second} {
		if strings.Contains(b.LogText(), secret) {
			t.Errorf("the backend log shows an admin token")
		}
	}
}

// The purchase proof through two proxies that take the buyer's identity
// from an RS256 JWT: every purchase carries its user's token and a forged
// X-User-ID; the sale must come out exactly as when the backend is asked
// directly (I1–I5), with every order under the token's user and none under
// a forged one.
func TestPurchaseWithJWTIdentityThroughProxies(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	servicetest.Must(t, err, "rsa key")
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	servicetest.Must(t, err, "public key")
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3})
	keyFile := filepath.Join(s.Dir, "jwt.pem")
	servicetest.Must(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644), "key file")
	config := fmt.Sprintf(`
[proxy.identity]
jwt = { alg = "RS256", key_file = %q, issuer = "https://shop.test", audience = "seckill", leeway = "5s" }
[[proxy.rules]]
name        = "purchase"
methods     = ["POST"]
path_prefix = "/api/v1/activities/"
require_jwt = true
per_ip      = { limit = 100000, window = "1s" }
`, keyFile)
	proxies := []*stack.Proc{s.StartProxy(t, "proxy-0", config), s.StartProxy(t, "proxy-1", config)}
	const id = 43
	sale := s.CreateSale(t, id, stock, limit)

	c := stack.NewCrowd(sale, nUsers, perUser, "jwt")
	tokens := map[string]string{}
	for _, a := range c.Attempts {
		if tokens[a.User] == "" {
			tok, err := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims{
				"sub": a.User, "iss": "https://shop.test", "aud": "seckill", "exp": time.Now().Add(time.Hour).Unix(),
			}).SignedString(key)
			servicetest.Must(t, err, "sign")
			tokens[a.User] = tok
		}
	}
	c.Prepare = func(req *http.Request, a *stack.Attempt) {
		req.Header.Set("Authorization", "Bearer "+tokens[a.User])
		req.Header.Set("X-User-ID", "forged-"+a.User)
	}
	c.Run(s, proxies)
	c.ExpectContract(t, false)
	accepted := c.Accepted()
	if len(accepted) == 0 {
		t.Fatal("no purchase was accepted")
	}
	s.Finish(t, "purchase with JWT identities through proxies", sale, c)

	var forged, jwtUsers int
	servicetest.Must(t, s.DB.QueryRow("SELECT COUNT(*) FROM orders WHERE activity_id = ? AND user_id LIKE 'forged-%'", id).Scan(&forged), "forged")
	servicetest.Must(t, s.DB.QueryRow("SELECT COUNT(*) FROM orders WHERE activity_id = ? AND user_id LIKE 'jwt-user-%'", id).Scan(&jwtUsers), "jwt users")
	if forged != 0 || jwtUsers == 0 {
		t.Errorf("orders under a forged X-User-ID: %d, under the token's user: %d", forged, jwtUsers)
	}
	// Without a token the proxies answer 401 and nothing is bought.
	resp := do(t, s.HTTP, "POST", proxies[0].URL()+fmt.Sprintf("/api/v1/activities/%d/purchase", id), "X-User-ID", "jwt-user-0001")
	if resp.StatusCode != 401 {
		t.Errorf("purchase without a token through the proxy: %d, want 401", resp.StatusCode)
	}
}
