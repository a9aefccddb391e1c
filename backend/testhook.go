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

func crashAfterReserve() (int64, error) {
	v := os.Getenv(envCrashAfterReserve)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q: want a positive integer", envCrashAfterReserve, v)
	}
	return n, nil
}

// crashingPublisher is the hook: Publish is only called for a fresh
// reservation, so its Nth call is the Nth reservation.
type crashingPublisher struct {
	next  sale.Publisher
	after int64
	calls atomic.Int64
}

func (p *crashingPublisher) Publish(ctx context.Context, o ordermsg.Order) error {
	if p.calls.Add(1) >= p.after {
		os.Exit(137) // no deferred cleanup, no publish: like kill -9
	}
	return p.next.Publish(ctx, o)
}

func (p *crashingPublisher) PublishMarker(ctx context.Context, m ordermsg.Marker) error {
	return p.next.PublishMarker(ctx, m)
}
