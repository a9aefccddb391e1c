// Package salesdb holds the MySQL reads of a sale that the backend and the
// worker both make to rebuild Redis from the truth: per-user totals and the
// orders MySQL has decided.
package salesdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

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

// KeyOrder returns MySQL's order of (activity, user, idempotency key), if
// any. An order released after a failed publish does not count (its client
// was told nothing was kept and may use the key again), as in Decided.
func KeyOrder(ctx context.Context, q Querier, id int64, user, key string) (reservation.Decided, bool, error) {
	rows, err := q.QueryContext(ctx, `SELECT order_id, quantity, status, COALESCE(reason, '') FROM orders
		WHERE activity_id = ? AND user_id = ? AND idempotency_key = ? AND NOT (status = 'failed' AND reason = 'released')
		ORDER BY created_at LIMIT 1`, id, user, key)
	if err != nil {
		return reservation.Decided{}, false, fmt.Errorf("read the order of a key: %w", err)
	}
	defer rows.Close()
	if !rows.Next() {
		return reservation.Decided{}, false, rows.Err()
	}
	d := reservation.Decided{UserID: user, IdempotencyKey: key}
	var status string
	if err := rows.Scan(&d.OrderID, &d.Quantity, &status, &d.Reason); err != nil {
		return reservation.Decided{}, false, fmt.Errorf("read the order of a key: %w", err)
	}
	d.Confirmed = status == "confirmed"
	return d, true, rows.Err()
}

// Restore prepares Redis for the rebuild of a sale it lost, and must run
// before the sale is warmed again: with window > 0 it marks the sale
// recovering under a fresh token (every request that would reserve answers
// "unsure" meanwhile: keys Redis forgot may belong to orders still in the
// queue, whose units Redis no longer counts) until a worker consumes the
// drain marker published with that token, or window passes; then it writes
// MySQL's decided orders' records and keys back (see
// reservation.Store.Restore; total, MySQL's stock, chooses the bucket
// count of the sale built anew). Run first, a Restore that fails leaves the
// sale missing, so the next request or reconcile pass tries again. It
// returns the recovery token ("" for window 0).
func Restore(ctx context.Context, q Querier, store *reservation.Store, id, total int64, window time.Duration) (string, error) {
	token := ""
	if window > 0 {
		token = RecoveryToken()
		if err := store.MarkRecovering(ctx, id, token, window); err != nil {
			return "", err
		}
	}
	orders, err := Decided(ctx, q, id)
	if err != nil {
		return "", err
	}
	return token, store.Restore(ctx, id, total, orders)
}

// TokenTime is the moment of the rebuild a RecoveryToken names (false for a
// token of another form).
func TokenTime(token string) (time.Time, bool) {
	ms, _, ok := strings.Cut(token, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil || n <= 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}

// RecoveryToken names one recovery: the moment of the rebuild and 64
// random bits, so that a marker of an earlier recovery never ends a later one.
func RecoveryToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	return strconv.FormatInt(time.Now().UnixMilli(), 10) + "-" + hex.EncodeToString(b[:])
}

// SettleDecided settles, in Redis, the open reservations (pending or
// claimed records) whose order MySQL holds, and returns how many.
func SettleDecided(ctx context.Context, q Querier, store *reservation.Store, id int64, open []reservation.Record) (int, error) {
	n := 0
	for start := 0; start < len(open); start += 500 {
		chunk := open[start:min(start+500, len(open))]
		args := make([]any, len(chunk))
		for i, r := range chunk {
			args[i] = r.OrderID
		}
		rows, err := q.QueryContext(ctx, `SELECT order_id, status, COALESCE(reason, ''), user_id, quantity
			FROM orders WHERE order_id IN (?`+strings.Repeat(",?", len(chunk)-1)+`)`, args...)
		if err != nil {
			return n, fmt.Errorf("read orders of activity %d: %w", id, err)
		}
		var set []reservation.Settlement
		for rows.Next() {
			var s reservation.Settlement
			var status string
			if err := rows.Scan(&s.OrderID, &status, &s.Reason, &s.UserID, &s.Quantity); err != nil {
				rows.Close()
				return n, err
			}
			s.Confirmed = status == "confirmed"
			set = append(set, s)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return n, err
		}
		if len(set) > 0 {
			if _, err := store.Settle(ctx, id, set); err != nil {
				return n, err
			}
			n += len(set)
		}
	}
	return n, nil
}

// openMax bounds the open reservations EndRecovery settles (as the
// reconciler's sync does).
const openMax = 100_000

// EndRecovery ends a sale's recovery after a Redis loss (the drain marker
// passed every live consumer of every partition, see ordermsg.Marker) with
// Redis made exact from MySQL, unless the sale no longer recovers under
// token. It holds the activity's row lock (SELECT ... FOR UPDATE) for the
// whole step, so no worker commit of the activity interleaves: MySQL's
// decided orders get their records back in Redis (a settle arriving after
// this step finds them settled and moves no counter), the open records
// MySQL decided are settled, and then the counters are set from MySQL
// atomically with the end of the recovering mark (lua/sync.lua). The
// settles of the orders queued before the loss need not have landed, and
// whatever was committed between the rebuild's read of the row and its warm
// is counted. It reports whether the recovery ended now.
func EndRecovery(ctx context.Context, db *sql.DB, store *reservation.Store, id int64, token string) (bool, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return false, fmt.Errorf("end recovery of activity %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	var total, sold int64
	if err := tx.QueryRowContext(ctx, `SELECT total_stock, sold FROM activities WHERE id = ? FOR UPDATE`, id).Scan(&total, &sold); err != nil {
		return false, fmt.Errorf("end recovery: lock activity %d: %w", id, err)
	}
	if cur, err := store.Recovery(ctx, id); err != nil || cur != token {
		return false, err // ended already, or a later loss started another recovery
	}
	orders, err := Decided(ctx, tx, id)
	if err != nil {
		return false, err
	}
	if err := store.Restore(ctx, id, total, orders); err != nil {
		return false, err
	}
	open, err := store.Open(ctx, id, openMax)
	if err != nil {
		return false, err
	}
	if _, err := SettleDecided(ctx, tx, store, id, open); err != nil {
		return false, err
	}
	users, err := Users(ctx, tx, id)
	if err != nil {
		return false, err
	}
	ended, err := store.EndRecovery(ctx, id, token, total, sold, users)
	if err != nil {
		return false, err
	}
	return ended, tx.Commit()
}
