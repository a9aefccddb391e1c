// Package redisnodes runs the commands that have no key (SCAN, INFO, script
// cache checks) where they mean something: on every master of a Redis
// Cluster, on the one node otherwise. A keyless command sent through a
// cluster client reaches one arbitrary node and sees only its slots.
package redisnodes

import (
	"context"
	"fmt"
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
