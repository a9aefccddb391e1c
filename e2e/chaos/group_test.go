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

// Fault 2, grouped: the backend dies (exit 137, as after kill -9) between
// the reserve of a group of purchases and the publish of the one message
// carrying their orders — pinned by the test hook SECKILL_TEST_CRASH_AT_GROUP
// at the first group of two or more orders. Every order of that group is
// reserved, unpublished, its client without an answer; the sweeper must
// settle each of them (failed "expired": nobody was told 202, nothing was
// queued), the orders answered 202 before the crash confirm, and Redis and
// MySQL agree on what was sold.
func TestBackendKill9BetweenGroupReserveAndPublish(t *testing.T) {
	local(t)
	s := stack.New(t, stack.Options{Backends: 1, Workers: 1,
		Config:     stack.FastWith("group_max = 16\ngroup_linger = \"20ms\"\ngroup_message = \"batch\"", ""),
		BackendEnv: map[int][]string{0: {"SECKILL_TEST_CRASH_AT_GROUP=2"}}})
	sale := s.CreateSale(t, saleID(), 1000, 1)
	c := stack.NewCrowd(sale, 400, 1, "grp")
	c.Retries, c.Resend, c.Workers = 0, 0, 32
	b := s.Backends[0]
	done := make(chan struct{})
	go func() { defer close(done); c.Run(s, s.Backends) }()
	select {
	case <-b.Exited():
	case <-time.After(time.Minute):
		t.Fatal("the backend never met a group of two orders")
	}
	<-done
	if code := b.ExitCode(); code != 137 {
		t.Fatalf("backend exit code %d, want 137 from the hook", code)
	}
	ctx := context.Background()
	open, err := s.Res.Open(ctx, sale.ID, 10_000)
	servicetest.Must(t, err, "open orders")
	// The group the hook stopped at, and any other reserved beside it
	// (groups of one shard run side by side past max or linger).
	var group []reservation.Record
	for _, rec := range open {
		if !rec.Queued {
			group = append(group, rec)
		}
	}
	if len(group) < 2 {
		t.Fatalf("%d reserved orders never published at the crash, want the group's (2 or more); open %+v", len(group), open)
	}
	accepted := map[string]bool{}
	for _, a := range c.Attempts {
		if a.Status == http.StatusAccepted {
			accepted[a.OrderID] = true
		}
	}
	for _, rec := range group {
		if accepted[rec.OrderID] {
			t.Errorf("order %s of the crashed group was answered 202", rec.OrderID)
		}
	}
	// The sweeper settles every order of the group: failed, expired, in
	// MySQL and in Redis, and nothing stays pending.
	stack.WaitFor(t, "the sweeper settles the group", time.Minute, func() bool {
		rs, _, err := s.Res.Sale(ctx, sale.ID)
		return err == nil && rs.Pending == 0
	})
	for _, rec := range group {
		var status, reason string
		servicetest.Must(t, s.DB.QueryRowContext(ctx, `SELECT status, reason FROM orders WHERE order_id = ?`, rec.OrderID).Scan(&status, &reason), "row of %s", rec.OrderID)
		if status != "failed" || reason != "expired" {
			t.Errorf("order %s of the crashed group: %s/%s in MySQL, want failed/expired", rec.OrderID, status, reason)
		}
		if r, found, err := s.Res.Order(ctx, sale.ID, rec.OrderID); err != nil || !found || r.State != reservation.Failed {
			t.Errorf("order %s of the crashed group: %+v %v %v in Redis, want failed", rec.OrderID, r, found, err)
		}
	}
	// Every 202 confirmed (an order published before the crash may confirm
	// with its client unanswered: its outcome was unknown, not "nothing
	// kept"); units sold are the confirmed orders'; Redis agrees with MySQL.
	for id := range accepted {
		var status string
		servicetest.Must(t, s.DB.QueryRowContext(ctx, `SELECT status FROM orders WHERE order_id = ?`, id).Scan(&status), "row of %s", id)
		if status != "confirmed" {
			t.Errorf("order %s answered 202 ended %s", id, status)
		}
	}
	var confirmed, sold, stock int64
	servicetest.Must(t, s.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders WHERE activity_id = ? AND status = 'confirmed'`, sale.ID).Scan(&confirmed), "confirmed")
	servicetest.Must(t, s.DB.QueryRowContext(ctx, `SELECT sold, stock FROM activities WHERE id = ?`, sale.ID).Scan(&sold, &stock), "sale row")
	rs, _, err := s.Res.Sale(ctx, sale.ID)
	servicetest.Must(t, err, "redis sale")
	if sold != confirmed || sold+stock != sale.Stock || rs.Sold != sold {
		t.Errorf("%d confirmed, MySQL sold %d stock %d, Redis sold %d: want sold = confirmed everywhere (stock %d)",
			confirmed, sold, stock, rs.Sold, sale.Stock)
	}
	t.Logf("crash with %d orders reserved in groups and unpublished, %d answered 202 before, %d confirmed; answers %s",
		len(group), len(accepted), confirmed, c.Summary())
}
