// Package stack runs isolated seckill stacks of real processes (backends,
// workers, proxies) against the real Redis, MariaDB and RabbitMQ for the
// end-to-end and fault-injection tests, drives a crowd of buyers through
// them and checks invariants I1–I5 (docs/invariants.md) in MySQL and Redis.
// Test-only: nothing outside e2e/ imports it.
package stack

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
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
	// Seconds with a warm build cache; the bound keeps a stuck build from
	// running into the package's -timeout.
	const bound = 5 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := servicetest.CommandContext(ctx, t, "go", "build", "-o", out, "github.com/seckill/seckill/"+name)
	cmd.Dir = moduleRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s (bound %v): %v\n%s", name, bound, err, b)
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
	owner     testing.TB // NewProc's test: every run is its child
	bin       string
	args      []string
	env       []string
	log       string
	// listen names the environment variables of the listen addresses (Addr,
	// then AdminAddr) the stack picks for the process (Serves); bound is set
	// once a start bound them, from then on restarts keep them.
	listen []string
	bound  bool
	pick   func(testing.TB) string // FreeAddr; a test's own to force a lost port

	mu     sync.Mutex
	cmd    *servicetest.Cmd
	exited chan struct{}
	err    error // of the last exit
	file   *os.File
	starts int
	extra  []string // the extra environment of the last start
	mark   int64    // offset in the log where the current start's output begins
}

// NewProc prepares a process; Start runs it. It is stopped (SIGTERM, then
// SIGKILL) when the test ends, and its log is shown if the test failed.
func NewProc(t testing.TB, bin, name, addr, logDir string, env []string, args ...string) *Proc {
	p := &Proc{Name: name, Addr: addr, owner: t, bin: bin, args: args, env: env, log: filepath.Join(logDir, name+".log")}
	// Runs last, after every run's stop (registered by start).
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(p.log); err == nil {
				t.Logf("--- %s log (last 6 KiB):\n%s", name, tail(b, 6<<10))
			}
		}
	})
	return p
}

// Serves makes the stack pick the process's listen addresses: keys are the
// environment variables that set them, for Addr and then AdminAddr. The first
// Start takes fresh addresses; WaitReady retries a first start that lost one
// of them to another process (a port is only probed free, then bound by the
// child seconds later) with fresh ones, and confirms from the log that the
// process bound its own addresses before it asks them for readiness, so that
// a port taken by someone else's server is never mistaken for this process.
func (p *Proc) Serves(t testing.TB, keys ...string) *Proc {
	t.Helper()
	if len(keys) == 0 || len(keys) > 2 {
		t.Fatalf("%s: Serves takes the variables of Addr and optionally AdminAddr, got %v", p.Name, keys)
	}
	p.listen, p.pick = keys, FreeAddr
	return p
}

// listenEnv picks fresh addresses on the process's first start (and after a
// start that lost one); otherwise it names the ones it has.
func (p *Proc) listenEnv(t testing.TB, fresh bool) []string {
	t.Helper()
	if len(p.listen) == 0 {
		return nil
	}
	if fresh {
		p.Addr, p.AdminAddr = p.pick(t), ""
		if len(p.listen) == 2 {
			p.AdminAddr = p.pick(t)
		}
	}
	env := []string{p.listen[0] + "=" + p.Addr}
	if len(p.listen) == 2 {
		env = append(env, p.listen[1]+"="+p.AdminAddr)
	}
	return env
}

// addrs are the listen addresses the process must bind.
func (p *Proc) addrs() []string {
	if p.AdminAddr != "" && len(p.listen) == 2 {
		return []string{p.Addr, p.AdminAddr}
	}
	return []string{p.Addr}
}

// Start runs the process with extra environment variables (later ones win).
func (p *Proc) Start(t testing.TB, extraEnv ...string) {
	t.Helper()
	p.mu.Lock()
	fresh := len(p.listen) > 0 && !p.bound
	p.mu.Unlock()
	p.start(t, fresh, extraEnv)
}

func (p *Proc) start(t testing.TB, fresh bool, extraEnv []string) {
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
	if fi, err := p.file.Stat(); err == nil {
		p.mark = fi.Size()
	}
	p.extra = append([]string(nil), extraEnv...)
	// A child of NewProc's test, whichever (sub)test restarts it; the
	// helper kills it when that test ends, so the graceful stop is
	// registered after it (t.Cleanup is LIFO) and runs first: each run's
	// stop, as a start made it, finds the current run.
	cmd := servicetest.Command(p.owner, p.bin, p.args...)
	p.owner.Cleanup(func() {
		if err := p.Stop(30 * time.Second); err != nil {
			p.owner.Errorf("%s: %v", p.Name, err)
		}
	})
	cmd.Env = append(append(append([]string{}, p.env...), p.listenEnv(t, fresh)...), extraEnv...)
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

// URL is http://Addr.
func (p *Proc) URL() string { return "http://" + p.Addr }

// WaitReady polls path (e.g. "/readyz") until it answers 200: on the admin
// listener when the process has one, else on Addr.
func (p *Proc) WaitReady(t testing.TB, path string) {
	t.Helper()
	if len(p.listen) > 0 {
		p.waitBound(t)
	}
	url := p.URL()
	if p.AdminAddr != "" {
		url = "http://" + p.AdminAddr
	}
	c := &http.Client{Timeout: 2 * time.Second}
	WaitFor(t, p.Name+path, 2*time.Minute, func() bool {
		if !p.Running() {
			t.Fatalf("%s exited while waiting for %s", p.Name, path)
		}
		r, err := c.Get(url + path)
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
}

// addrInUse is how the binaries' "listen ADDR: ..." error ends when another
// process holds the port.
const addrInUse = "address already in use"

// waitBound waits until the current start logged the addresses it bound
// (each binary logs its listeners' addresses once they listen). A start that
// lost a port is started again: with fresh addresses when no start has bound
// them yet, else on the same ones (a restart must keep its address: the
// proxies and the test point at it) once the holder let go, within a bound.
func (p *Proc) waitBound(t testing.TB) {
	t.Helper()
	const tries = 20
	for try := 1; ; try++ {
		var out string
		WaitFor(t, p.Name+" listening", 2*time.Minute, func() bool {
			running := p.Running()
			out = p.currentLog()
			if !running {
				return true
			}
			for _, a := range p.addrs() {
				if !strings.Contains(out, `"`+a+`"`) {
					return false
				}
			}
			return true
		})
		running := p.Running()
		p.mu.Lock()
		p.bound = p.bound || running
		bound := p.bound
		p.mu.Unlock()
		if running || !strings.Contains(out, addrInUse) {
			return // bound, or exited for another reason (WaitReady reports it)
		}
		if try == tries {
			t.Fatalf("%s: lost its listen port %d times in a row: %s", p.Name, tries, tail([]byte(out), 400))
		}
		t.Logf("%s: a listen address was taken before the process bound it (%v); starting it again", p.Name, p.addrs())
		if bound {
			time.Sleep(250 * time.Millisecond)
		}
		p.mu.Lock()
		extra := p.extra
		p.mu.Unlock()
		p.start(t, !bound, extra)
	}
}

// currentLog is what the current start wrote so far.
func (p *Proc) currentLog() string {
	p.mu.Lock()
	mark := p.mark
	p.mu.Unlock()
	b, _ := os.ReadFile(p.log)
	if int64(len(b)) < mark {
		return ""
	}
	return string(b[mark:])
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

// FreeAddr returns a loopback address with a port of
// servicetest.FreePort: free just now, claimed for the test, below the
// ephemeral range (a process killed and restarted on it finds it free).
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(servicetest.FreePort(t)))
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
