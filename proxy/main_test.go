package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/servicetest"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "listen")
	defer ln.Close()
	return ln.Addr().String()
}

func writeConfig(t *testing.T, path, prefix, listen, admin, up string, limit int, broken bool) {
	doc := fmt.Sprintf(`
[redis]
key_prefix = %q
[proxy]
listen = %q
admin_listen = %q
upstreams = ["http://%s"]
[[proxy.rules]]
name = "r"
path_prefix = "/"
per_ip = { limit = %d, window = "30s" }
`, prefix, listen, admin, up, limit)
	if broken {
		doc += "per_ip_typo = 1\n"
	}
	servicetest.Must(t, os.WriteFile(path, []byte(doc), 0o600), "write config")
}

// Reload: SIGHUP with a new limit takes effect; with a broken file the running
// rules keep working. Also: the admin endpoints live on their own listener.
func TestRunReload(t *testing.T) {
	_, prefix := servicetest.Redis(t)
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }}
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "listen")
	go func() { _ = up.Serve(uln) }()
	defer up.Shutdown()

	path := filepath.Join(t.TempDir(), "seckill.toml")
	listen, admin := freeAddr(t), freeAddr(t)
	writeConfig(t, path, prefix, listen, admin, uln.Addr().String(), 2, false)
	env := func(k string) string {
		if k == "SECKILL_REDIS_URL" {
			return servicetest.RedisURL()
		}
		return ""
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-config", path}, env, io.Discard, io.Discard) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	c := &fasthttp.Client{}
	for i := 0; ; i++ {
		if s, _, err := c.Get(nil, "http://"+admin+"/readyz"); err == nil && s == 200 {
			break
		}
		if i > 200 {
			t.Fatal("proxy did not become ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s, _, _ := c.Get(nil, "http://"+listen+"/healthz"); s != 200 {
		t.Fatalf("forwarded /healthz: %d (upstream path must not be shadowed)", s)
	}
	count := func(n int) (ok int) {
		for i := 0; i < n; i++ {
			s, _, err := c.Get(nil, "http://"+listen+"/x")
			servicetest.Must(t, err, "get")
			if s == 200 {
				ok++
			}
		}
		return ok
	}
	if ok := count(4); ok != 1 { // one of the 2 slots went to /healthz above
		t.Fatalf("limit 2: %d admitted after /healthz, want 1", ok)
	}
	hup := func() {
		servicetest.Must(t, syscall.Kill(os.Getpid(), syscall.SIGHUP), "sighup")
		time.Sleep(300 * time.Millisecond)
	}
	writeConfig(t, path, prefix, listen, admin, uln.Addr().String(), 5, false)
	hup()
	if ok := count(5); ok != 3 {
		t.Fatalf("after reload to 5: %d admitted, want 3", ok)
	}
	writeConfig(t, path, prefix, listen, admin, uln.Addr().String(), 100, true)
	hup()
	if ok := count(3); ok != 0 {
		t.Fatalf("broken file must keep limit 5: %d admitted", ok)
	}
	if s, body, _ := c.Get(nil, "http://"+admin+"/metrics"); s != 200 || len(body) == 0 {
		t.Fatalf("metrics: %d", s)
	}
}
