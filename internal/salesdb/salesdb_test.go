package salesdb_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/salesdb"
	"github.com/seckill/seckill/internal/saletest"
	"github.com/seckill/seckill/internal/servicetest"
)

// commitMany writes n confirmed orders of one unit (n users, with keys) as
// workers would, in bulk.
func commitMany(t testing.TB, r *saletest.Rig, id int64, n int) {
	t.Helper()
	for start := 0; start < n; start += 1000 {
		end := min(start+1000, n)
		var orders, purchases []string
		var oa, pa []any
		for i := start; i < end; i++ {
			u := fmt.Sprintf("u%06d", i)
			orders = append(orders, "(?, ?, ?, 1, 'confirmed', ?)")
			oa = append(oa, ordermsg.NewOrderID(id), id, u, "k"+u)
			purchases = append(purchases, "(?, ?, 1)")
			pa = append(pa, id, u)
		}
		_, err := r.DB.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status, idempotency_key) VALUES `+
			strings.Join(orders, ","), oa...)
		servicetest.Must(t, err, "insert orders")
		_, err = r.DB.Exec(`INSERT INTO purchases (activity_id, user_id, quantity) VALUES `+strings.Join(purchases, ","), pa...)
		servicetest.Must(t, err, "insert purchases")
	}
	_, err := r.DB.Exec(`UPDATE activities SET stock = stock - ?, sold = sold + ? WHERE id = ?`, n, n, id)
	servicetest.Must(t, err, "update stock")
}

// EndRecovery ends only the recovery its token names, and then leaves Redis
// exact: sold and per-user units from MySQL, every decided order's record
// and key back, nothing pending.
func TestEndRecovery(t *testing.T) {
	t.Parallel()
	r := saletest.New(t)
	ctx := context.Background()
	r.Open(t, 3, 100, 1, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	commitMany(t, r, 3, 40) // committed while Redis did not count them
	servicetest.Must(t, r.Store.MarkRecovering(ctx, 3, "tok", time.Hour), "mark recovering")
	if ended, err := salesdb.EndRecovery(ctx, r.DB, r.Store, 3, "other"); err != nil || ended {
		t.Fatalf("end recovery with another token = %v %v, want nothing", ended, err)
	}
	if s, _, _ := r.Store.Sale(ctx, 3); s.Sold != 0 {
		t.Fatalf("a refused end changed sold to %d", s.Sold)
	}
	if ended, err := salesdb.EndRecovery(ctx, r.DB, r.Store, 3, "tok"); err != nil || !ended {
		t.Fatalf("end recovery = %v %v", ended, err)
	}
	if tok, err := r.Store.Recovery(ctx, 3); err != nil || tok != "" {
		t.Errorf("still recovering (%q %v)", tok, err)
	}
	s, _, err := r.Store.Sale(ctx, 3)
	servicetest.Must(t, err, "sale")
	if s.Sold != 40 || s.Pending != 0 {
		t.Errorf("sale after the end: sold %d pending %d, want 40 and 0", s.Sold, s.Pending)
	}
	u, err := r.Store.User(ctx, 3, "u000007")
	servicetest.Must(t, err, "user")
	if u.Held != 1 || len(u.Keys) != 1 {
		t.Errorf("user entry after the end %+v, want 1 unit and its key", u)
	}
	if ended, err := salesdb.EndRecovery(ctx, r.DB, r.Store, 3, "tok"); err != nil || ended {
		t.Errorf("a second end = %v %v, want nothing", ended, err)
	}
}

// The row lock EndRecovery holds (worker commits of the sale wait for it)
// grows with the sale's decided orders: every one is read and restored.
func BenchmarkEndRecovery(b *testing.B) {
	for _, n := range []int{0, 10_000} {
		b.Run(fmt.Sprintf("orders=%d", n), func(b *testing.B) {
			r := saletest.New(b)
			ctx := context.Background()
			r.Open(b, 4, int64(n)+1, 1, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
			commitMany(b, r, 4, n)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				tok := fmt.Sprintf("t%d", i)
				servicetest.Must(b, r.Store.MarkRecovering(ctx, 4, tok, time.Hour), "mark")
				if ended, err := salesdb.EndRecovery(ctx, r.DB, r.Store, 4, tok); err != nil || !ended {
					b.Fatalf("end = %v %v", ended, err)
				}
			}
		})
	}
}
