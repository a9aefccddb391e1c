package e2e

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
)

// exec runs bin with args and returns its exit status and output.
func runBinary(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := servicetest.CommandContext(ctx, t, bin, args...)
	cmd.Env = append(os.Environ(), "SECKILL_ADMIN_TOKEN=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v: not done within a minute: %v\n%s", bin, args, err, out.String())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String()
	}
	t.Fatalf("%s %v: %v", bin, args, err)
	return -1, ""
}

// The command line every binary shares: -h exits 0 without an error line,
// -version prints a version, -check validates a file naming every problem,
// -healthcheck probes /healthz (the serving binaries).
func TestCommandLine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	bad := filepath.Join(dir, "bad.toml")
	servicetest.Must(t, os.WriteFile(good, []byte("[log]\nlevel = \"debug\"\n"), 0o644), "write")
	servicetest.Must(t, os.WriteFile(bad, []byte("[log]\nlevel = \"loud\"\n[worker]\nbatch_wait = \"-1s\"\nnot_a_key = 1\n"), 0o644), "write")

	// A /healthz to probe, and a port nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "listen")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			_, _ = w.Write([]byte("ok"))
			return
		}
		http.NotFound(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	live := ln.Addr().String()
	dead := stack.FreeAddr(t)

	for _, c := range []struct{ name, listenKey string }{
		{"proxy", "[proxy]\nadmin_listen"}, {"backend", "[backend]\nlisten"}, {"worker", "[worker]\nlisten"}, {"bench", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			bin := stack.Binary(t, c.name)
			if code, out := runBinary(t, bin, "-h"); code != 0 || !strings.Contains(out, "-config") || strings.Contains(strings.ToLower(out), "error") {
				t.Errorf("-h: exit %d\n%s", code, out)
			}
			if code, out := runBinary(t, bin, "-version"); code != 0 || !strings.HasPrefix(out, c.name+" ") || !strings.Contains(out, "go1.") {
				t.Errorf("-version: exit %d %q", code, out)
			}
			if code, out := runBinary(t, bin, "-check", "-config", good); code != 0 || !strings.Contains(out, "configuration ok") {
				t.Errorf("-check of a valid file: exit %d %q", code, out)
			}
			code, out := runBinary(t, bin, "-check", "-config", bad)
			if code != 1 {
				t.Errorf("-check of a bad file: exit %d, want 1\n%s", code, out)
			}
			for _, key := range []string{"log.level", "worker.batch_wait", "worker.not_a_key"} {
				if !strings.Contains(out, key) {
					t.Errorf("-check does not name %s:\n%s", key, out)
				}
			}
			if code, out := runBinary(t, bin, "-check", "-config", filepath.Join(dir, "missing.toml")); code != 1 {
				t.Errorf("-check of a missing file: exit %d\n%s", code, out)
			}
			if c.listenKey == "" {
				return
			}
			for addr, want := range map[string]int{live: 0, dead: 1} {
				cfg := filepath.Join(t.TempDir(), "hc.toml")
				servicetest.Must(t, os.WriteFile(cfg, []byte(c.listenKey+" = \""+addr+"\"\n"), 0o644), "write")
				if code, out := runBinary(t, bin, "-healthcheck", "-config", cfg); code != want {
					t.Errorf("-healthcheck of %s: exit %d, want %d\n%s", addr, code, want, out)
				}
			}
		})
	}
}
