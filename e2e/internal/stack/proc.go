// Package stack runs isolated seckill stacks of real processes (backends,
// workers, proxies) against the real Redis, MariaDB and RabbitMQ for the
// end-to-end and fault-injection tests, drives a crowd of buyers through
// them and checks invariants I1–I5 (docs/invariants.md) in MySQL and Redis.
// Test-only: nothing outside e2e/ imports it.
package stack

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/servicetest"
)

var (
	buildMu  sync.Mutex
	buildDir string
	built    = map[string]bool{}
)

// Binary builds one command of the module (backend, worker, proxy) once per
// test process and returns its path.
func Binary(t testing.TB, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir == "" {
		d, err := os.MkdirTemp("", "seckill-e2e-bin-")
		servicetest.Must(t, err, "bin dir")
		buildDir = d
	}
	out := filepath.Join(buildDir, name)
	if built[name] {
		return out
	}
	cmd := exec.Command("go", "build", "-o", out, "github.com/seckill/seckill/"+name)
	cmd.Dir = moduleRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, b)
	}
	built[name] = true
	return out
}

// RemoveBinaries deletes what Binary built; call it from TestMain.
func RemoveBinaries() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

// moduleRoot is the directory holding go.mod, found upwards from the test's
// working directory.
func moduleRoot(t testing.TB) string {
	dir, err := os.Getwd()
	servicetest.Must(t, err, "getwd")
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// Proc is one process of a stack; it can be killed and started again.
type Proc struct {
	Name string // "backend-0"
	Addr string // listen address (host:port)
	// AdminAddr is a proxy's admin listener (Addr is its forwarding one).
	AdminAddr string
	bin       string
	args      []string
	env       []string
	log       string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // of the last exit
	file   *os.File
	starts int
}

// NewProc prepares a process; Start runs it. It is stopped (SIGTERM, then
// SIGKILL) when the test ends, and its log is shown if the test failed.
func NewProc(t testing.TB, bin, name, addr, logDir string, env []string, args ...string) *Proc {
	p := &Proc{Name: name, Addr: addr, bin: bin, args: args, env: env, log: filepath.Join(logDir, name+".log")}
	t.Cleanup(func() {
		if err := p.Stop(30 * time.Second); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if t.Failed() {
			if b, err := os.ReadFile(p.log); err == nil {
				t.Logf("--- %s log (last 6 KiB):\n%s", name, tail(b, 6<<10))
			}
		}
	})
	return p
}

// Start runs the process with extra environment variables (later ones win).
func (p *Proc) Start(t testing.TB, extraEnv ...string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			t.Fatalf("%s: started while running", p.Name)
		}
	}
	if p.file == nil {
		f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		servicetest.Must(t, err, "log file")
		p.file = f
	}
	p.starts++
	fmt.Fprintf(p.file, "=== start %d of %s\n", p.starts, p.Name)
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(append([]string{}, p.env...), extraEnv...)
	cmd.Stdout, cmd.Stderr = p.file, p.file
	servicetest.Must(t, cmd.Start(), "start %s", p.Name)
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Pid is the process id of the current run (0 when never started).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Exited is closed when the current run ends.
func (p *Proc) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// ExitCode is the status of the last run, -1 when killed by a signal.
func (p *Proc) ExitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.ProcessState == nil {
		return -2
	}
	return p.cmd.ProcessState.ExitCode()
}

// Kill sends SIGKILL (kill -9) and waits for the process to be gone.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Stop sends SIGTERM and waits up to grace; then SIGKILL. An error reports a
// process that did not stop on SIGTERM or exited with an error on it.
func (p *Proc) Stop(grace time.Duration) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if p.file != nil {
			_ = p.file.Close()
			p.file = nil
		}
		p.mu.Unlock()
	}()
	if cmd == nil {
		return nil
	}
	select {
	case <-exited:
		return nil // already gone (killed by the test, or crashed on purpose)
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		p.mu.Lock()
		err := p.err
		p.mu.Unlock()
		if err != nil {
			return fmt.Errorf("exited on SIGTERM: %v", err)
		}
		return nil
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("did not stop within %v of SIGTERM", grace)
	}
}

// Env is the environment the process starts with.
func (p *Proc) Env() []string { return p.env }

// URL is http://Addr.
func (p *Proc) URL() string { return "http://" + p.Addr }

// WaitReady polls path (e.g. "/readyz") until it answers 200.
func (p *Proc) WaitReady(t testing.TB, path string) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	WaitFor(t, p.Name+path, 2*time.Minute, func() bool {
		if !p.Running() {
			t.Fatalf("%s exited while waiting for %s", p.Name, path)
		}
		r, err := c.Get(p.URL() + path)
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
}

// LogText is what the process wrote so far.
func (p *Proc) LogText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// FreeAddr returns a loopback address with a port that was free just now,
// taken below the kernel's ephemeral range (32768 and up here): a process
// killed and restarted on the same port must not find it taken by one of the
// machine's outgoing connections, which only ever get ephemeral ports.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 200 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+rand.IntN(12000)))
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			_ = ln.Close()
			return addr
		}
	}
	t.Fatal("no free port between 20000 and 32000")
	return ""
}

// WaitFor polls cond every 50ms; the bound keeps a broken build from
// hanging, it is no speed goal.
func WaitFor(t testing.TB, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting (%v) for %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
