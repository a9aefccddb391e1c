// Package salesdb holds the MySQL reads of a sale that the backend and the
// worker both make to rebuild Redis from the truth: per-user totals and the
// orders MySQL has decided.
package salesdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/seckill/seckill/internal/reservation"
)

// Querier is a *sql.DB or *sql.Tx.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Users returns the confirmed units per user of activity id.
func Users(ctx context.Context, q Querier, id int64) (map[string]int64, error) {
	rows, err := q.QueryContext(ctx, `SELECT user_id, quantity FROM purchases WHERE activity_id = ?`, id)
	if err != nil {
		return nil, fmt.Errorf("read purchases of activity %d: %w", id, err)
	}
	defer rows.Close()
	users := map[string]int64{}
	for rows.Next() {
		var u string
		var n int64
		if err := rows.Scan(&u, &n); err != nil {
			return nil, fmt.Errorf("read purchases of activity %d: %w", id, err)
		}
		users[u] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read purchases of activity %d: %w", id, err)
	}
	return users, nil
}

// Decided returns every order of activity id that MySQL holds, except those
// released after a failed publish (answered 503: their key may be reused).
func Decided(ctx context.Context, q Querier, id int64) ([]reservation.Decided, error) {
	rows, err := q.QueryContext(ctx, `SELECT order_id, user_id, COALESCE(idempotency_key, ''), quantity, status, COALESCE(reason, '')
		FROM orders WHERE activity_id = ? AND NOT (status = 'failed' AND reason = 'released')`, id)
	if err != nil {
		return nil, fmt.Errorf("read orders of activity %d: %w", id, err)
	}
	defer rows.Close()
	var out []reservation.Decided
	for rows.Next() {
		var d reservation.Decided
		var status string
		if err := rows.Scan(&d.OrderID, &d.UserID, &d.IdempotencyKey, &d.Quantity, &status, &d.Reason); err != nil {
			return nil, fmt.Errorf("read orders of activity %d: %w", id, err)
		}
		d.Confirmed = status == "confirmed"
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read orders of activity %d: %w", id, err)
	}
	return out, nil
}

// Row is *sql.DB or *sql.Tx for single-row reads.
type Row interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// OrderByKey finds the order that user's Idempotency-Key named in activity
// id; found is false when there is none. An order released after a failed
// publish does not count (its client was told nothing was kept and may use
// the key again), as in Decided.
func OrderByKey(ctx context.Context, q Row, id int64, user, key string) (o reservation.Decided, found bool, err error) {
	var status string
	err = q.QueryRowContext(ctx, `SELECT order_id, quantity, status, COALESCE(reason, '') FROM orders
		WHERE activity_id = ? AND user_id = ? AND idempotency_key = ? AND NOT (status = 'failed' AND reason = 'released')
		ORDER BY created_at LIMIT 1`, id, user, key).Scan(&o.OrderID, &o.Quantity, &status, &o.Reason)
	if errors.Is(err, sql.ErrNoRows) {
		return o, false, nil
	}
	if err != nil {
		return o, false, fmt.Errorf("order of key in activity %d: %w", id, err)
	}
	o.UserID, o.IdempotencyKey, o.Confirmed = user, key, status == "confirmed"
	return o, true, nil
}

// Restore writes MySQL's decided orders of activity id back into Redis after
// a rebuild (see reservation.Store.Restore).
func Restore(ctx context.Context, q Querier, store *reservation.Store, id int64) error {
	orders, err := Decided(ctx, q, id)
	if err != nil {
		return err
	}
	return store.Restore(ctx, id, orders)
}
