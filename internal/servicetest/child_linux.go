package servicetest

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// childProcAttr: a process group of the child's own, and SIGKILL to the
// child when the test binary dies (see Cmd).
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// reap waits for the child's exit without reaping it (waitid WNOWAIT),
// sweeps its group while its pid, the group's id, is still taken by the
// zombie, then lets exec's Wait reap it; what the child left behind is dead
// by then, so its output pipe is closed and Wait returns at once.
func (c *Cmd) reap() error {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, c.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			break // exited (or not waitable: exec's Wait says why)
		}
	}
	c.sweep()
	return c.Cmd.Wait()
}
