package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
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

func writeConfig(t *testing.T, path, prefix, listen, admin, up string, limit int, broken bool, proxyKeys ...string) {
	doc := fmt.Sprintf(`
[redis]
key_prefix = %q
[proxy]
listen = %q
admin_listen = %q
upstreams = ["http://%s"]
`+strings.Join(proxyKeys, "\n")+`
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

// Reload: SIGHUP with a new limit or deny list takes effect; with a broken
// file the running rules keep working. Also: the admin endpoints live on
// their own listener, and the same paths on the forwarding one are denied
// (the default deny_prefixes) without taking a limiter slot.
func TestRunReload(t *testing.T) {
	_, prefix := servicetest.Redis(t)
	up := servicetest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }})

	path := filepath.Join(t.TempDir(), "seckill.toml")
	listen, admin := freeAddr(t), freeAddr(t)
	writeConfig(t, path, prefix, listen, admin, up, 2, false)
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
	if s, body, _ := c.Get(nil, "http://"+listen+"/healthz"); s != 404 || !strings.Contains(string(body), "not-found") {
		t.Fatalf("/healthz on the forwarding listener: %d %s, want the edge's 404", s, body)
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
	if ok := count(4); ok != 2 { // the denied /healthz took no slot
		t.Fatalf("limit 2: %d admitted after /healthz, want 2", ok)
	}
	hup := func() {
		servicetest.Must(t, syscall.Kill(os.Getpid(), syscall.SIGHUP), "sighup")
		time.Sleep(300 * time.Millisecond)
	}
	writeConfig(t, path, prefix, listen, admin, up, 5, false, "deny_prefixes = []")
	hup()
	if s, body, _ := c.Get(nil, "http://"+listen+"/healthz"); s != 200 || string(body) != "ok" {
		t.Fatalf("forwarded /healthz after reload with an empty deny list: %d %s (the upstream's path)", s, body)
	}
	if ok := count(5); ok != 2 { // 3 of 5 slots left after /healthz
		t.Fatalf("after reload to 5: %d admitted, want 2", ok)
	}
	writeConfig(t, path, prefix, listen, admin, up, 100, true)
	hup()
	if ok := count(3); ok != 0 {
		t.Fatalf("broken file must keep limit 5: %d admitted", ok)
	}
	if s, body, _ := c.Get(nil, "http://"+admin+"/metrics"); s != 200 || len(body) == 0 {
		t.Fatalf("metrics: %d", s)
	}
}
