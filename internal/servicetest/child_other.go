//go:build !linux

package servicetest

import "syscall"

// childProcAttr: a process group of the child's own (no Pdeathsig outside
// Linux: the watchdog alone kills what a dead test binary left).
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// watch: without waitid's WNOWAIT the group is swept only after exec's Wait
// reaped the child (see reap).
func (c *Cmd) watch() {}

// reap sweeps the group after exec's Wait: a reused group id is then
// possible, if unlikely, and a grandchild holding the output pipe holds
// Wait for childWaitDelay.
func (c *Cmd) reap() error {
	err := c.Cmd.Wait()
	c.sweep()
	return err
}
