// Package saletest gives a test its own share of the stores a sale lives in:
// a Redis key prefix with the scripts loaded, a MySQL database with the
// schema, and the reservation store over them; and the sales and orders the
// worker-side tests start from.
package saletest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/lua"
)

// Rig is one test's isolated Redis prefix, database and reservation store.
type Rig struct {
	Redis  redis.UniversalClient
	Prefix string
	Store  *reservation.Store
	DB     *sql.DB
}

// New returns the test's rig; everything is closed or dropped at its end.
func New(t testing.TB) *Rig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb, prefix := servicetest.Redis(t)
	servicetest.Must(t, lua.Preload(ctx, rdb), "preload")
	mc := conf.Default().MySQL
	mc.DSN = servicetest.MySQLDSN(t)
	db, err := schema.Open(ctx, mc)
	servicetest.Must(t, err, "open mysql")
	t.Cleanup(func() { _ = db.Close() })
	return &Rig{Redis: rdb, Prefix: prefix, Store: reservation.New(rdb, prefix), DB: db}
}

// Open creates sale id in MySQL and in Redis (generation 0, nothing sold):
// stock units, limit per user, open from start to end (both kept to the
// millisecond, as MySQL stores them).
func (r *Rig) Open(t testing.TB, id, stock, limit int64, start, end time.Time) {
	t.Helper()
	r.OpenSharded(t, id, stock, limit, 1, start, end)
}

// OpenSharded is Open for a sale of shards stock shards.
func (r *Rig) OpenSharded(t testing.TB, id, stock, limit int64, shards int, start, end time.Time) {
	t.Helper()
	start, end = start.UTC().Truncate(time.Millisecond), end.UTC().Truncate(time.Millisecond)
	_, err := r.DB.Exec(`INSERT INTO activities (id, total_stock, stock, sold, per_user_limit, starts_at, ends_at, stock_shards)
		VALUES (?, ?, ?, 0, ?, ?, ?, ?)`, id, stock, stock, limit, start, end, shards)
	servicetest.Must(t, err, "insert activity %d", id)
	out, _, err := r.Store.Warm(context.Background(), id, reservation.WarmArgs{Total: stock, Limit: limit,
		Start: start, End: end, Users: map[string]int64{}, Shards: shards})
	servicetest.Must(t, err, "warm %d", id)
	if out != reservation.WarmCreated {
		t.Fatalf("warm %d: %v, want created", id, out)
	}
}

// Commit writes what a worker's transaction writes for one confirmed order
// (key "" for none); Redis is not settled.
func (r *Rig) Commit(t testing.TB, id int64, oid, user, key string, qty int64) {
	t.Helper()
	tx, err := r.DB.Begin()
	servicetest.Must(t, err, "begin")
	defer func() { _ = tx.Rollback() }()
	_, err = tx.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status, idempotency_key)
		VALUES (?, ?, ?, ?, 'confirmed', NULLIF(?, ''))`, oid, id, user, qty, key)
	servicetest.Must(t, err, "insert order")
	_, err = tx.Exec(`INSERT INTO purchases (activity_id, user_id, quantity) VALUES (?, ?, ?)
		ON DUPLICATE KEY UPDATE quantity = quantity + VALUES(quantity)`, id, user, qty)
	servicetest.Must(t, err, "insert purchase")
	_, err = tx.Exec(`UPDATE activities SET stock = stock - ?, sold = sold + ? WHERE id = ? AND stock >= ?`, qty, qty, id, qty)
	servicetest.Must(t, err, "update stock")
	servicetest.Must(t, tx.Commit(), "commit")
}
