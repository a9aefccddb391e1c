package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/worker/internal/store"
)

const benchBatch = 100

// benchOrders prepares n batches of fresh orders of distinct users.
func benchOrders(n int) [][]store.Order {
	out := make([][]store.Order, n)
	for i := range out {
		out[i] = make([]store.Order, benchBatch)
		for j := range out[i] {
			u := fmt.Sprintf("user%05d", (i*benchBatch+j)%20000)
			out[i][j] = store.Order{Order: order(1, u, 1), Claim: reservation.Claimed}
		}
	}
	return out
}

// BenchmarkBatchInsert compares the worker's batch transaction (redelivery
// check, per-user limit, insert, guarded stock update) with one transaction
// per order (worker-one) and with the raw ceiling:
// a bare transaction of one 100-row INSERT and the stock UPDATE. Both run in
// one process against the same server, so their ratio is what the worker's
// guards cost.
func BenchmarkBatchInsert(b *testing.B) {
	b.Run("worker", func(b *testing.B) {
		db := openDB(b)
		s := newStore(b, db)
		createSale(b, db, 1, 1<<40, 1<<30)
		batches := benchOrders(b.N)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := s.Write(ctx, 1, batches[i]); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "orders/s")
	})
	// The one-at-a-time baseline: the same orders, one transaction each.
	b.Run("worker-one", func(b *testing.B) {
		db := openDB(b)
		s := newStore(b, db)
		createSale(b, db, 1, 1<<40, 1<<30)
		batches := benchOrders(b.N)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			for j := range batches[i] {
				if _, err := s.Write(ctx, 1, batches[i][j:j+1]); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "orders/s")
	})
	b.Run("raw", func(b *testing.B) {
		db := openDB(b)
		createSale(b, db, 1, 1<<40, 1<<30)
		batches := benchOrders(b.N)
		ctx := context.Background()
		insert := "INSERT INTO orders (order_id, activity_id, user_id, quantity, status, reason, idempotency_key, reserved_at) VALUES " +
			strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, 'confirmed', NULL, NULL, ?), ", benchBatch), ", ")
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			args := make([]any, 0, 5*benchBatch)
			for _, o := range batches[i] {
				args = append(args, o.OrderID, o.ActivityID, o.UserID, o.Quantity, ordermsg.Time(o.ReservedAt))
			}
			tx, err := db.BeginTx(ctx, nil)
			servicetest.Must(b, err, "begin")
			if _, err := tx.ExecContext(ctx, insert, args...); err != nil {
				b.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, "UPDATE activities SET stock = stock - ?, sold = sold + ? WHERE id = ? AND stock >= ?",
				benchBatch, benchBatch, 1, benchBatch); err != nil {
				b.Fatal(err)
			}
			servicetest.Must(b, tx.Commit(), "commit")
		}
		b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "orders/s")
	})
}
