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

// watch sweeps the child's group as soon as the child exits: waitid with
// WNOWAIT sees the exit without reaping, so the group id (the child's pid,
// held by the zombie) cannot belong to anyone else yet; what the child left
// behind dies at once, its output pipe with it.
func (c *Cmd) watch() {
	go func() {
		for {
			var info unix.Siginfo
			err := unix.Waitid(unix.P_PID, c.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				break // exited (or not waitable: exec's Wait says why)
			}
		}
		c.sweep()
		close(c.swept)
	}()
}

// reap lets exec's Wait reap the child once its group was swept.
func (c *Cmd) reap() error {
	<-c.swept
	return c.Cmd.Wait()
}
