// Package lua holds the Redis scripts of seckill, embedded at build time, one
// *Script per .lua file but record.lua, which holds the encodings of
// order records and user entries, and room_lib.lua, the waiting room's
// shared functions; each is put before the scripts that use it.
// Each script opens with a header naming its KEYS, ARGV and return values. Every key of one script shares a hash tag ({act:ID};
// {room:<rule>:<activity>} for a waiting room; {seckill:drain} for the drain markers' consumer registry and passes) so the scripts run unchanged on Redis Cluster, and Redis TIME is their clock.
package lua

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/backoff"
)

//go:embed *.lua
var files embed.FS

// registry holds every script, so that Preload can load them all.
var registry = map[string]*Script{}

// load makes the script of file name, with the files of libs (shared
// functions, such as record.lua's encodings) put before it.
func load(name string, libs ...string) *Script {
	var src []byte
	for _, f := range append(libs, name) {
		b, err := files.ReadFile(f)
		if err != nil {
			// The file is embedded at build time; missing means the build is broken.
			panic(fmt.Sprintf("lua: %s not embedded: %v", f, err))
		}
		src = append(src, b...)
	}
	s := &Script{s: redis.NewScript(string(src)), src: string(src)}
	registry[name] = s
	return s
}

// Script is one Redis script. It runs as redis.Script does (EVALSHA, then EVAL
// on NOSCRIPT, on the node the keys hash to, so per node on a cluster), except
// that its commands tell go-redis never to send them again: a script whose
// reply was lost (EOF, a timeout) may have run, and only the caller knows
// whether running it again is safe. Clients are built with MaxRetries -1, but
// go-redis's cluster client also resends a command after a lost reply within
// its redirect loop; NoRetry stops that and leaves MOVED/ASK redirects (the
// node refused the command, it did not run) followed.
type Script struct {
	s   *redis.Script
	src string
}

// Hash is the script's SHA1.
func (s *Script) Hash() string { return s.s.Hash() }

// Load puts the script into the script cache (every master of a cluster).
func (s *Script) Load(ctx context.Context, c redis.Scripter) *redis.StringCmd {
	return s.s.Load(ctx, c)
}

// processor is what can send a custom command: every go-redis client and
// pipeline.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// noRetry marks a command go-redis must not resend after a lost reply. A
// command that never left (no connection could be had: a dead node, a full
// pool) may be sent again: it did not run.
type noRetry struct{ *redis.Cmd }

func (c noRetry) NoRetry() bool { return !neverSent(c.Err()) }

func neverSent(err error) bool {
	var op *net.OpError
	return (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, redis.ErrPoolTimeout)
}

func (s *Script) call(ctx context.Context, c redis.Scripter, name, body string, keys []string, args []any) *redis.Cmd {
	p, ok := c.(processor)
	if !ok {
		// Not a go-redis client or pipeline: no redirect loop to guard.
		if name == "evalsha" {
			return c.EvalSha(ctx, body, keys, args...)
		}
		return c.Eval(ctx, body, keys, args...)
	}
	argv := make([]any, 0, 3+len(keys)+len(args))
	argv = append(argv, name, body, len(keys))
	for _, k := range keys {
		argv = append(argv, k)
	}
	argv = append(argv, args...)
	cmd := redis.NewCmd(ctx, argv...)
	_ = p.Process(ctx, noRetry{cmd})
	return cmd
}

// EvalSha runs the script by hash (in a pipeline: queues it).
func (s *Script) EvalSha(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	return s.call(ctx, c, "evalsha", s.s.Hash(), keys, args)
}

// Eval runs the script by source.
func (s *Script) Eval(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	return s.call(ctx, c, "eval", s.src, keys, args)
}

// Run runs the script by hash and, when the node does not hold it
// (NOSCRIPT: a flushed cache, a promoted replica), by source on that node.
// Not for a pipeline: queued commands have no reply yet.
func (s *Script) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	r := s.EvalSha(ctx, c, keys, args...)
	if err := r.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		return s.Eval(ctx, c, keys, args...)
	}
	return r
}

// Names lists the embedded scripts.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Preload loads every script into the script cache of rdb, so that the first
// EVALSHA of each finds it. Scripts still run after a SCRIPT FLUSH: go-redis's
// Script.Run falls back to EVAL on NOSCRIPT.
func Preload(ctx context.Context, rdb redis.Scripter) error {
	// A process starting while Redis is slow (a loaded machine, a failover)
	// retries a failed load until ctx ends, rather than exit on one timeout.
	for _, n := range Names() {
		var last error
		if backoff.Retry(ctx, backoff.Policy{Site: "script_load", Min: 50 * time.Millisecond, Max: time.Second},
			func(ctx context.Context) error {
				last = registry[n].Load(ctx, rdb).Err()
				return last
			}) != nil {
			return fmt.Errorf("load script %s: %w", n, last)
		}
	}
	return nil
}
