package proccpu

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/servicetest"
)

// burnEnv makes the test binary a child that burns a known amount of CPU:
// on "go" from stdin it spins on the given number of threads until its own
// getrusage(2) says that much more CPU was spent, then says "done" and
// sleeps until stdin closes. getrusage is the kernel's precise account, not
// /proc, so the test checks Process against an independent measure.
const burnEnv = "PROCCPU_TEST_BURN"

func TestMain(m *testing.M) {
	if spec := os.Getenv(burnEnv); spec != "" {
		burn(spec)
		return
	}
	os.Exit(m.Run())
}

func rusage() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func burn(spec string) {
	var amount time.Duration
	var threads int
	if _, err := fmt.Sscanf(spec, "%d/%d", &amount, &threads); err != nil {
		panic(err)
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	if line, _ := in.ReadString('\n'); line != "go\n" {
		os.Exit(3)
	}
	goal := rusage() + amount
	done := make(chan struct{}, threads)
	for range threads {
		go func() {
			x := 1
			for rusage() < goal {
				for i := 0; i < 1000; i++ {
					x = x*31 + i
				}
			}
			_ = x
			done <- struct{}{}
		}()
	}
	for range threads {
		<-done
	}
	fmt.Println("done")
	_, _ = io.Copy(io.Discard, in)
}

// child starts a burner; write "go\n" to its stdin to start the burn.
func child(t *testing.T, amount time.Duration, threads int) (pid int, in io.WriteCloser, out *bufio.Reader) {
	t.Helper()
	cmd := servicetest.Command(t, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d/%d", burnEnv, amount, threads))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close(); _ = cmd.Wait() })
	out = bufio.NewReader(stdout)
	expect(t, out, "ready")
	return cmd.Process.Pid, in, out
}

func expect(t *testing.T, r *bufio.Reader, want string) {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != want {
		t.Fatalf("child said %q (%v), want %q", line, err, want)
	}
}

// TestProcessCountsBurnedCPU: a child that burns 400 ms of CPU (on one
// thread, then on three) shows 400 ms in Process, within a few clock ticks;
// a sleeping child in the same window shows nothing. Counting only utime,
// only the main thread, or the wrong tick unit fails it.
func TestProcessCountsBurnedCPU(t *testing.T) {
	for _, threads := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d threads", threads), func(t *testing.T) {
			const amount = 400 * time.Millisecond
			pid, in, out := child(t, amount, threads)
			idle, _, _ := child(t, amount, 1)
			groups := []Group{{Name: "burner", PIDs: []int{pid}}, {Name: "idle", PIDs: []int{idle}}}
			a := Take(groups)
			if _, err := io.WriteString(in, "go\n"); err != nil {
				t.Fatal(err)
			}
			expect(t, out, "done")
			b := Take(groups)
			u := Diff(groups, a, b)
			if len(u) != 3 || u[0].Err != "" || u[1].Err != "" || u[2].Name != "box" {
				t.Fatalf("usage %+v", u)
			}
			// Each thread may overshoot by one loop and a tick of rounding;
			// the reply and the read back cost little beyond that.
			slack := time.Duration(threads)*clockTick + 3*clockTick
			if got := u[0].CPU; got < amount-clockTick || got > amount+slack {
				t.Fatalf("burner: %v of CPU, want %v (+%v)", got, amount, slack)
			}
			if got := u[1].CPU; got > 2*clockTick {
				t.Fatalf("sleeping child: %v of CPU, want ~0", got)
			}
			if u[2].CPU < u[0].CPU-clockTick {
				t.Fatalf("box busy %v is less than the burner's %v", u[2].CPU, u[0].CPU)
			}
		})
	}
}

// TestGoneProcessIsReported: a process that exits inside the window is an
// error of its group, not a zero.
func TestGoneProcessIsReported(t *testing.T) {
	cmd := servicetest.Command(t, "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	groups := []Group{{Name: "sleep", PIDs: []int{cmd.Process.Pid}}}
	a := Take(groups)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	b := Take(groups)
	u := Diff(groups, a, b)
	if u[0].Err == "" || !strings.Contains(u[0].Err, fmt.Sprint(cmd.Process.Pid)) {
		t.Fatalf("usage of a gone process: %+v", u[0])
	}
}

func TestParseStat(t *testing.T) {
	// A command name with spaces and a ')' in it; utime 250, stime 50.
	line := "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 100 0 0"
	d, err := parseStat([]byte(line))
	if err != nil || d != 300*clockTick {
		t.Fatalf("parseStat = %v, %v; want %v", d, err, 300*clockTick)
	}
	for _, bad := range []string{"", "4242 no parens S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 x 50 0"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	raw := "cpu  100 10 50 1000 30 5 5 0 7 0\ncpu0 50 5 25 500 15 2 3 0 0 0\ncpu1 50 5 25 500 15 3 2 0 0 0\nintr 1\n"
	busy, cores, err := parseProcStat([]byte(raw))
	if err != nil || cores != 2 || busy != 170*clockTick {
		t.Fatalf("parseProcStat = %v, %d, %v; want %v, 2", busy, cores, err, 170*clockTick)
	}
	if _, _, err := parseProcStat([]byte("intr 1\n")); err == nil {
		t.Fatal("no cpu line: no error")
	}
}

func TestParseGroups(t *testing.T) {
	g, err := ParseGroups(" proxy=12, worker=14+15,backend=13,worker=16 ")
	if err != nil {
		t.Fatal(err)
	}
	want := "[{proxy [12]} {worker [14 15 16]} {backend [13]}]"
	if fmt.Sprint(g) != want {
		t.Fatalf("ParseGroups = %v, want %v", g, want)
	}
	for _, bad := range []string{"proxy", "=12", "proxy=", "proxy=x", "proxy=12+", "proxy=-1", "proxy=0"} {
		if _, err := ParseGroups(bad); err == nil {
			t.Errorf("ParseGroups(%q): no error", bad)
		}
	}
}
