package servicetest

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedis on a port another redis-server holds must move on to the next
// port and hand out its own server, never the one that answers on the taken
// port (a server that failed to bind can take a while to exit).
func TestStartRedisSkipsAHeldPort(t *testing.T) {
	other := PrivateRedis(t)
	_, portText, err := net.SplitHostPort(other.Addr)
	Must(t, err, "split")
	port, _ := strconv.Atoi(portText)
	url := StartRedis(t, port)
	opt, err := redis.ParseURL(url)
	Must(t, err, "parse")
	if opt.Addr == other.Addr {
		t.Fatalf("StartRedis(%d) handed out the server that already held the port", port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mine := redis.NewClient(opt)
	defer mine.Close()
	theirs := redis.NewClient(&redis.Options{Addr: other.Addr})
	defer theirs.Close()
	Must(t, mine.Set(ctx, "owner", "mine", 0).Err(), "set")
	if v, err := theirs.Get(ctx, "owner").Result(); err != redis.Nil {
		t.Fatalf("the other server sees the key: %q %v", v, err)
	}
	// A restart of a private server comes back on its address.
	other.Kill()
	other.Start(t)
	Must(t, theirs.Ping(ctx).Err(), "ping after restart")
}
