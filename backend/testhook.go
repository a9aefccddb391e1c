package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"

	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/internal/ordermsg"
)

// envCrashAfterReserve arms a fault-injection hook for the chaos tests
// (e2e/chaos): with SECKILL_TEST_CRASH_AFTER_RESERVE=N the backend exits with
// status 137, as if killed by SIGKILL, after the Nth reservation and before
// that order is published — the moment that leaks a pending reservation the
// sweeper must resolve. Unset (the default) the hook is inert.
const envCrashAfterReserve = "SECKILL_TEST_CRASH_AFTER_RESERVE"

// envCrashAtGroup arms the same exit at the publish of the first group
// message ([backend] group_message = "batch") carrying at least N orders,
// before it is sent: every order of that group is reserved and never
// published (e2e TestBackendCrashBetweenGroupReserveAndPublish).
const envCrashAtGroup = "SECKILL_TEST_CRASH_AT_GROUP"

func crashHooks() (after, group int64, err error) {
	if after, err = positiveEnv(envCrashAfterReserve); err != nil {
		return 0, 0, err
	}
	group, err = positiveEnv(envCrashAtGroup)
	return after, group, err
}

func positiveEnv(name string) (int64, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q: want a positive integer", name, v)
	}
	return n, nil
}

// crashingPublisher is the hook: Publish is only called for a fresh
// reservation, so its Nth call is the Nth reservation (each order of a
// group message counts).
type crashingPublisher struct {
	next         sale.Publisher
	after, group int64
	calls        atomic.Int64
}

func (p *crashingPublisher) Publish(ctx context.Context, o ordermsg.Order) error {
	if p.after > 0 && p.calls.Add(1) >= p.after {
		os.Exit(137) // no deferred cleanup, no publish: like kill -9
	}
	return p.next.Publish(ctx, o)
}

func (p *crashingPublisher) PublishBatch(ctx context.Context, orders []ordermsg.Order) error {
	n := int64(len(orders))
	if (p.after > 0 && p.calls.Add(n) >= p.after) || (p.group > 0 && n >= p.group) {
		os.Exit(137)
	}
	return p.next.PublishBatch(ctx, orders)
}

func (p *crashingPublisher) PublishMarker(ctx context.Context, m ordermsg.Marker) error {
	return p.next.PublishMarker(ctx, m)
}
