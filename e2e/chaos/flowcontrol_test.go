package chaos

import (
	"net/http"
	"testing"
	"time"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
)

// Broker flow control on a RabbitMQ node of the test's own (the shared
// broker's watermark is never touched): with the memory watermark at 0.0001
// the broker blocks publishers. Every purchase then answers 503 within
// publish_timeout and a small margin, and nothing is kept; once the
// watermark is restored, sales resume. Under SECKILL_CHAOS=1 (an own node
// costs ~20 s of boot on a small machine).
func TestPublishUnderFlowControl(t *testing.T) {
	shared(t)
	node := servicetest.StartRabbit(t, 42811)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 1, AMQPURL: node.URL, Config: stack.Fast("")})
	sale := s.CreateSale(t, saleID(), 400, 1)
	before := stack.NewCrowd(sale, 60, 1, "fc-before")
	before.Run(s, s.Backends)
	if a := before.Answers(); a["202"] != 60 {
		t.Fatalf("before the alarm: %v, want 60×202", a)
	}

	node.Ctl(t, "set_vm_memory_high_watermark", "0.0001")
	blocked := stack.NewCrowd(sale, 150, 1, "fc-blocked")
	blocked.Retries = 0
	for i, a := range blocked.Attempts {
		if i%2 == 0 {
			a.Key = "" // keyed or not: a 503 keeps nothing
		}
	}
	blocked.Run(s, s.Backends)
	const publishTimeout, margin = time.Second, 1500 * time.Millisecond // stack.Fast
	var slowest time.Duration
	for _, a := range blocked.Attempts {
		slowest = max(slowest, a.Elapsed)
		if a.Status != http.StatusServiceUnavailable {
			t.Errorf("%s under flow control: %v, want 503", a.User, a.Answers)
		}
		if a.Elapsed > publishTimeout+margin {
			t.Errorf("%s answered after %v, beyond publish_timeout %v + %v", a.User, a.Elapsed, publishTimeout, margin)
		}
	}
	t.Logf("under flow control: %s; slowest answer %v", blocked.Summary(), slowest)

	node.Ctl(t, "set_vm_memory_high_watermark", "0.4")
	after := stack.NewCrowd(sale, 100, 1, "fc-after")
	deadline := time.Now().Add(time.Minute)
	for {
		probe := &stack.Attempt{User: "fc-probe", Key: "probe-" + time.Now().Format("150405.000"), Qty: 1}
		c := &stack.Crowd{Sale: sale, Workers: 1, Attempts: []*stack.Attempt{probe}}
		c.Run(s, s.Backends[:1])
		if probe.Status == http.StatusAccepted {
			after.Attempts = append(after.Attempts, probe)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sales did not resume within 1m of the restored watermark: %v", probe.Answers)
		}
		time.Sleep(200 * time.Millisecond)
	}
	after.Run(s, s.Backends)
	if a := after.Answers(); a["202"] < 100 {
		t.Errorf("after the alarm: %v, want every purchase accepted", a)
	}
	all := &stack.Crowd{Sale: sale, Retries: 3}
	for _, c := range []*stack.Crowd{before, blocked, after} {
		all.Attempts = append(all.Attempts, c.Attempts...)
	}
	s.Finish(t, "rabbitmq flow control (own node)", sale, all)
}
