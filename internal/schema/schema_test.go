package schema_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
)

// TestEnsureAddsIndexToOldSchema: a database created before orders_user_key
// gets the index from Ensure, also when several processes start at once.
func TestEnsureAddsIndexToOldSchema(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", servicetest.MySQLDSN(t))
	servicetest.Must(t, err, "open")
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := strings.Replace(schema.Statements[1], "UNIQUE KEY orders_user_key (activity_id, user_id, idempotency_key),", "", 1)
	if old == schema.Statements[1] {
		t.Fatal("orders DDL has no orders_user_key to remove")
	}
	_, err = db.ExecContext(ctx, old)
	servicetest.Must(t, err, "old orders table")
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := schema.Ensure(ctx, db); err != nil {
				t.Errorf("ensure: %v", err)
			}
		}()
	}
	wg.Wait()
	var n int
	servicetest.Must(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.statistics
		WHERE table_schema = DATABASE() AND table_name = 'orders' AND index_name = 'orders_user_key' AND non_unique = 0`).Scan(&n), "index")
	if n != 3 {
		t.Fatalf("orders_user_key covers %d columns as a unique index, want 3", n)
	}
	_, err = db.ExecContext(ctx, `INSERT INTO orders (order_id, activity_id, user_id, quantity, status, idempotency_key)
		VALUES ('1-a', 1, 'u', 1, 'confirmed', 'k'), ('1-b', 1, 'u', 1, 'confirmed', NULL), ('1-c', 1, 'u', 1, 'confirmed', NULL)`)
	servicetest.Must(t, err, "NULL keys never collide")
	if _, err = db.ExecContext(ctx, `INSERT INTO orders (order_id, activity_id, user_id, quantity, status, idempotency_key)
		VALUES ('1-d', 1, 'u', 1, 'confirmed', 'k')`); err == nil {
		t.Fatal("a second order of key k was stored")
	}
}
