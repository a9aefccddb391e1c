package servicetest

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// FreePort is FreePortOn 127.0.0.1.
func FreePort(t testing.TB) int { return FreePortOn(t, "127.0.0.1") }

// FreePortOn returns a port that was free on ip just now (all of 127/8 is
// local on Linux), claimed until the test ends for every test process on
// the machine: an abstract unix socket named after it, which the kernel
// frees with its holder. The packages' tests run in parallel, a test's
// child binds its port moments after the probe, and a killed server is
// restarted on the same port, so a probe alone would hand one port to two
// tests. Ports come from below the kernel's ephemeral range (32768 and up
// here): a server restarted on its port must not find it taken by one of
// the machine's outgoing connections, which only ever get ephemeral ports.
func FreePortOn(t testing.TB, ip string) int {
	t.Helper()
	for range 500 {
		port := 20000 + rand.IntN(12000)
		claim, err := net.Listen("unix", "@seckill-test-port-"+strconv.Itoa(port))
		if err != nil {
			continue // another test holds it
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			_ = claim.Close()
			continue
		}
		_ = ln.Close()
		t.Cleanup(func() { _ = claim.Close() })
		return port
	}
	unavailable(t, "a free port on "+ip+" between 20000 and 32000", nil)
	return 0
}
