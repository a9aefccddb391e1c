// Package e2e proves the purchase path end to end: real binaries (2 backends,
// 3 workers) on an isolated stack of the real Redis, MariaDB and RabbitMQ,
// a crowd buying concurrently, then invariants I1–I5 (docs/invariants.md) checked
// in MySQL and Redis after the queue drained. The stack and its checks live in
// e2e/internal/stack, shared with the fault-injection suite (e2e/chaos).
package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stack.RemoveBinaries()
	os.Exit(code)
}

const (
	activityID = 42
	stock      = 100
	limit      = 2
	nUsers     = 1000
	perUser    = 5 // attempts per user: 5,000 in all
)

func TestPurchaseInvariantsUnderConcurrency(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3})
	sale := s.CreateSale(t, activityID, stock, limit)

	// 1,000 users × 5 attempts, shuffled, round robin over both backends.
	// Every fourth user asks for 2 units first; later attempts retry the
	// Idempotency-Key of earlier ones; some attempts carry no key at all.
	c := stack.NewCrowd(sale, nUsers, perUser, "e2e")
	for i, a := range c.Attempts {
		if strings.HasSuffix(a.Key, "-k2") && i%2 == 1 {
			a.Key = ""
		}
	}
	c.Run(s, s.Backends)
	c.ExpectContract(t, false)
	accepted := c.Accepted()
	if len(accepted) == 0 {
		t.Fatal("no purchase was accepted")
	}

	// Should a late compensation have given units back, MopUp sells them too,
	// so that the sale ends sold out ("sold out" only when nothing is left).
	// I1–I5 in MySQL and Redis, and a purchase after the sale gets 409 sold_out.
	s.Finish(t, "purchase under concurrency", sale, c)

	// Exactly the stock sold: no more (I1), and no unit left unsold.
	var sold, left int64
	servicetest.Must(t, s.DB.QueryRow("SELECT sold, stock FROM activities WHERE id = ?", activityID).Scan(&sold, &left), "sale")
	if sold != stock || left != 0 {
		t.Errorf("sold %d, left %d; want exactly %d sold", sold, left, stock)
	}
}
