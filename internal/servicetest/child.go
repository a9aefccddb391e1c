package servicetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Every process a test starts (a server, a tool, a script: any child of a
// test binary) is made with Command or CommandContext, so that none can
// outlive its bound, its test or `go test` itself. What guarantees what:
//
//   - Its own process group (Setpgid; the group id is the child's pid): the
//     child and whatever it forks without leaving the group (a script's
//     redis-cli, a shell's background job) are killed together, SIGKILL to
//     the group, when the context of CommandContext is done (cmd.Cancel),
//     when the child itself exits (what it left behind is swept before the
//     child is reaped, so its output pipe closes at once and the group id
//     cannot have been reused by then), and when the test that made the
//     command ends with the child still running (t.Cleanup).
//   - WaitDelay: Wait returns at most childWaitDelay after the child exited
//     or its context ended, even when a process outside the group (one that
//     left it) still holds the output pipe; the group kill makes that the
//     rare case.
//   - When the test binary dies without running its cleanups (the -timeout
//     panic, a panic in a goroutine of no test, SIGKILL): the kernel sends
//     SIGKILL to each child (Pdeathsig, Linux), and a watchdog (one sh per
//     test binary whose stdin is a pipe only the test binary holds) reads
//     EOF and kills every group still registered: the grandchildren, and
//     a child whose Pdeathsig an exec cleared (a set-user-ID program). A
//     group is registered from its start until its child was reaped; one
//     whose every process had already ended when the binary died could in
//     principle have had its id reused by the time of that kill, which
//     comes at once.
//
// Not covered: a process that leaves the group on purpose (setsid: a
// daemonizing redis-server, su -c, start-stop-daemon --background). Whoever
// starts one stops it its own way (redis-engines.sh stop, rabbitmqctl stop).
// Pdeathsig fires when the OS thread that started the child ends, which the
// Go runtime does only for a goroutine that exits locked to its thread
// (runtime.LockOSThread): no test starts a child from one.

// childWaitDelay bounds Wait after the child exited or its context ended.
const childWaitDelay = 5 * time.Second

// childReapBound is how long a test's cleanup waits for a child it killed to
// be reaped: the kill is immediate, the reap follows within childWaitDelay.
const childReapBound = childWaitDelay + 5*time.Second

// Cmd is a child process of a test: an exec.Cmd whose Start, Wait, Run,
// Output and CombinedOutput shadow exec's and add the guarantees above. Set
// its fields (Env, Dir, Stdout, ...) and use StdinPipe or StdoutPipe as on
// an exec.Cmd; do not call the embedded Cmd's Start or Wait directly.
type Cmd struct {
	*exec.Cmd
	t    testing.TB
	what string // the command line, shortened, for messages

	mu      sync.Mutex
	started bool
	exited  bool          // the child exited and its group was swept
	swept   chan struct{} // closed then (Linux: see watch)
	wait    sync.Once     // exec's Wait, once: after the sweep
	err     error         // of exec's Wait
}

// Command is exec.Command(name, args...) as a child of test t (see Cmd).
func Command(t testing.TB, name string, args ...string) *Cmd {
	return newCmd(t, exec.Command(name, args...))
}

// CommandContext is exec.CommandContext(ctx, name, args...) as a child of
// test t: when ctx is done its whole process group is killed, and Wait
// returns within childWaitDelay, whatever still holds its output.
func CommandContext(ctx context.Context, t testing.TB, name string, args ...string) *Cmd {
	c := newCmd(t, exec.CommandContext(ctx, name, args...))
	c.Cmd.Cancel = c.killGroup
	return c
}

func newCmd(t testing.TB, cmd *exec.Cmd) *Cmd {
	cmd.SysProcAttr = childProcAttr()
	cmd.WaitDelay = childWaitDelay
	c := &Cmd{Cmd: cmd, t: t, what: commandLine(cmd.Args), swept: make(chan struct{})}
	// Registered now, before the caller's own cleanups (a graceful stop
	// registered after the command was made runs first: t.Cleanup is LIFO).
	t.Cleanup(func() {
		c.mu.Lock()
		started := c.started
		c.mu.Unlock()
		if !started {
			return
		}
		_ = c.killGroup()
		waited := make(chan struct{})
		go func() { _ = c.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(childReapBound):
			t.Errorf("%s: not reaped %v after SIGKILL to its process group %d", c.what, childReapBound, c.Process.Pid)
		}
	})
	return c
}

func commandLine(args []string) string {
	s := strings.Join(args, " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// Start starts the child in a process group of its own and registers the
// group with the watchdog. Wait reaps it (the test's cleanup does, if the
// caller does not).
func (c *Cmd) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return fmt.Errorf("%s: started twice", c.what)
	}
	w, err := theWatchdog()
	if err != nil {
		return fmt.Errorf("start %s: %w", c.what, err)
	}
	if err := c.Cmd.Start(); err != nil {
		return err
	}
	if err := w.send('+', c.Process.Pid); err != nil {
		_ = killGroup(c.Process.Pid)
		_ = c.Cmd.Wait()
		return fmt.Errorf("start %s: %w", c.what, err)
	}
	c.started = true
	c.watch()
	return nil
}

// Wait waits for the child, reaps it (after its group was swept) and
// returns exec's Wait error; any number of callers get the same.
func (c *Cmd) Wait() error {
	c.mu.Lock()
	started := c.started
	c.mu.Unlock()
	if !started {
		return fmt.Errorf("%s: Wait before Start", c.what)
	}
	c.wait.Do(func() {
		c.err = c.reap()
		_ = theDog.send('-', c.Process.Pid)
	})
	return c.err
}

// Run starts the child and waits for it.
func (c *Cmd) Run() error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.Wait()
}

// Output runs the child and returns its standard output; a failed child's
// standard error is in the *exec.ExitError, as with exec.Cmd.Output.
func (c *Cmd) Output() ([]byte, error) {
	if c.Stdout != nil {
		return nil, fmt.Errorf("%s: Stdout already set", c.what)
	}
	var stdout, stderr bytes.Buffer
	c.Stdout = &stdout
	captured := c.Stderr == nil
	if captured {
		c.Stderr = &stderr
	}
	err := c.Run()
	var ee *exec.ExitError
	if captured && errors.As(err, &ee) {
		ee.Stderr = stderr.Bytes()
	}
	return stdout.Bytes(), err
}

// CombinedOutput runs the child and returns its standard output and error.
func (c *Cmd) CombinedOutput() ([]byte, error) {
	if c.Stdout != nil || c.Stderr != nil {
		return nil, fmt.Errorf("%s: Stdout or Stderr already set", c.what)
	}
	var b bytes.Buffer
	c.Stdout, c.Stderr = &b, &b
	err := c.Run()
	return b.Bytes(), err
}

// killGroup kills the child's process group unless the child exited: then
// its group was swept, and once reaped its pid may belong to another
// process. Under c.mu, so that it never overlaps the sweep and the reap.
func (c *Cmd) killGroup() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited {
		return os.ErrProcessDone
	}
	return killGroup(c.Process.Pid)
}

// sweep kills what the exited child left in its group and marks it exited.
func (c *Cmd) sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.exited = true
	_ = killGroup(c.Process.Pid)
}

// killGroup sends SIGKILL to process group pgid; a group already gone is
// os.ErrProcessDone (what exec's Cancel expects then).
func killGroup(pgid int) error {
	err := syscall.Kill(-pgid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// watchdogScript kills, once its stdin ends (the test binary exited, however
// it did), every process group still registered on it: "+ PGID" registers,
// "- PGID" forgets one whose child was reaped and swept. It ignores the
// signals that end `go test` from a terminal or a timeout wrapper, and sits
// in a group of its own, so that it is still there to read the EOF.
const watchdogScript = `trap '' INT TERM HUP QUIT
groups=
while read -r op g; do
	case $op in
	+) groups="$groups $g" ;;
	-) keep=; for x in $groups; do [ "$x" = "$g" ] || keep="$keep $x"; done; groups=$keep ;;
	esac
done
for g in $groups; do kill -KILL -"$g" 2>/dev/null; done
exit 0`

type watchdog struct {
	mu sync.Mutex
	w  *os.File // the write end of its stdin; only this process holds it
}

var (
	watchdogOnce sync.Once
	theDog       *watchdog
	errDog       error
)

// theWatchdog starts the test binary's watchdog on first use.
func theWatchdog() (*watchdog, error) {
	watchdogOnce.Do(func() {
		r, w, err := os.Pipe() // close-on-exec: no other child inherits w
		if err != nil {
			errDog = fmt.Errorf("watchdog pipe: %w", err)
			return
		}
		cmd := exec.Command("sh", "-c", watchdogScript)
		cmd.Stdin = r // stdout, stderr: /dev/null, never go test's pipe
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		err = cmd.Start()
		_ = r.Close()
		if err != nil {
			_ = w.Close()
			errDog = fmt.Errorf("start the child-process watchdog (sh): %w", err)
			return
		}
		go func() { _ = cmd.Wait() }() // reaped if it dies early; send then fails
		theDog = &watchdog{w: w}
	})
	return theDog, errDog
}

func (d *watchdog) send(op byte, pgid int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.w.Write([]byte(string(op) + " " + strconv.Itoa(pgid) + "\n")); err != nil {
		return fmt.Errorf("tell the child-process watchdog %c%d: %w", op, pgid, err)
	}
	return nil
}
