package verify

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/internal/brokertest"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// drainFixture declares a real order queue, puts n messages in it and sets
// the activity's pending count in Redis.
func drainFixture(t *testing.T, n int, pending int64) (*Drainer, *amqp.Channel) {
	t.Helper()
	rc, topo, ch := brokertest.Declare(t)
	brokertest.Publish(t, ch, topo.Exchange, topo.RoutingKey, n)
	rdb, prefix := servicetest.Redis(t)
	rdb.HSet(context.Background(), reservation.KeysFor(prefix, actID).Meta, "total", 10, "pending", pending, "buckets", drainBuckets)
	d := &Drainer{DB: openDB(t), Redis: rdb, Prefix: prefix, AMQPURL: rc.URL, Queue: topo.Queue,
		DeadQueue: topo.DeadQueue, Poll: 20 * time.Millisecond}
	return d, ch
}

// The drain waits for both the queue and Redis, and measures what MySQL
// gained meanwhile.
func TestDrainWaitsForQueueAndPending(t *testing.T) {
	d, ch := drainFixture(t, 3, 2)
	// The "worker" starts once the drain took its first look (a fixed head
	// start was overtaken by a slow first AMQP dial on a loaded machine).
	looked := make(chan struct{})
	var once sync.Once
	tick := func(DrainStatus, time.Duration) { once.Do(func() { close(looked) }) }
	go func() {
		// A "worker": takes the messages, writes orders, settles Redis.
		<-looked
		for i := 0; i < 3; i++ {
			for {
				if m, ok, err := ch.Get(d.Queue, false); err == nil && ok {
					_ = m.Ack(false)
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			_, _ = d.DB.Exec("INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?, ?, 'u', 1, 'confirmed')",
				"d"+string(rune('a'+i)), actID)
		}
		time.Sleep(100 * time.Millisecond)
		d.Redis.HSet(context.Background(), reservation.KeysFor(d.Prefix, actID).Meta, "pending", 0)
	}()
	res, err := d.Wait(context.Background(), actID, 20*time.Second, tick)
	servicetest.Must(t, err, "wait")
	if !res.Drained || res.Problem != "" {
		t.Fatalf("not drained: %+v", res)
	}
	if res.Start.Ready != 3 || res.Start.Pending != 2 {
		t.Errorf("first observation %+v, want 3 ready, 2 pending", res.Start)
	}
	if res.Orders != 3 || res.Rate <= 0 || res.Elapsed < 100*time.Millisecond {
		t.Errorf("orders %d rate %.1f after %s", res.Orders, res.Rate, res.Elapsed)
	}
}

// A queue that never drains ends the wait at the timeout, with the reason.
func TestDrainTimeout(t *testing.T) {
	d, _ := drainFixture(t, 1, 1)
	res, err := d.Wait(context.Background(), actID, 300*time.Millisecond, nil)
	servicetest.Must(t, err, "wait")
	if res.Drained || !strings.Contains(res.Problem, "1 ready, 1 pending") {
		t.Errorf("got %+v", res)
	}
}

func TestDrainMissingQueue(t *testing.T) {
	d, _ := drainFixture(t, 0, 0)
	d.Queue = d.Queue + ".nope"
	_, err := d.Wait(context.Background(), actID, time.Second, nil)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("got %v", err)
	}
}

// drainBuckets is the bucket count of the drain fixture's sale: several, so
// that its records are read from more than one hash.
const drainBuckets = 4

// An accepted order keeps the drain waiting until it is decided: a MySQL
// row, or failed in Redis.
func TestDrainWaitsForAcceptedOrders(t *testing.T) {
	d, _ := drainFixture(t, 0, 0)
	d.Accepted = []string{"a1", "a2"}
	keys := reservation.KeysFor(d.Prefix, actID)
	d.Redis.HSet(context.Background(), keys.Order(drainBuckets, "a1"), "a1", "P1|u||")
	d.Redis.HSet(context.Background(), keys.Order(drainBuckets, "a2"), "a2", "K1|u")
	res, err := d.Wait(context.Background(), actID, 300*time.Millisecond, nil)
	servicetest.Must(t, err, "wait")
	if res.Drained || res.Final.Undecided != 2 || !strings.Contains(res.Problem, "2 accepted orders undecided") {
		t.Fatalf("got %+v", res)
	}
	d.Redis.HSet(context.Background(), keys.Order(drainBuckets, "a1"), "a1", "F1|u|released")
	_, err = d.DB.Exec("INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES ('a2', ?, 'u', 1, 'confirmed')", actID)
	servicetest.Must(t, err, "insert")
	if res, err = d.Wait(context.Background(), actID, 5*time.Second, nil); err != nil || !res.Drained {
		t.Fatalf("not drained: %+v %v", res, err)
	}
}

// A sale Redis lost is not drained: the reconciler rebuilds it first.
func TestDrainWaitsForTheSaleInRedis(t *testing.T) {
	d, _ := drainFixture(t, 0, 0)
	d.Redis.Del(context.Background(), reservation.KeysFor(d.Prefix, actID).Meta)
	res, err := d.Wait(context.Background(), actID, 200*time.Millisecond, nil)
	servicetest.Must(t, err, "wait")
	if res.Drained || !strings.Contains(res.Problem, "sale missing in Redis") {
		t.Errorf("got %+v", res)
	}
}

// The drain time ends at the first empty observation, not after the
// rabbitmqctl rounds that confirm it: its count lags (here a stand-in that
// takes 300 ms a call and reports one stale unacked message twice).
func TestDrainTimeEndsWhenFirstSeenEmpty(t *testing.T) {
	d, _ := drainFixture(t, 0, 0)
	dir := t.TempDir()
	calls := dir + "/calls"
	script := dir + "/rabbitmqctl"
	servicetest.Must(t, os.WriteFile(script, []byte(`#!/bin/sh
sleep 0.3
echo x >> `+calls+`
n=$(wc -l < `+calls+`)
if [ "$n" -le 2 ]; then echo "`+d.Queue+` 1"; else echo "`+d.Queue+` 0"; fi
`), 0o755), "script")
	d.Rabbitmqctl = script
	start := time.Now()
	res, err := d.Wait(context.Background(), actID, 10*time.Second, nil)
	servicetest.Must(t, err, "wait")
	took := time.Since(start)
	if !res.Drained || !res.Final.UnackedKnown || res.Final.Unacked != 0 {
		t.Fatalf("got %+v", res)
	}
	if took < 900*time.Millisecond || res.Elapsed > took-800*time.Millisecond {
		t.Fatalf("drain time %v of a wait of %v: want the time of the first empty observation, before the 3 rabbitmqctl rounds", res.Elapsed, took)
	}
}
