package servicetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// grandchild is a shell that prints the pid of a background sleep (its
// child, the test's grandchild, which inherits the shell's stdout), then
// waits for it: the shape of the deploy test's hang (sh, killed at its
// context's end, and a redis-cli under it that kept the output pipe open).
const grandchild = `sleep 300 & echo "$!"; wait`

// gone waits (bounded) until process pid no longer runs: no such process, a
// zombie, or the pid taken by another program than want.
func gone(t *testing.T, pid int, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil || zombie(string(stat)) || !strings.HasPrefix(string(cmdline), want+"\x00") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d (%s) still runs 10 s after its test let go of it", pid, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func zombie(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	return i >= 0 && strings.HasPrefix(stat[i+1:], " Z")
}

func pids(t *testing.T, out []byte) []int {
	t.Helper()
	var ps []int
	for _, f := range strings.Fields(string(out)) {
		p, err := strconv.Atoi(f)
		Must(t, err, "pid in %q", out)
		ps = append(ps, p)
	}
	return ps
}

// The hang's mechanism: the context ends while a grandchild holds the output
// pipe. CombinedOutput returns at the context's end (well within
// childWaitDelay: the group kill closes the pipe) with the context's kill as
// its error, and the grandchild is dead. With exec.CommandContext alone it
// returns after the sleep's 300 s; with WaitDelay alone, after the delay,
// leaving the sleep running.
func TestCommandContextKillsAGrandchildHoldingThePipe(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	t0 := time.Now()
	out, err := CommandContext(ctx, t, "sh", "-c", grandchild).CombinedOutput()
	took := time.Since(t0)
	t.Logf("returned after %v: %v, output %q", took, err, out)
	var ee interface{ ExitCode() int }
	if !errors.As(err, &ee) || ee.ExitCode() != -1 {
		t.Errorf("error %v, want the shell killed by a signal", err)
	}
	if took >= time.Second+childWaitDelay {
		t.Errorf("returned after %v: the group was not killed at the context's end (WaitDelay %v fired instead)", took, childWaitDelay)
	}
	ps := pids(t, out)
	if len(ps) != 1 {
		t.Fatalf("output %q, want the sleep's pid", out)
	}
	gone(t, ps[0], "sleep")
}

// A child that exits while a background job of its own still holds the pipe
// succeeds at once (no ErrWaitDelay): the job, left in the child's group, is
// killed as the child exits.
func TestCommandSweepsWhatTheChildLeft(t *testing.T) {
	t.Parallel()
	out, err := Command(t, "sh", "-c", `sleep 300 & echo "$!"; exit 0`).CombinedOutput()
	Must(t, err, "sh with a background sleep")
	ps := pids(t, out)
	if len(ps) != 1 {
		t.Fatalf("output %q, want the sleep's pid", out)
	}
	gone(t, ps[0], "sleep")
}

// A child still running when its test ends is killed with its group.
func TestCommandKilledWhenTheTestEnds(t *testing.T) {
	t.Parallel()
	var c *Cmd
	var sleep int
	t.Run("starts", func(t *testing.T) {
		r, w, err := os.Pipe()
		Must(t, err, "pipe")
		defer r.Close()
		c = Command(t, "sh", "-c", grandchild)
		c.Stdout = w
		Must(t, c.Start(), "start")
		_ = w.Close()
		line, err := bufio.NewReader(r).ReadString('\n')
		Must(t, err, "read the sleep's pid")
		sleep = pids(t, []byte(line))[0]
	})
	if c.ProcessState == nil {
		t.Fatal("the child was not reaped when its test ended")
	}
	gone(t, sleep, "sleep")
}

// envDieChild makes the test binary, run by TestChildrenDieWithTheTestBinary,
// start a shell with a grandchild, print both pids and then hang until its
// -test.timeout panics, as the deploy test did.
const envDieChild = "SECKILL_SERVICETEST_DIE_CHILD"

func TestChildrenDieWithTheTestBinary(t *testing.T) {
	if os.Getenv(envDieChild) != "" {
		c := Command(t, "sh", "-c", grandchild)
		c.Stdout = os.Stdout
		Must(t, c.Start(), "start")
		fmt.Printf("child %d\n", c.Process.Pid)
		select {} // until -test.timeout panics: no cleanup runs
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin := CommandContext(ctx, t, os.Args[0], "-test.run=^TestChildrenDieWithTheTestBinary$", "-test.timeout=5s")
	bin.Env = append(os.Environ(), envDieChild+"=1")
	out, err := bin.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "panic: test timed out") {
		t.Fatalf("the test binary did not time out: %v\n%s", err, out)
	}
	var child, sleep int
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "child "); ok {
			child, _ = strconv.Atoi(v)
		} else if p, err := strconv.Atoi(l); err == nil && sleep == 0 {
			sleep = p
		}
	}
	if child == 0 || sleep == 0 {
		t.Fatalf("no pids in the test binary's output:\n%s", out)
	}
	gone(t, child, "sh")
	gone(t, sleep, "sleep")
}
