// Package schema owns the MySQL schema of seckill and opens connections to it.
// MySQL is the truth: the conditional stock update and the per-user totals here
// are the last line against oversell (I1) and over-limit buying (I2).
package schema

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/seckill/seckill/conf"
)

// Statements create the schema; each is idempotent, so several processes may
// run them at once. Every table compares binary (utf8mb4_bin) whatever the
// database's default: user ids are case-sensitive, as they are in Redis.
var Statements = []string{
	`CREATE TABLE IF NOT EXISTS activities (
		id             BIGINT UNSIGNED NOT NULL PRIMARY KEY,
		total_stock    BIGINT NOT NULL,
		stock          BIGINT NOT NULL COMMENT 'units left; the guard of every sale',
		sold           BIGINT NOT NULL DEFAULT 0,
		per_user_limit INT NOT NULL,
		starts_at      DATETIME(3) NOT NULL,
		ends_at        DATETIME(3) NOT NULL,
		generation     BIGINT NOT NULL DEFAULT 0 COMMENT 'bumped by every admin change; the archiver archives only the generation it checked',
		archived_at    DATETIME(3) NULL COMMENT 'set when the sale was archived: Redis holds no per-order state of it',
		stock_shards   INT NOT NULL DEFAULT 1 COMMENT 'stock shards in Redis, fixed when the activity is created',
		created_at     DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
		updated_at     DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
		CONSTRAINT activities_stock_nonneg CHECK (stock >= 0),
		CONSTRAINT activities_balance CHECK (stock + sold = total_stock)
	) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
	`CREATE TABLE IF NOT EXISTS orders (
		order_id        VARCHAR(64) NOT NULL PRIMARY KEY,
		activity_id     BIGINT UNSIGNED NOT NULL,
		user_id         VARCHAR(64) NOT NULL,
		quantity        INT NOT NULL,
		status          ENUM('confirmed','failed') NOT NULL,
		reason          VARCHAR(64) NULL,
		idempotency_key VARCHAR(128) NULL,
		reserved_at     DATETIME(3) NULL,
		created_at      DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
		KEY orders_activity_user (activity_id, user_id),
		KEY orders_activity_status (activity_id, status),
		UNIQUE KEY orders_user_key (activity_id, user_id, idempotency_key),
		CONSTRAINT orders_reason CHECK (status = 'confirmed' OR reason IS NOT NULL)
	) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
	`CREATE TABLE IF NOT EXISTS purchases (
		activity_id BIGINT UNSIGNED NOT NULL,
		user_id     VARCHAR(64) NOT NULL,
		quantity    INT NOT NULL,
		PRIMARY KEY (activity_id, user_id)
	) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
}

// Option changes how Open sets up the pool.
type Option func(*options)

type options struct {
	session []string // run on every new connection
}

// ReadCommitted makes READ COMMITTED the session isolation level of every
// connection of the pool, set once when the connection is made: the
// worker's transactions all want it, and asking per transaction
// (sql.TxOptions) costs a SET TRANSACTION round trip each. The statement is
// the same on MySQL and MariaDB, unlike the variable's name (see
// conf.MySQL.Driver).
func ReadCommitted(o *options) {
	o.session = append(o.session, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
}

// Open connects to the database of cfg, creating the database and schema if
// missing, and returns a pool configured from cfg.
func Open(ctx context.Context, cfg conf.MySQL, opts ...Option) (*sql.DB, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dc, err := cfg.Driver()
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	if err := ensureDatabase(ctx, *dc); err != nil {
		return nil, err
	}
	var conn driver.Connector
	conn, err = mysql.NewConnector(dc)
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	if len(o.session) > 0 {
		conn = sessionConnector{Connector: conn, init: o.session}
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxIdleConns)
	db.SetConnMaxLifetime(cfg.ConnMaxLifetime.Duration)
	if err := Ensure(ctx, db); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// sessionConnector runs init on every connection it makes. The driver keeps
// session state across the pool's reuse of a connection (it sends no reset),
// and every reconnect comes through Connect again.
type sessionConnector struct {
	driver.Connector
	init []string
}

func (c sessionConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		_ = conn.Close()
		return nil, errors.New("mysql: the driver's connection cannot execute statements")
	}
	for _, q := range c.init {
		if _, err := ex.ExecContext(ctx, q, nil); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("mysql session setup %q: %w", q, err)
		}
	}
	return conn, nil
}

func ensureDatabase(ctx context.Context, dc mysql.Config) error {
	name := dc.DBName
	dc.DBName = ""
	conn, err := mysql.NewConnector(&dc)
	if err != nil {
		return fmt.Errorf("mysql: %w", err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The name was checked by conf (no quotes or back-quotes).
	if _, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// lifecycleColumns adds the sale lifecycle's columns to a database made
// before them (IF NOT EXISTS: several processes may run it at once).
const lifecycleColumns = `ALTER TABLE activities
	ADD COLUMN IF NOT EXISTS generation BIGINT NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS archived_at DATETIME(3) NULL,
	ADD COLUMN IF NOT EXISTS stock_shards INT NOT NULL DEFAULT 1`

// Ensure creates every missing table, column and index.
func Ensure(ctx context.Context, db *sql.DB) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, s := range Statements {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
	}
	// Looked up first: an ALTER waits for every open transaction on the
	// table, which a process starting during a sale should not do.
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'activities' AND COLUMN_NAME IN ('generation', 'archived_at', 'stock_shards')`).Scan(&n); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if n < 3 {
		if _, err := db.ExecContext(ctx, lifecycleColumns); err != nil {
			return fmt.Errorf("create schema: add lifecycle columns: %w", err)
		}
	}
	return ensureIndexes(ctx, db)
}

// Index is an index added to a table after its first release: databases
// created before it get it from Ensure.
type Index struct{ Table, Name, DDL string }

// Indexes lists the indexes Ensure adds where missing.
var Indexes = []Index{
	// One order per (sale, user, idempotency key) that MySQL holds with the
	// key: a keyed retry can never produce a second order that confirms, also
	// when Redis forgot the key. NULL keys (unkeyed orders, and orders whose
	// key was given back with a 503) never collide.
	{Table: "orders", Name: "orders_user_key",
		DDL: "ALTER TABLE orders ADD UNIQUE KEY orders_user_key (activity_id, user_id, idempotency_key)"},
}

// erDupKeyName: the index exists (another process added it first).
const erDupKeyName = 1061

func ensureIndexes(ctx context.Context, db *sql.DB) error {
	for _, ix := range Indexes {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.statistics
			WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?`, ix.Table, ix.Name).Scan(&n); err != nil {
			return fmt.Errorf("create schema: index %s: %w", ix.Name, err)
		}
		if n > 0 {
			continue
		}
		var me *mysql.MySQLError
		if _, err := db.ExecContext(ctx, ix.DDL); err != nil && !(errors.As(err, &me) && me.Number == erDupKeyName) {
			return fmt.Errorf("create schema: index %s: %w", ix.Name, err)
		}
	}
	return nil
}
