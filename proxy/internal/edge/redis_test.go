package edge

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/servicetest"
)

func killRedis(t *testing.T, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	_ = rdb.Shutdown(context.Background()).Err()
}

func pauseRedis(t *testing.T, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	servicetest.Must(t, rdb.Do(context.Background(), "CLIENT", "PAUSE", "30000", "ALL").Err(), "client pause")
	t.Cleanup(func() {
		r := redis.NewClient(&redis.Options{Addr: addr})
		_ = r.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
		_ = r.Close()
	})
}

// slowProxy forwards TCP to addr, holding every chunk from the server for d
// (internal/faultnet: later chunks of a connection wait behind it).
func slowProxy(t *testing.T, addr string, d time.Duration) string {
	t.Helper()
	p, err := faultnet.Listen("127.0.0.1:0", addr)
	servicetest.Must(t, err, "fault proxy")
	t.Cleanup(func() { p.Close() })
	p.Set(faultnet.Faults{Down: faultnet.Flow{DelayRate: 1, Delay: d}})
	return p.Addr()
}

// The proxy is not ready until its stock-event subscription is confirmed:
// the confirmation is held at the network (the SUBSCRIBE reply), /readyz
// answers 503 meanwhile and 200 once it is let through.
func TestReadyWaitsForTheStockEventSubscription(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	px := startProxy(t, cfg)
	node, _ := servicetest.RedisNode(t)
	fp, err := faultnet.Listen("127.0.0.1:0", node.Options().Addr)
	servicetest.Must(t, err, "fault proxy")
	t.Cleanup(func() { fp.Close() })
	release := make(chan struct{})
	held := fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("subscribe"), Hold: release})
	rdb := redis.NewClient(&redis.Options{Addr: fp.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })

	subscribed := make(chan struct{})
	px.p.Handler.Subscribed = subscribed
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { px.p.WatchStockEvents(ctx, rdb, slog.New(slog.DiscardHandler), subscribed); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	readyz := func() (int, string) {
		var c fasthttp.RequestCtx
		c.Request.SetRequestURI("/readyz")
		px.p.Handler.Admin(&c)
		return c.Response.StatusCode(), string(c.Response.Body())
	}

	<-held
	if code, body := readyz(); code != 503 || !strings.Contains(body, "stock events not subscribed") {
		t.Errorf("/readyz with the subscription unconfirmed: %d %s, want 503 naming the stock events", code, body)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for code, body := readyz(); code != 200; code, body = readyz() {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz after the confirmation: %d %s, want 200", code, body)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
