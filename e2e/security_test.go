package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
)

// recorder is an upstream that remembers what reached it.
type recorder struct {
	hits atomic.Int64
	mu   sync.Mutex
	last http.Header
	srv  *http.Server
	addr string
}

func startRecorder(t *testing.T) *recorder {
	r := &recorder{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "listen")
	r.addr = ln.Addr().String()
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		r.hits.Add(1)
		_, _ = io.Copy(io.Discard, q.Body)
		r.mu.Lock()
		r.last = q.Header.Clone()
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	t.Cleanup(func() { _ = r.srv.Close() })
	return r
}

// startProxy runs bin/proxy in front of upstream with the default rules.
func startProxy(t *testing.T, upstream string, extraEnv ...string) *stack.Proc {
	t.Helper()
	config := t.TempDir() + "/proxy.toml"
	servicetest.Must(t, writeFile(config, "[proxy]\nread_timeout = \"2s\"\n"), "config")
	return startProxyWith(t, upstream, config, extraEnv...)
}

// startProxyWith runs bin/proxy with the config file at config.
func startProxyWith(t *testing.T, upstream, config string, extraEnv ...string) *stack.Proc {
	t.Helper()
	dir := t.TempDir()
	_, prefix := servicetest.Redis(t)
	env := append(append([]string{}, envWithout("SECKILL_")...),
		conf.EnvRedisURL+"="+servicetest.RedisURL(), conf.EnvRedisKeyPrefix+"="+prefix,
		conf.EnvProxyUpstreams+"=http://"+upstream)
	p := stack.NewProc(t, stack.Binary(t, "proxy"), "proxy", "", dir, append(env, extraEnv...), "-config", config).
		Serves(t, conf.EnvProxyListen, conf.EnvProxyAdminListen)
	p.Start(t)
	p.WaitReady(t, "/healthz")
	return p
}

// rawExchange writes req on a fresh connection and returns everything read
// until the proxy closes it or 2s pass.
func rawExchange(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	servicetest.Must(t, err, "dial proxy")
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	_, _ = c.Write([]byte(req))
	b, _ := io.ReadAll(bufio.NewReader(c))
	return string(b)
}

// Request smuggling: a request framed two ways (Content-Length and
// Transfer-Encoding, or two different Content-Lengths) is refused with 400
// by the proxy, and neither it nor the request hidden in its body reaches
// the upstream.
func TestProxyRejectsAmbiguousFraming(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bin/proxy")
	}
	t.Parallel()
	up := startRecorder(t)
	px := startProxy(t, up.addr)
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	cases := map[string]string{
		"CL and TE":             "POST /api/v1/activities/1/purchase HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"TE and CL":             "POST /api/v1/activities/1/purchase HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n" + smuggled,
		"two CLs":               "POST /api/v1/activities/1/purchase HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 38\r\n\r\n" + smuggled,
		"CL list":               "POST /api/v1/activities/1/purchase HTTP/1.1\r\nHost: x\r\nContent-Length: 0, 38\r\n\r\n" + smuggled,
		"TE obfuscated with CL": "POST /api/v1/activities/1/purchase HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + smuggled,
	}
	for name, req := range cases {
		got := rawExchange(t, px.Addr, req)
		if !strings.HasPrefix(got, "HTTP/1.1 400") {
			t.Errorf("%s: proxy answered %.80q, want 400", name, got)
		}
		if strings.Count(got, "HTTP/1.1 ") > 1 {
			t.Errorf("%s: the proxy answered more than one request: %q", name, got)
		}
	}
	if n := up.hits.Load(); n != 0 {
		t.Errorf("%d ambiguous requests reached the upstream", n)
	}
	// The control: a well-framed request does get through.
	if got := rawExchange(t, px.Addr, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("well-framed request: %.80q", got)
	}
}

// Forwarding headers. With trusted_proxies empty (the default) a
// client-supplied X-Forwarded-For is never taken as the client's address —
// the proxy keys on the peer and appends the peer as the rightmost
// X-Forwarded-For entry, the only entry an upstream may believe (docs/contract.md: appended).
// Rate limits keyed on the spoofed value are covered by proxy/internal/edge
// TestSpoofing; a client's X-User-ID by TestProxyDropsSpoofedUserID.
func TestProxyForwardedForFromUntrustedPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bin/proxy")
	}
	t.Parallel()
	up := startRecorder(t)
	px := startProxy(t, up.addr)
	req, _ := http.NewRequest(http.MethodGet, "http://"+px.Addr+"/api/v1/orders/1-x", nil)
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	resp, err := http.DefaultClient.Do(req)
	servicetest.Must(t, err, "request")
	_ = resp.Body.Close()
	up.mu.Lock()
	xff := up.last.Get("X-Forwarded-For")
	up.mu.Unlock()
	parts := strings.Split(xff, ",")
	if last := strings.TrimSpace(parts[len(parts)-1]); last != "127.0.0.1" {
		t.Fatalf("upstream X-Forwarded-For %q: the rightmost entry must be the proxy's peer 127.0.0.1", xff)
	}
}

// Secrets: neither the admin token nor the AMQP password shows in any log
// line or /metrics of the backend, the worker and the proxy — also when the
// broker refuses the password and when admin requests carry wrong tokens.
func TestSecretsStayOutOfLogsAndMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binaries")
	}
	t.Parallel()
	s := stack.New(t, stack.Options{Backends: 1, Workers: 1})
	sale := s.CreateSale(t, 77, 10, 1)
	_ = sale
	c := &http.Client{Timeout: 5 * time.Second}
	for _, tok := range []string{"wrong", stack.AdminToken + "x", stack.AdminToken[:5]} {
		req, _ := http.NewRequest(http.MethodPut, s.Backends[0].URL()+"/admin/v1/activities/77", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := c.Do(req)
		servicetest.Must(t, err, "admin request")
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("admin request with a wrong token: %d, want 401", resp.StatusCode)
		}
	}
	// A worker whose broker password is refused logs the failure.
	const password = "Wr0ng-AMQP-Pa55"
	bad := stack.NewProc(t, stack.Binary(t, "worker"), "worker-badpass", stack.FreeAddr(t), s.Dir,
		append(append([]string{}, s.Env...), conf.EnvAMQPURL+"=amqp://guest:"+password+"@127.0.0.1:5672/"),
		"-config", s.ConfigPath)
	bad.Start(t, conf.EnvWorkerListen+"="+bad.Addr)
	select {
	case <-bad.Exited():
	case <-time.After(5 * time.Second):
		_ = bad.Stop(5 * time.Second)
	}
	if !strings.Contains(bad.LogText(), "guest") && !strings.Contains(strings.ToLower(bad.LogText()), "amqp") {
		t.Errorf("the worker with a refused password logged nothing about the broker:\n%s", bad.LogText())
	}
	px := startProxy(t, s.Backends[0].Addr, conf.EnvAdminToken+"="+stack.AdminToken)

	secrets := []string{stack.AdminToken, password, "guest:guest"}
	for _, p := range []*stack.Proc{s.Backends[0], s.Workers[0]} {
		check(t, p.Name+" /metrics", get(t, p.URL()+"/metrics"), secrets)
	}
	check(t, "proxy /metrics", get(t, "http://"+px.AdminAddr+"/metrics"), secrets)
	for _, p := range []*stack.Proc{s.Backends[0], s.Workers[0], bad, px} {
		check(t, p.Name+" log", p.LogText(), secrets)
	}
}

func writeFile(path, text string) error { return os.WriteFile(path, []byte(text), 0o644) }

// envWithout is the environment minus variables starting with prefix.
func envWithout(prefix string) []string {
	var out []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, prefix) {
			out = append(out, e)
		}
	}
	return out
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	servicetest.Must(t, err, "GET %s", url)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || len(b) == 0 {
		t.Fatalf("GET %s: %d, %d bytes", url, resp.StatusCode, len(b))
	}
	return string(b)
}

func check(t *testing.T, what, text string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s contains the secret %q", what, s)
		}
	}
}
