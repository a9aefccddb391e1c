package chaos

import (
	"net/http"
	"testing"
	"time"

	"github.com/seckill/seckill/e2e/internal/stack"
)

// Workers (with their sweepers) stopped for 3 minutes while 5,000 orders
// are accepted, then started: the sweeper that starts with them finds every
// reservation far past its deadline and grace (2 s + 2 s) but leaves the
// queued ones to the consumers, so all 5,000 confirm and none expires.
// Under SECKILL_CHAOS=1 (it waits 3 minutes).
func TestWorkersAwayThreeMinutes(t *testing.T) {
	shared(t)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 2, NoStartWorkers: true, Config: stack.Fast("")})
	sale := s.CreateSale(t, saleID(), 5000, 1)
	c := stack.NewCrowd(sale, 5000, 1, "away")
	c.Run(s, s.Backends)
	// Every fourth keyed attempt re-sends its key (Crowd.Resend): count orders,
	// not answers.
	orders := map[string]bool{}
	for _, a := range c.Accepted() {
		orders[a.OrderID] = true
	}
	if len(orders) != 5000 {
		t.Fatalf("with the workers away: %d orders accepted (answers %v), want 5000", len(orders), c.Answers())
	}
	if n, err := s.QueueDepth(t); err != nil || n != 5000 {
		t.Fatalf("queue depth %d (%v), want 5000", n, err)
	}
	time.Sleep(3 * time.Minute)
	s.StartWorkers(t)
	v := s.Finish(t, "workers away 3 minutes, 5,000 queued", sale, c)
	if v.ConfirmedOrders != 5000 || v.FailReasons["expired"] != 0 {
		t.Errorf("after the outage: %d confirmed, failures %v; want 5000 confirmed, none expired", v.ConfirmedOrders, v.FailReasons)
	}
	for _, a := range c.Attempts {
		if a.Status != http.StatusAccepted {
			t.Errorf("%s: %v", a.User, a.Answers)
		}
	}
}
