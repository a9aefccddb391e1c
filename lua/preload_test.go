package lua

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/servicetest"
)

// A process starting while Redis loses replies (a loaded machine, a
// failover) keeps loading its scripts until they are in, instead of exiting
// on the first timeout; with Redis gone for good it gives up when ctx ends.
func TestPreloadRetriesUntilLoaded(t *testing.T) {
	t.Parallel()
	direct, _ := servicetest.RedisNode(t)
	fp, err := faultnet.Listen("127.0.0.1:0", direct.Options().Addr)
	servicetest.Must(t, err, "fault proxy")
	t.Cleanup(func() { _ = fp.Close() })
	opt := *direct.Options()
	opt.Addr, opt.MaxRetries, opt.ReadTimeout = fp.Addr(), -1, 200*time.Millisecond
	rdb := redis.NewClient(&opt)
	t.Cleanup(func() { _ = rdb.Close() })

	// The first two SCRIPT LOAD requests never reach Redis.
	for range 2 {
		fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains("load"), Cut: true})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Preload(ctx, rdb); err != nil {
		t.Fatalf("preload through two lost requests: %v", err)
	}
	for _, n := range Names() {
		ok, err := direct.ScriptExists(ctx, registry[n].Hash()).Result()
		servicetest.Must(t, err, "script exists")
		if !ok[0] {
			t.Errorf("%s not in the script cache", n)
		}
	}

	// Every request cut: Preload returns the error once ctx ends.
	fp.Set(faultnet.Faults{Up: faultnet.Flow{CutRate: 1}})
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	start := time.Now()
	err = Preload(short, rdb)
	if err == nil || !strings.Contains(err.Error(), "load script") {
		t.Fatalf("preload with Redis unreachable = %v, want a load error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("preload gave up after %v, want about its 500ms context", d)
	}
}
