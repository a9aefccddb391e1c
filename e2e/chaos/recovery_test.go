package chaos

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// Redis (a redis-server of the test's own) loses a sale while its 202
// orders wait in the queue and the workers are away five times longer than
// the old recovery timer (reservation_ttl + republish_after: 4 s in the fast
// config). Until the workers have drained the orders queued before the
// loss, a retry of each key gets 503 — never a second order id — and
// nothing new is sold (unkeyed purchases get 503); once they did, every key
// gets its own order again, the sale goes on, and the verdict (I1–I5, the
// ledger) holds.
func TestRedisLossWhileWorkersAway(t *testing.T) {
	local(t)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 2, NoStartWorkers: true,
		RedisURL: servicetest.StartRedis(t, 23400), Config: stack.Fast("")})
	s.RedisLost = true
	sale := s.CreateSale(t, saleID(), 100, 1)
	c := stack.NewCrowd(sale, 40, 1, "lossaway")
	c.Resend = 0
	c.Run(s, s.Backends)
	first := map[string]string{}
	for _, a := range c.Attempts {
		if a.Status != http.StatusAccepted {
			t.Fatalf("%s before the loss: %v", a.User, a.Answers)
		}
		first[a.User+":"+a.Key] = a.OrderID
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	servicetest.Must(t, s.Redis.FlushDB(ctx).Err(), "FLUSHDB")
	cancel()

	retry := func(tag string) []*stack.Attempt {
		var out []*stack.Attempt
		for _, a := range c.Attempts[:40] {
			out = append(out, &stack.Attempt{User: a.User, Key: a.Key, Qty: a.Qty})
		}
		for i := range 10 {
			out = append(out, &stack.Attempt{User: "lossaway-new-" + tag + string(rune('a'+i)), Qty: 1})
		}
		rc := &stack.Crowd{Sale: sale, Attempts: out, Workers: 8}
		rc.Run(s, s.Backends)
		c.Attempts = append(c.Attempts, rc.Attempts...)
		return rc.Attempts
	}
	deadline := time.Now().Add(20 * time.Second) // 5× the old window
	for round := 0; time.Now().Before(deadline); round++ {
		for _, a := range retry("r" + string(rune('0'+round%10))) {
			switch {
			case a.Status == http.StatusServiceUnavailable:
			case a.Key != "" && a.Status == http.StatusAccepted && a.OrderID == first[a.User+":"+a.Key]:
				// its own order: never wrong (MySQL cannot know it yet, though)
			default:
				t.Errorf("%s key %q while the sale recovers and the workers are away: %v (order %s, first %s)",
					a.User, a.Key, a.Answers, a.OrderID, first[a.User+":"+a.Key])
			}
		}
		time.Sleep(2 * time.Second)
	}
	s.StartWorkers(t)
	// A key whose order MySQL holds is answered while the sale still
	// recovers: the end is the recovering mark's (the drain marker passed
	// every consumer of every partition, the counters synced from MySQL).
	recovering := reservation.KeysFor(s.Prefix, sale.ID).Recovering
	stack.WaitFor(t, "the recovery to end", time.Minute, func() bool {
		probe := &stack.Attempt{User: c.Attempts[0].User, Key: c.Attempts[0].Key, Qty: 1}
		(&stack.Crowd{Sale: sale, Attempts: []*stack.Attempt{probe}}).Run(s, s.Backends)
		c.Attempts = append(c.Attempts, probe)
		n, err := s.Redis.Exists(context.Background(), recovering).Result()
		return probe.Status == http.StatusAccepted && err == nil && n == 0
	})
	for _, a := range retry("after") {
		if a.Key != "" && (a.Status != http.StatusAccepted || a.OrderID != first[a.User+":"+a.Key]) {
			t.Errorf("%s after the drain: %v order %s, want its first order %s", a.User, a.Answers, a.OrderID, first[a.User+":"+a.Key])
		}
		if a.Key == "" && a.Status != http.StatusAccepted {
			t.Errorf("%s (new) after the drain: %v", a.User, a.Answers)
		}
	}
	s.Finish(t, "redis loss with the workers away", sale, c)
}
