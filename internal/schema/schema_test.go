package schema_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/seckill/seckill/conf"
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

// TestReadCommittedIsSetPerConnection: with schema.ReadCommitted a plain
// transaction (no isolation asked for) reads what another connection
// committed meanwhile — READ COMMITTED — on every connection of the pool,
// also one made after the server killed the one before; without the option
// the server's default (REPEATABLE READ) keeps its first snapshot.
func TestReadCommittedIsSetPerConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := conf.Default().MySQL
	c.DSN = servicetest.MySQLDSN(t)
	rc, err := schema.Open(ctx, c, schema.ReadCommitted)
	servicetest.Must(t, err, "open read committed")
	defer rc.Close()
	plain, err := schema.Open(ctx, c)
	servicetest.Must(t, err, "open")
	defer plain.Close()
	next := int64(0)
	// seesNewRow reports whether a transaction on conn sees a row another
	// connection commits after its first read.
	seesNewRow := func(conn *sql.Conn) bool {
		t.Helper()
		tx, err := conn.BeginTx(ctx, nil)
		servicetest.Must(t, err, "begin")
		defer func() { _ = tx.Rollback() }()
		var before, after int
		servicetest.Must(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM activities").Scan(&before), "count")
		next++
		_, err = plain.ExecContext(ctx, `INSERT INTO activities (id, total_stock, stock, per_user_limit, starts_at, ends_at)
			VALUES (?, 1, 1, 1, NOW(), NOW())`, next)
		servicetest.Must(t, err, "insert")
		servicetest.Must(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM activities").Scan(&after), "count")
		return after == before+1
	}
	conns := make([]*sql.Conn, 3)
	for i := range conns {
		conns[i], err = rc.Conn(ctx)
		servicetest.Must(t, err, "conn %d", i)
		if !seesNewRow(conns[i]) {
			t.Errorf("connection %d of the ReadCommitted pool is not READ COMMITTED", i)
		}
	}
	var id int64
	servicetest.Must(t, conns[0].QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id), "connection id")
	for _, cn := range conns {
		servicetest.Must(t, cn.Close(), "release")
	}
	_, err = plain.ExecContext(ctx, "KILL CONNECTION ?", id)
	servicetest.Must(t, err, "kill")
	rc.SetMaxIdleConns(0) // drop the others: what follows is new connections
	rc.SetMaxIdleConns(2)
	for i := range 3 {
		cn, err := rc.Conn(ctx)
		servicetest.Must(t, err, "conn after the kill")
		if !seesNewRow(cn) {
			t.Errorf("connection %d made after the kill is not READ COMMITTED", i)
		}
		servicetest.Must(t, cn.Close(), "release")
	}
	cn, err := plain.Conn(ctx)
	servicetest.Must(t, err, "plain conn")
	defer cn.Close()
	if seesNewRow(cn) {
		t.Error("a pool without the option reads committed too: the test proves nothing")
	}
}

// BenchmarkReadCommittedTx: an empty READ COMMITTED transaction on a pool
// with the level set per connection (schema.ReadCommitted) against one
// asking per transaction (sql.TxOptions, a SET TRANSACTION round trip more).
func BenchmarkReadCommittedTx(b *testing.B) {
	c := conf.Default().MySQL
	c.DSN = servicetest.MySQLDSN(b)
	ctx := context.Background()
	for _, mode := range []string{"per-tx", "per-connection"} {
		b.Run(mode, func(b *testing.B) {
			var opts []schema.Option
			tx := &sql.TxOptions{Isolation: sql.LevelReadCommitted}
			if mode == "per-connection" {
				opts, tx = []schema.Option{schema.ReadCommitted}, nil
			}
			db, err := schema.Open(ctx, c, opts...)
			servicetest.Must(b, err, "open")
			defer db.Close()
			b.ReportAllocs()
			for b.Loop() {
				t, err := db.BeginTx(ctx, tx)
				servicetest.Must(b, err, "begin")
				var one int
				servicetest.Must(b, t.QueryRowContext(ctx, "SELECT 1").Scan(&one), "select")
				servicetest.Must(b, t.Commit(), "commit")
			}
		})
	}
}
