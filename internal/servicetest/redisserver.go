package servicetest

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// StartRedis starts a redis-server of the test's own (no persistence) on the
// first free port from firstPort, for faults that must not touch the shared
// server (FLUSHDB, restarts), and stops it when the test ends. It returns
// its URL (db 0). Without redis-server the test is skipped, or fails under CI.
func StartRedis(t testing.TB, firstPort int) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server", err)
	}
	var errs []string
	for port := firstPort; port < firstPort+20; port++ {
		p := redisServer(t, bin, port)
		if err := p.startRedis(); err != nil {
			errs = append(errs, err.Error()) // port taken: try the next
			if errors.Is(err, errNoAnswer) {
				break // not a lost port: another try would wait as long again
			}
			continue
		}
		t.Cleanup(p.Kill)
		return fmt.Sprintf("redis://%s/0", p.Addr)
	}
	t.Fatalf("own redis-server did not start on ports %d..%d: %s", firstPort, firstPort+19, strings.Join(errs, "; "))
	return ""
}
