// Package redisnodes runs the commands that have no key (SCAN, INFO, script
// cache checks) where they mean something: on every master of a Redis
// Cluster, on the one node otherwise. A keyless command sent through a
// cluster client reaches one arbitrary node and sees only its slots.
package redisnodes

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// EachMaster calls fn with each master of a cluster (concurrently), or with
// the client itself for one node or a Sentinel-managed master. The first
// error is returned.
func EachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, node redis.Cmdable) error) error {
	if c, ok := rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	}
	return fn(ctx, rdb)
}

// Scan lists the keys matching pattern (SCAN, never KEYS), on every master.
func Scan(ctx context.Context, rdb redis.UniversalClient, pattern string) ([]string, error) {
	var mu sync.Mutex
	var out []string
	err := EachMaster(ctx, rdb, func(ctx context.Context, node redis.Cmdable) error {
		var keys []string
		iter := node.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return err
		}
		mu.Lock()
		out = append(out, keys...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", pattern, err)
	}
	return out, nil
}

// Calls is one node's INFO commandstats: calls per command, by Redis's
// names ("evalsha", "hmget", "cluster|slots").
type Calls map[string]int64

// CommandCalls reads INFO commandstats on every master, keyed by its
// address (a Sentinel-managed master is "FailoverClient").
func CommandCalls(ctx context.Context, rdb redis.UniversalClient) (map[string]Calls, error) {
	var mu sync.Mutex
	out := map[string]Calls{}
	err := EachMaster(ctx, rdb, func(ctx context.Context, node redis.Cmdable) error {
		info, err := node.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		addr := "node"
		if c, ok := node.(interface{ Options() *redis.Options }); ok {
			addr = c.Options().Addr
		}
		calls := ParseCommandStats(info)
		mu.Lock()
		out[addr] = calls
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("info commandstats: %w", err)
	}
	return out, nil
}

// ParseCommandStats reads the calls of each command from an INFO
// commandstats reply ("cmdstat_evalsha:calls=12,usec=...").
func ParseCommandStats(info string) Calls {
	calls := Calls{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					calls[name] = n
				}
			}
		}
	}
	return calls
}

// Since is c minus an earlier reading of the same node; a command whose
// count went down (the node restarted) counts from zero.
func (c Calls) Since(before Calls) Calls {
	d := Calls{}
	for k, n := range c {
		if b := before[k]; b <= n {
			n -= b
		}
		if n > 0 {
			d[k] = n
		}
	}
	return d
}
