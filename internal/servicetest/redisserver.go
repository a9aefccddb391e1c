package servicetest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedis starts a redis-server of the test's own (no persistence) on the
// first free port from firstPort, for faults that must not touch the shared
// server (FLUSHDB, restarts), and stops it when the test ends. It returns
// its URL (db 0). Without redis-server the test is skipped, or fails under CI.
func StartRedis(t testing.TB, firstPort int) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		unavailable(t, "redis-server", err)
	}
	for port := firstPort; port < firstPort+20; port++ {
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--protected-mode", "no")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
		up := false
		for i := 0; i < 200 && !up; i++ {
			select {
			case <-exited:
				i = 200 // port taken: try the next
				continue
			case <-time.After(10 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			up = rdb.Ping(ctx).Err() == nil
			cancel()
		}
		_ = rdb.Close()
		if up {
			t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
			return fmt.Sprintf("redis://127.0.0.1:%d/0", port)
		}
		_ = cmd.Process.Kill()
		<-exited
	}
	t.Fatalf("own redis-server did not start on ports %d..%d", firstPort, firstPort+19)
	return ""
}
