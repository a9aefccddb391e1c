package stack

import (
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBinaries()
	os.Exit(code)
}

// impostor serves 200 on every path at a free address, as another test's
// process that took the port would.
func impostor(t *testing.T) (addr string, hits func() int, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", FreeAddr(t))
	servicetest.Must(t, err, "listen")
	var mu sync.Mutex
	n := 0
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	var once sync.Once
	stop = func() { once.Do(func() { _ = srv.Close() }) }
	t.Cleanup(stop)
	return ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return n }, stop
}

// proxyProc is bin/proxy against the shared Redis, its listeners picked by
// the stack (Serves) from pick.
func proxyProc(t *testing.T, pick func(testing.TB) string) *Proc {
	t.Helper()
	_, prefix := servicetest.Redis(t)
	dir := t.TempDir()
	env := append(os.Environ(), conf.EnvRedisURL+"="+servicetest.RedisURL(), conf.EnvRedisKeyPrefix+"="+prefix,
		conf.EnvProxyUpstreams+"=http://"+FreeAddr(t))
	p := NewProc(t, Binary(t, "proxy"), "proxy", "", dir, env, "-config", "/dev/null").
		Serves(t, conf.EnvProxyListen, conf.EnvProxyAdminListen)
	p.pick = pick
	return p
}

// The first start finds its admin port taken by a server that answers
// everything 200: WaitReady must not take that server's answer for the
// process's readiness, and starts the process again on fresh ports.
func TestFirstStartLosesItsPort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bin/proxy")
	}
	t.Parallel()
	taken, hits, _ := impostor(t)
	picks := 0
	p := proxyProc(t, func(t testing.TB) string {
		picks++
		if picks == 2 { // the first start's admin address
			return taken
		}
		return FreeAddr(t)
	})
	p.Start(t)
	p.WaitReady(t, "/readyz")
	if p.AdminAddr == taken || picks != 4 {
		t.Fatalf("admin %s after %d picks; want a fresh address (not %s) after 4", p.AdminAddr, picks, taken)
	}
	if n := hits(); n != 0 {
		t.Errorf("the server holding the lost port was asked %d times", n)
	}
	log := p.LogText()
	if !strings.Contains(log, "=== start 2 of proxy") || !strings.Contains(log, addrInUse) {
		t.Errorf("want a failed first start and a second one; log:\n%s", log)
	}
	resp, err := http.Get("http://" + p.AdminAddr + "/readyz")
	servicetest.Must(t, err, "readyz")
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz of the restarted process: %d", resp.StatusCode)
	}
}

// A restart must keep its addresses: while someone else holds one of them,
// WaitReady starts the process again on the same ones until it is free.
func TestRestartWaitsForItsPort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bin/proxy")
	}
	t.Parallel()
	p := proxyProc(t, FreeAddr)
	p.Start(t)
	p.WaitReady(t, "/readyz")
	addr, admin := p.Addr, p.AdminAddr
	p.Kill(t)
	ln, err := net.Listen("tcp", admin)
	servicetest.Must(t, err, "hold the admin port")
	held := make(chan struct{})
	go func() {
		// Released once the restart lost the port (or after a minute, when
		// the test fails below).
		for deadline := time.Now().Add(time.Minute); !strings.Contains(p.LogText(), addrInUse) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		_ = ln.Close()
		close(held)
	}()
	p.Start(t)
	p.WaitReady(t, "/readyz")
	<-held
	if !strings.Contains(p.LogText(), addrInUse) {
		t.Errorf("the restart never found its port taken; the test forced nothing")
	}
	if p.Addr != addr || p.AdminAddr != admin {
		t.Fatalf("restarted on %s/%s, want its addresses %s/%s", p.Addr, p.AdminAddr, addr, admin)
	}
}
