// Package lua holds the Redis scripts of seckill, embedded at build time, one
// *redis.Script per .lua file but record.lua, which holds the encodings of
// order records and user entries and is put before the scripts that use them.
// Each script opens with a header naming its KEYS, ARGV and return values. Every key of one script shares a hash tag ({act:ID})
// so the scripts run unchanged on Redis Cluster, and Redis TIME is their clock.
package lua

import (
	"context"
	"embed"
	"fmt"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/backoff"
)

//go:embed *.lua
var files embed.FS

// registry holds every script, so that Preload can load them all.
var registry = map[string]*redis.Script{}

// load makes the script of file name, with the files of libs (shared
// functions, such as record.lua's encodings) put before it.
func load(name string, libs ...string) *redis.Script {
	var src []byte
	for _, f := range append(libs, name) {
		b, err := files.ReadFile(f)
		if err != nil {
			// The file is embedded at build time; missing means the build is broken.
			panic(fmt.Sprintf("lua: %s not embedded: %v", f, err))
		}
		src = append(src, b...)
	}
	s := redis.NewScript(string(src))
	registry[name] = s
	return s
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
	bo := backoff.New(50*time.Millisecond, time.Second)
	for _, n := range Names() {
		for {
			err := registry[n].Load(ctx, rdb).Err()
			if err == nil {
				break
			}
			if !backoff.Sleep(ctx, bo.Next()) {
				return fmt.Errorf("load script %s: %w", n, err)
			}
		}
		bo.Reset()
	}
	return nil
}
