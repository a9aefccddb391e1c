package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/servicetest"
)

// logBuffer collects a run's log lines for the test to wait on.
type logBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ended error // run's error, once it returned
	done  bool
}

// end records that run returned err.
func (b *logBuffer) end(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended, b.done = err, true
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records are the log records whose msg is msg, in order.
func (b *logBuffer) records(msg string) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(b.buf.String(), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil && r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// await waits until the log holds n records with msg (the bound only keeps
// a broken build from hanging) and returns the last.
func (b *logBuffer) await(t *testing.T, msg string, n int) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		if rs := b.records(msg); len(rs) >= n {
			return rs[n-1]
		}
		b.mu.Lock()
		ended, err, text := b.done, b.ended, b.buf.String()
		b.mu.Unlock()
		if ended || time.Now().After(deadline) {
			t.Fatalf("no %q record #%d in the log (run ended: %v, %v):\n%s", msg, n, ended, err, text)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writeConfig(t *testing.T, path, prefix, listen, admin, up string, limit int, broken bool, proxyKeys ...string) {
	doc := fmt.Sprintf(`
[redis]
key_prefix = %q
[proxy]
listen = %q
admin_listen = %q
upstreams = ["http://%s"]
# The counts below are the limiter's Redis decisions: a call outliving the
# default 20ms on a loaded machine would be decided by on_redis_error.
redis_timeout = "10s"
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
	// Port 0: the proxy logs the addresses it bound (no probed port to lose).
	listen, admin := "127.0.0.1:0", "127.0.0.2:0"
	writeConfig(t, path, prefix, listen, admin, up, 2, false)
	env := func(k string) string {
		if k == "SECKILL_REDIS_URL" {
			return servicetest.RedisURL()
		}
		return ""
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &logBuffer{}
	go func() {
		err := run(ctx, []string{"-config", path}, env, io.Discard, logs)
		logs.end(err)
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	serving := logs.await(t, "proxy serving", 1)
	listen, _ = serving["listen"].(string)
	admin, _ = serving["admin"].(string)
	c := &fasthttp.Client{}
	for deadline := time.Now().Add(time.Minute); ; {
		if s, _, err := c.Get(nil, "http://"+admin+"/readyz"); err == nil && s == 200 {
			break
		}
		if time.Now().After(deadline) {
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
	// hup reloads and waits until the proxy logged the outcome.
	reloads := 0
	hup := func() {
		reloads++
		servicetest.Must(t, syscall.Kill(os.Getpid(), syscall.SIGHUP), "sighup")
		for deadline := time.Now().Add(time.Minute); len(logs.records("rules, deny list and identity reloaded"))+
			len(logs.records("reload rejected, running rules kept")) < reloads; {
			if time.Now().After(deadline) {
				t.Fatalf("reload %d left no record in the log", reloads)
			}
			time.Sleep(10 * time.Millisecond)
		}
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
