package lua

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/servicetest"
)

// counter counts its runs in KEYS[1].
const counterSrc = `return redis.call('INCR', KEYS[1])`

// loseFirstReply makes the first script reply of every node connection
// "lost" after Redis ran it (EOF, as when a connection dies mid-reply).
type loseFirstReply struct{ lost *atomic.Bool }

func (h loseFirstReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h loseFirstReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h loseFirstReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && h.lost.CompareAndSwap(false, true) {
			cmd.SetErr(io.EOF)
			return io.EOF
		}
		return err
	}
}

// On a cluster, go-redis resends a command whose reply was lost inside its
// redirect loop, whatever MaxRetries says. A Script's commands say NoRetry:
// the script runs once and the caller gets the error. go-redis's own
// redis.Script, on the same client, runs twice: the test can fail.
func TestScriptNotResentOnCluster(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.RedisAt(t, servicetest.Cluster(t, 26800))
	cc := rdb.(*redis.ClusterClient)
	var lost atomic.Bool
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(loseFirstReply{&lost}) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Nodes the client knew before the hook was installed get it too.
	servicetest.Must(t, cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
		n.AddHook(loseFirstReply{&lost})
		return nil
	}), "hook nodes")

	ours := &Script{s: redis.NewScript(counterSrc), src: counterSrc}
	theirs := redis.NewScript(counterSrc)
	for _, tc := range []struct {
		name string
		run  func(key string) error
		want int64
	}{
		{"lua.Script", func(k string) error { return ours.Run(ctx, rdb, []string{k}).Err() }, 1},
		{"redis.Script", func(k string) error { return theirs.Run(ctx, rdb, []string{k}).Err() }, 2},
	} {
		key := prefix + "{" + tc.name + "}"
		lost.Store(false)
		err := tc.run(key)
		n, gerr := rdb.Get(ctx, key).Int64()
		servicetest.Must(t, gerr, "get %s", key)
		if n != tc.want {
			t.Errorf("%s: the script ran %d times after one lost reply (err %v), want %d", tc.name, n, err, tc.want)
		}
		if tc.want == 1 && err == nil {
			t.Errorf("%s: a lost reply was answered without error", tc.name)
		}
	}
}

// NOSCRIPT per node: after one master's script cache is flushed (a promoted
// replica never had the script), a pipeline of EVALSHA over keys of every
// master gets NOSCRIPT from that master only; Run then sends EVAL to that
// node. Every key's script ran exactly once.
func TestNoScriptPerNodeInAPipeline(t *testing.T) {
	t.Parallel()
	e := servicetest.StartCluster(t, 26900)
	rdb, prefix := servicetest.RedisAt(t, e.URL)
	cc := rdb.(*redis.ClusterClient)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := &Script{s: redis.NewScript(counterSrc), src: counterSrc}
	servicetest.Must(t, s.Load(ctx, rdb).Err(), "load")
	var once sync.Once
	var flushed string
	servicetest.Must(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		var err error
		once.Do(func() { flushed = n.Options().Addr; err = n.ScriptFlush(ctx).Err() })
		return err
	}), "flush one master")

	keys := make([]string, 60)
	cmds := make([]*redis.Cmd, len(keys))
	pipe := rdb.Pipeline()
	for i := range keys {
		keys[i] = fmt.Sprintf("%s{n%d}", prefix, i)
		cmds[i] = s.EvalSha(ctx, pipe, []string{keys[i]})
	}
	_, _ = pipe.Exec(ctx)
	noscript := 0
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			if !redis.HasErrorPrefix(err, "NOSCRIPT") {
				t.Fatalf("key %s: %v", keys[i], err)
			}
			noscript++
			servicetest.Must(t, s.Run(ctx, rdb, []string{keys[i]}).Err(), "run after NOSCRIPT")
		}
	}
	if noscript == 0 || noscript == len(keys) {
		t.Errorf("%d of %d calls got NOSCRIPT with only %s flushed; want some, not all", noscript, len(keys), flushed)
	}
	for _, k := range keys {
		if n, err := rdb.Get(ctx, k).Int64(); err != nil || n != 1 {
			t.Errorf("key %s ran %d times (%v), want 1", k, n, err)
		}
	}
}
