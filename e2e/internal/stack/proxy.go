package stack

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

// StartProxy runs bin/proxy in front of the stack's backends with config
// (TOML for the proxy's own file; the stack's Redis and prefix come from the
// environment) and waits until it is ready. The returned Proc's Addr is the
// forwarding listener; AdminAddr the proxy's admin one.
func (s *Stack) StartProxy(t testing.TB, name, config string) *Proc {
	t.Helper()
	path := filepath.Join(s.Dir, name+".toml")
	servicetest.Must(t, os.WriteFile(path, []byte(config), 0o644), "proxy config")
	ups := make([]string, len(s.Backends))
	for i, b := range s.Backends {
		ups[i] = b.URL()
	}
	env := append(append([]string{}, s.Env...), conf.EnvProxyUpstreams+"="+strings.Join(ups, ","))
	p := NewProc(t, Binary(t, "proxy"), name, "", s.Dir, env, "-config", path).
		Serves(t, conf.EnvProxyListen, conf.EnvProxyAdminListen)
	p.Start(t)
	p.WaitReady(t, "/readyz")
	s.Proxies = append(s.Proxies, p)
	return p
}

// Signal sends sig (e.g. syscall.SIGHUP) to the running process.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || !p.Running() {
		t.Fatalf("%s: signal %v to a process that is not running", p.Name, sig)
	}
	servicetest.Must(t, cmd.Process.Signal(sig), "signal %s", p.Name)
}
