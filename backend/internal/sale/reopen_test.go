package sale_test

import (
	"context"
	"testing"
	"time"

	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// An admin PUT reopens an archived sale: at the moment the warm makes the
// sale visible again, a keyed replay of a decided order already finds that
// order (its record and key were restored first) and reserves nothing; a new
// buyer can buy. Before, the restore ran after the warm, and a replay in
// between reserved a second order for its key.
func TestReopenRestoresBeforeTheSaleIsVisible(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	first, err := r.purchase("buyer", "k")
	if err != nil || first.Outcome != sale.Accepted {
		t.Fatalf("first = %+v %v", first, err)
	}
	// The worker's decision, in MySQL and Redis.
	_, err = r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status, idempotency_key) VALUES (?, ?, 'buyer', 1, 'confirmed', 'k')`, first.OrderID, act)
	servicetest.Must(t, err, "order row")
	_, err = r.db.Exec(`INSERT INTO purchases (activity_id, user_id, quantity) VALUES (?, 'buyer', 1)`, act)
	servicetest.Must(t, err, "purchases")
	_, err = r.db.Exec(`UPDATE activities SET stock = stock - 1, sold = sold + 1 WHERE id = ?`, act)
	servicetest.Must(t, err, "sold")
	_, err = r.direct.Settle(ctx, act, []reservation.Settlement{{OrderID: first.OrderID, Confirmed: true, Quantity: 1, UserID: "buyer"}})
	servicetest.Must(t, err, "settle")

	// The sale ends and is archived, as the worker's archiver does it.
	_, _, err = r.svc.PutActivity(ctx, act, sale.Spec{Stock: 10, PerUserLimit: 2,
		StartsAt: time.Now().Add(-time.Hour), EndsAt: time.Now().Add(-time.Second)})
	servicetest.Must(t, err, "end the sale")
	var gen int64
	servicetest.Must(t, r.db.QueryRow(`SELECT generation FROM activities WHERE id = ?`, act).Scan(&gen), "generation")
	out, _, err := r.direct.Archive(ctx, act, reservation.ArchiveArgs{Gen: gen, Total: 10, Sold: 1, SummaryTTL: time.Hour})
	servicetest.Must(t, err, "archive")
	if out != reservation.ArchiveDone {
		t.Fatalf("archive = %s", out)
	}
	_, err = r.db.Exec(`UPDATE activities SET archived_at = NOW() WHERE id = ?`, act)
	servicetest.Must(t, err, "archived_at")
	servicetest.Must(t, r.direct.Deactivate(ctx, act), "deactivate")
	if got, err := r.purchase("buyer", "k"); err != nil || got.OrderID != first.OrderID {
		t.Fatalf("replay of the archived order = %+v %v, want %s", got, err, first.OrderID)
	}

	var replay, fresh sale.PurchaseResult
	var replayErr, freshErr error
	hooked := false
	sale.SetAfterWarm(r.svc, func(int64) {
		hooked = true
		replay, replayErr = r.purchase("buyer", "k")
		fresh, freshErr = r.purchase("newbie", "n")
	})
	_, _, err = r.svc.PutActivity(ctx, act, sale.Spec{Stock: 10, PerUserLimit: 2,
		StartsAt: time.Now().Add(-time.Hour), EndsAt: time.Now().Add(time.Hour)})
	servicetest.Must(t, err, "reopen")
	if !hooked {
		t.Fatal("the reopening warm did not build the sale anew")
	}
	if replayErr != nil || replay.OrderID != first.OrderID || !replay.Replay || replay.Status != "confirmed" {
		t.Errorf("replay as the reopened sale appears = %+v %v, want confirmed %s", replay, replayErr, first.OrderID)
	}
	if freshErr != nil || fresh.Outcome != sale.Accepted || fresh.Replay {
		t.Errorf("a new buyer in the reopened sale = %+v %v", fresh, freshErr)
	}
	s := r.sale(t)
	if s.Sold != 1 || s.Pending != 1 {
		t.Errorf("reopened sale %+v, want sold 1 (buyer's) and pending 1 (newbie's)", s)
	}
	if u, _ := r.direct.User(ctx, act, "buyer"); u.Held != 1 || u.Keys["k"] != first.OrderID {
		t.Errorf("buyer's entry %+v, want 1 held and k -> %s", u, first.OrderID)
	}
	if got, err := r.purchase("buyer", "k"); err != nil || got.OrderID != first.OrderID {
		t.Errorf("replay after the reopen = %+v %v, want %s", got, err, first.OrderID)
	}
}
