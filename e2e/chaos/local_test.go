package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// Fault 1: kill -9 of a worker process mid-batch, four times at random
// moments of the sale, each restarted 100–400ms later. A killed worker's
// unacked deliveries go back to the queue; the idempotent insert absorbs what
// it had committed but not acked, settle.lua what it had not settled.
func TestWorkerKill9(t *testing.T) {
	local(t)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3, Config: stack.Fast(`batch_size = 20`)})
	sale := s.CreateSale(t, saleID(), 1200, 2)
	c := stack.NewCrowd(sale, 500, 3, "k9")
	c.Spread = 3 * time.Second
	kills, busy := 0, 0
	during(t, s, c, func() {
		for i := range 4 {
			midSale(c, float64(i)*0.15+0.05, float64(i)*0.15+0.18)
			if rs, _, err := s.Res.Sale(context.Background(), sale.ID); err == nil && rs.Pending > 0 {
				busy++ // orders in flight: the victim is likely mid-batch
			}
			w := s.Workers[rand.IntN(len(s.Workers))]
			w.Kill(t)
			kills++
			time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
			w.Start(t)
		}
	})
	s.StartWorkers(t)
	if kills != 4 || busy < 2 {
		t.Fatalf("%d kills, %d of them with orders in flight; want 4 and at least 2", kills, busy)
	}
	c.ExpectContract(t, false)
	s.Finish(t, "worker kill -9 ×4", sale, c)
}

// Fault 2: the backend dies (exit 137, as after kill -9) right after a
// reservation and before its publish — twice, pinned by the test hook
// SECKILL_TEST_CRASH_AFTER_RESERVE. The client retries its key on the other
// backend and gets the pending order (replay, 202); the sweeper must
// re-publish the leaked reservation (or expire it), or the drain never sees
// pending = 0.
func TestBackendKill9BetweenReserveAndPublish(t *testing.T) {
	local(t)
	first := 10 + rand.IntN(40)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 2, Config: stack.Fast(""),
		BackendEnv: map[int][]string{0: {fmt.Sprintf("SECKILL_TEST_CRASH_AFTER_RESERVE=%d", first)}}})
	// More units than the crowd can buy before its end, so reservations still
	// reach the restarted backend however slow the machine is.
	sale := s.CreateSale(t, saleID(), 600, 2)
	c := stack.NewCrowd(sale, 400, 3, "crash")
	c.Spread = 4 * time.Second
	b := s.Backends[0]
	crashes := 0
	var nudges []*stack.Attempt
	during(t, s, c, func() {
		for i := range 2 {
			crashed, sent := waitCrash(t, s, b, c, i)
			nudges = append(nudges, sent...)
			if !crashed {
				t.Errorf("backend did not crash after its reservation (crash %d)", i+1)
				return
			}
			if code := b.ExitCode(); code != 137 {
				t.Errorf("backend exit code %d, want 137 from the hook", code)
			}
			crashes++
			// The second run crashes on its first reservation; the third runs
			// without the hook.
			if i == 0 {
				// No wait for readiness: the crowd may crash it first.
				b.Start(t, "SECKILL_TEST_CRASH_AFTER_RESERVE=1")
				continue
			}
			b.Start(t, "SECKILL_TEST_CRASH_AFTER_RESERVE=")
			b.WaitReady(t, "/readyz")
		}
	})
	if crashes != 2 {
		t.Fatalf("%d crashes, want 2", crashes)
	}
	// A nudge answered 202 sold a unit like any purchase: the ledger holds it.
	c.Attempts = append(c.Attempts, nudges...)
	c.ExpectContract(t, true)
	leaked := 0
	for _, a := range c.Attempts {
		if a.Answers[0] == "error" && a.Status == http.StatusAccepted {
			leaked++ // crashed mid-request, then answered by a replay
		}
	}
	t.Logf("%d attempts lost their connection to the crash and were answered on retry", leaked)
	s.Finish(t, "backend kill -9 after reserve ×2", sale, c)
}

// Fault 4a: SCRIPT FLUSH every 20ms through the sale. Every script call
// falls back from EVALSHA to EVAL on NOSCRIPT, so not a single request may
// fail: every attempt is answered on its first try, with no 503. The stack
// runs on a redis-server of the test's own: the flushes must not empty the
// script cache of the shared one under every other package's tests.
func TestRedisScriptFlush(t *testing.T) {
	local(t)
	own := servicetest.PrivateRedis(t)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 2, RedisURL: "redis://" + own.Addr + "/0"})
	sale := s.CreateSale(t, saleID(), 200, 2)
	c := stack.NewCrowd(sale, 300, 3, "sf")
	c.Spread = 2 * time.Second
	flushes := 0
	stop := make(chan struct{})
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if s.Redis.ScriptFlush(ctx).Err() == nil {
				flushes++
			}
			cancel()
		}
	}()
	during(t, s, c, func() {})
	s.Drain(t, sale, c.Accepted())
	close(stop)
	<-flushed
	if flushes < 10 {
		t.Fatalf("only %d SCRIPT FLUSHes during the sale", flushes)
	}
	for _, a := range c.Attempts {
		if a.Tries != 1 || a.Status == http.StatusServiceUnavailable || a.Status == 0 {
			t.Errorf("%s key %s failed under SCRIPT FLUSH: %v", a.User, a.Key, a.Answers)
		}
	}
	for _, p := range append(append([]*stack.Proc{}, s.Backends...), s.Workers...) {
		if strings.Contains(p.LogText(), "NOSCRIPT") {
			t.Errorf("%s logged a NOSCRIPT error", p.Name)
		}
	}
	t.Logf("%d SCRIPT FLUSHes", flushes)
	s.Finish(t, fmt.Sprintf("redis SCRIPT FLUSH ×%d", flushes), sale, c)
}

// Fault 6: every order message delivered three times (published thrice), and
// two poison messages. Each order is written once; each poison message
// reaches the dead-letter queue exactly once, where a worker's dead-letter
// consumer drops it (it holds no unit) — once: the workers' logs name it once.
func TestDuplicateAndPoisonMessages(t *testing.T) {
	local(t)
	s := stack.New(t, stack.Options{Backends: 1, Workers: 3})
	sale := s.CreateSale(t, saleID(), 100, 1)
	ctx := context.Background()

	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	servicetest.Must(t, ch.Confirm(false), "confirm mode")
	publish := func(id string, body []byte) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, s.Topo.Exchange, s.Topo.RoutingKey, true, false, amqp.Publishing{
			ContentType: ordermsg.ContentType, DeliveryMode: amqp.Persistent, MessageId: id, Body: body,
		})
		servicetest.Must(t, err, "publish")
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish of %s not confirmed: %v %v", id, ok, err)
		}
	}

	// 60 reservations made as the backend makes them, each published 3×,
	// interleaved, plus two poison messages in the middle.
	c := &stack.Crowd{Sale: sale, Retries: 3}
	var msgs [][2]any
	for i := range 60 {
		user := fmt.Sprintf("dup-user-%02d", i)
		key := "k-" + user
		res, err := s.Res.Reserve(ctx, reservation.Request{ActivityID: sale.ID, UserID: user, IdempotencyKey: key,
			Quantity: 1, OrderID: ordermsg.NewOrderID(sale.ID), TTL: 30 * time.Second})
		servicetest.Must(t, err, "reserve")
		if res.Outcome != reservation.Reserved {
			t.Fatalf("reserve: %+v", res)
		}
		o := ordermsg.Order{V: ordermsg.Version, OrderID: res.OrderID, ActivityID: sale.ID, UserID: user, Quantity: 1,
			IdempotencyKey: key, ReservedAt: res.Deadline.Add(-30 * time.Second).UnixMilli(), Deadline: res.Deadline.UnixMilli()}
		body, err := o.Encode()
		servicetest.Must(t, err, "encode")
		msgs = append(msgs, [2]any{o.OrderID, body})
		c.Attempts = append(c.Attempts, &stack.Attempt{User: user, Key: key, Qty: 1, Status: http.StatusAccepted,
			OrderID: o.OrderID, Tries: 1, Answers: []string{"202"}})
	}
	for round := range 3 {
		for i, m := range msgs {
			publish(m[0].(string), m[1].([]byte))
			if round == 1 && i == 30 {
				publish("poison-1", []byte(`{"v":1,"order_id":`))
				bad, _ := json.Marshal(map[string]any{"v": 1, "order_id": "x", "activity_id": sale.ID, "user_id": "u", "quantity": 0})
				publish("poison-2", bad)
			}
		}
	}
	s.Drain(t, sale, c.Accepted())
	dropped := func(id string) int {
		n := 0
		for _, w := range s.Workers {
			for _, line := range strings.Split(w.LogText(), "\n") {
				if strings.Contains(line, "dead-lettered message is no order") && strings.Contains(line, `"message_id":"`+id+`"`) {
					n++
				}
			}
		}
		return n
	}
	stack.WaitFor(t, "2 dead letters consumed", time.Minute, func() bool {
		return dropped("poison-1") >= 1 && dropped("poison-2") >= 1 && s.DeadLetters(t) == 0
	})
	time.Sleep(time.Second) // a second copy would arrive by now
	for _, id := range []string{"poison-1", "poison-2"} {
		if n := dropped(id); n != 1 {
			t.Errorf("%s reached the dead-letter queue %d times, want once", id, n)
		}
	}
	var rows int
	servicetest.Must(t, s.DB.QueryRow("SELECT COUNT(*) FROM orders WHERE activity_id = ?", sale.ID).Scan(&rows), "count")
	if rows != 60 {
		t.Errorf("%d order rows for 60 orders delivered 3× each", rows)
	}
	s.MopUp(t, sale, c)
	s.Check(t, "duplicate deliveries ×3 + 2 poison", sale, c)
}

// waitCrash waits for backend b to exit. Should the crowd finish first (a slow
// machine), more purchases by users outside the crowd are sent to b, until
// one reservation is the one the hook crashes on (the sweeper must resolve
// it like any other leaked reservation); the ones before it are real
// purchases, returned for the ledger.
func waitCrash(t *testing.T, s *stack.Stack, b *stack.Proc, c *stack.Crowd, round int) (bool, []*stack.Attempt) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var nudges []*stack.Attempt
	for {
		select {
		case <-b.Exited():
			return true, nudges
		case <-deadline:
			return false, nudges
		case <-tick.C:
		}
		if c.Done() < c.Size() || len(nudges) >= 50 {
			continue
		}
		a := &stack.Attempt{User: fmt.Sprintf("nudge-%d-%d", round, len(nudges)+1), Qty: 1}
		c.Once(s, b, a)
		nudges = append(nudges, a)
	}
}
