// Package store writes batches of orders of one activity to MySQL, the truth,
// as docs/purchase-path.md ("Worker, one batch") prescribes: one READ COMMITTED
// transaction per batch that skips redeliveries, records released orders as
// failed, enforces the per-user limit from `purchases` (I2), inserts the rest
// and ends with the conditional stock update (I1). When that guard fails the
// batch is rolled back and split in halves until every order is decided.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/seckill/seckill/internal/backoff"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

// Failure reasons written to orders.reason.
const (
	ReasonSoldOut          = "sold_out"
	ReasonLimitExceeded    = "limit_exceeded"
	ReasonReleased         = "released"
	ReasonActivityNotFound = "activity_not_found"
	// ReasonDuplicateKey: MySQL holds another order of the same user and
	// idempotency key (index orders_user_key); this one never confirms.
	ReasonDuplicateKey = "duplicate_key"
)

// Order is one order message with the state claim.lua found for it.
type Order struct {
	ordermsg.Order
	Claim reservation.State
}

// Outcome is MySQL's decision on one order.
type Outcome struct {
	OrderID   string
	UserID    string
	Quantity  int64
	Confirmed bool
	Reason    string // set when not confirmed
	// Redelivered: the order was in MySQL already; this is its stored outcome.
	Redelivered bool
}

// Settlement is the outcome in the form settle.lua takes.
func (o Outcome) Settlement() reservation.Settlement {
	return reservation.Settlement{OrderID: o.OrderID, Confirmed: o.Confirmed, Reason: o.Reason,
		Quantity: o.Quantity, UserID: o.UserID}
}

// Label is the metrics label of the outcome.
func (o Outcome) Label() string {
	switch {
	case o.Redelivered:
		return workermetrics.OutcomeRedelivered
	case o.Confirmed:
		return workermetrics.OutcomeConfirmed
	}
	return o.Reason
}

// Store runs batch transactions on a pool opened by schema.Open with
// schema.ReadCommitted: its transactions rely on READ COMMITTED (see
// lockBuyers) without asking for it each time.
type Store struct {
	db       *sql.DB
	m        *workermetrics.Metrics
	timeout  time.Duration // bound of one transaction attempt
	attempts int           // tries of one transaction on deadlock, lock wait timeout, duplicate key
}

// New returns a store over db; timeout bounds one transaction attempt
// ([mysql] query_timeout).
func New(db *sql.DB, m *workermetrics.Metrics, timeout time.Duration) *Store {
	return &Store{db: db, m: m, timeout: timeout, attempts: 8}
}

// Write decides every order of one activity and returns their outcomes in the
// order given. The orders are committed when it returns nil; on an error
// nothing of the failing transaction is kept, and the whole call may be
// repeated (redeliveries are recognised). An order id given twice gets one
// decision, the second copy reported as a redelivery.
func (s *Store) Write(ctx context.Context, activityID int64, orders []Order) ([]Outcome, error) {
	uniq := make([]Order, 0, len(orders))
	seen := make(map[string]bool, len(orders))
	for _, o := range orders {
		if o.ActivityID != activityID {
			return nil, fmt.Errorf("write batch of activity %d: order %s belongs to activity %d", activityID, o.OrderID, o.ActivityID)
		}
		if !seen[o.OrderID] {
			seen[o.OrderID] = true
			uniq = append(uniq, o)
		}
	}
	decided := make(map[string]Outcome, len(uniq))
	if err := s.decide(ctx, activityID, uniq, decided); err != nil {
		return nil, err
	}
	out := make([]Outcome, len(orders))
	for i, o := range orders {
		d, ok := decided[o.OrderID]
		if !ok {
			return nil, fmt.Errorf("write batch of activity %d: order %s left undecided", activityID, o.OrderID)
		}
		if seen[o.OrderID] {
			seen[o.OrderID] = false
		} else {
			d.Redelivered = true
		}
		out[i] = d
	}
	return out, nil
}

// decide commits orders in one transaction or, when the stock guard fails,
// splits them in halves; a single order that still fails is sold out.
func (s *Store) decide(ctx context.Context, activityID int64, orders []Order, into map[string]Outcome) error {
	res, guardFailed, err := s.tx(ctx, activityID, orders, false)
	if err != nil {
		return err
	}
	if guardFailed {
		s.m.Splits.Inc()
		if len(orders) == 1 {
			res, guardFailed, err = s.tx(ctx, activityID, orders, true)
			if err != nil {
				return err
			}
			if guardFailed {
				return fmt.Errorf("write order %s: stock guard failed with nothing to confirm", orders[0].OrderID)
			}
		} else {
			half := len(orders) / 2
			if err := s.decide(ctx, activityID, orders[:half], into); err != nil {
				return err
			}
			return s.decide(ctx, activityID, orders[half:], into)
		}
	}
	for _, o := range res {
		into[o.OrderID] = o
	}
	return nil
}

// tx runs one batch transaction, repeating it on deadlock, lock wait timeout
// and duplicate key (a concurrent insert of the same order id, seen as a
// redelivery on the next try).
func (s *Store) tx(ctx context.Context, activityID int64, orders []Order, soldOut bool) ([]Outcome, bool, error) {
	// The redelivery check (a SELECT of the batch's order ids) is skipped on
	// the first try when Redis saw every order as newly claimed: the orders
	// primary key still refuses a duplicate (error 1062, the whole attempt is
	// rolled back), and every later try checks.
	check := needsCheck(orders)
	// Keys held by other orders are looked up only after the index refused
	// one: Redis's idempotency check keeps that rare.
	keys := false
	attempt := 0
	var res []Outcome
	var guardFailed bool
	// Tries follow one another closely: a short jittered pause lets the
	// winner of the lock commit.
	err := backoff.Retry(ctx, backoff.Policy{Site: "worker_mysql_tx", Min: 5 * time.Millisecond, Max: 40 * time.Millisecond,
		Tries: s.attempts, Metrics: s.m.Retry,
		OnRetry: func(err error, _ time.Duration) {
			cause, _ := transientCause(err)
			s.m.Retries.WithLabelValues(cause).Inc()
		}}, func(ctx context.Context) error {
		attempt++
		start := time.Now()
		var err error
		res, guardFailed, err = s.attempt(ctx, activityID, orders, soldOut, check, keys)
		s.m.TxSeconds.Observe(time.Since(start).Seconds())
		check = true
		keys = keys || keyTaken(err)
		if _, transient := transientCause(err); err != nil && !transient {
			return backoff.Stop(err)
		}
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("write %d orders of activity %d (try %d): %w", len(orders), activityID, attempt, err)
	}
	return res, guardFailed, nil
}

// needsCheck reports whether some order may be in MySQL already: Redis
// recorded it as decided, or lost its record. Claimed orders may be
// redeliveries too (a worker that committed and died before settling); the
// primary key catches those.
func needsCheck(orders []Order) bool {
	for _, o := range orders {
		if o.Claim != reservation.Claimed {
			return true
		}
	}
	return false
}

// MySQL error numbers after which the same transaction is simply run again.
const (
	erDupEntry        = 1062
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
)

// Permanent reports a MySQL error that rejects the data itself (a CHECK or
// foreign key violation, a value out of range or too long, a bad value): the
// same write fails however often it is repeated. Anything else (lost
// connections, timeouts, deadlocks, a server that is down) may pass later.
func Permanent(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1048, // column cannot be null
		1264,       // out of range value
		1292,       // truncated incorrect value
		1366,       // incorrect value for column
		1406,       // data too long
		1451, 1452, // foreign key
		3819, // MySQL: check constraint violated
		4025: // MariaDB: CONSTRAINT failed
		return true
	}
	return false
}

// keyTaken reports a duplicate on the orders_user_key index.
func keyTaken(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == erDupEntry && strings.Contains(me.Message, "orders_user_key")
}

func transientCause(err error) (string, bool) {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return "", false
	}
	switch me.Number {
	case erLockDeadlock:
		return workermetrics.CauseDeadlock, true
	case erLockWaitTimeout:
		return workermetrics.CauseLockWait, true
	case erDupEntry:
		return workermetrics.CauseDuplicate, true
	}
	return "", false
}

// attempt is one try of the batch transaction. guardFailed reports that the
// conditional stock update matched no row; the transaction was rolled back.
// With soldOut every order that would be confirmed fails as sold out instead.
// Without check it does not look for redeliveries: an order already in MySQL
// then fails the orders insert with a duplicate key, and the caller tries again
// with check.
// With keys it also looks up the idempotency keys MySQL already holds for
// other orders, and fails the batch's orders that repeat one.
// The steps run in this order because of the locks they take: the orders'
// rows first, the buyers' rows in user-id order, the hot activity row last.
func (s *Store) attempt(ctx context.Context, activityID int64, orders []Order, soldOut, check, keys bool) (res []Outcome, guardFailed bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// READ COMMITTED is the session's level (schema.ReadCommitted): asking
	// here would cost a SET TRANSACTION round trip per transaction.
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, fmt.Errorf("begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()

	res, fresh, err := redeliveries(ctx, tx, orders, check)
	if err != nil {
		return nil, false, err
	}
	if len(fresh) > 0 {
		guardFailed, err = writeFresh(ctx, tx, activityID, orders, fresh, res, soldOut, keys)
		if err != nil || guardFailed {
			return nil, guardFailed, err // deferred rollback
		}
	}
	committed = true
	if err := tx.Commit(); err != nil {
		return nil, false, fmt.Errorf("commit: %w", err)
	}
	return res, false, nil
}

// writeFresh decides and writes the orders MySQL does not hold yet (fresh
// indexes orders; their outcomes go to res). guardFailed reports that the
// stock guard refused the batch's units: the caller rolls back.
func writeFresh(ctx context.Context, tx *sql.Tx, activityID int64, orders []Order, fresh []int, res []Outcome, soldOut, keys bool) (guardFailed bool, err error) {
	sale, err := readSale(ctx, tx, activityID)
	if err != nil {
		return false, err
	}
	taken := map[string]bool{}
	if keys {
		if taken, err = takenKeys(ctx, tx, activityID, orders, fresh); err != nil {
			return false, err
		}
	}
	candidates := classify(orders, fresh, res, sale, taken, soldOut)
	var b buyers
	var units int64
	if len(candidates) > 0 {
		if b, err = lockBuyers(ctx, tx, activityID, orders, candidates); err != nil {
			return false, err
		}
		units = b.admit(orders, candidates, sale.limit, res)
	}
	if err := insertOrders(ctx, tx, activityID, orders, fresh, res); err != nil {
		return false, err
	}
	if units == 0 {
		return false, nil
	}
	if err := b.write(ctx, tx, activityID); err != nil {
		return false, err
	}
	return takeStock(ctx, tx, activityID, units)
}

// redeliveries is step 1: the orders MySQL holds already get their stored
// outcome in res; fresh lists the indexes of the others. Without check every
// order is fresh.
func redeliveries(ctx context.Context, tx *sql.Tx, orders []Order, check bool) (res []Outcome, fresh []int, err error) {
	res = make([]Outcome, len(orders))
	fresh = make([]int, 0, len(orders))
	if !check {
		for i := range orders {
			fresh = append(fresh, i)
		}
		return res, fresh, nil
	}
	stored, err := storedOrders(ctx, tx, orders)
	if err != nil {
		return nil, nil, err
	}
	for i, o := range orders {
		if st, ok := stored[o.OrderID]; ok {
			res[i] = st
		} else {
			fresh = append(fresh, i)
		}
	}
	return res, fresh, nil
}

// saleRow is what a batch needs of its activity's row.
type saleRow struct {
	found, archived bool
	limit           int64
}

// readSale is step 2: the sale and its per-user limit (a plain read: the hot
// row is locked last, by takeStock).
func readSale(ctx context.Context, tx *sql.Tx, activityID int64) (saleRow, error) {
	sale := saleRow{found: true}
	err := tx.QueryRowContext(ctx, "SELECT per_user_limit, archived_at IS NOT NULL FROM activities WHERE id = ?", activityID).Scan(&sale.limit, &sale.archived)
	if errors.Is(err, sql.ErrNoRows) {
		return saleRow{}, nil
	} else if err != nil {
		return saleRow{}, fmt.Errorf("select activity: %w", err)
	}
	return sale, nil
}

// classify is step 3: released, unknown-activity and duplicate-key orders
// fail (with soldOut, every other order too); the rest are returned as
// candidates. A released order's key was given back to its client with the
// 503, so it is stored without it. taken holds "user\x00key" of the keys
// MySQL holds; classify adds the batch's own, so a second order of a key in
// the batch fails.
func classify(orders []Order, fresh []int, res []Outcome, sale saleRow, taken map[string]bool, soldOut bool) (candidates []int) {
	for _, i := range fresh {
		o := orders[i]
		res[i] = Outcome{OrderID: o.OrderID, UserID: o.UserID, Quantity: o.Quantity}
		kk := o.UserID + "\x00" + o.IdempotencyKey
		dupKey := o.IdempotencyKey != "" && o.Claim != reservation.Failed && taken[kk]
		if o.IdempotencyKey != "" && o.Claim != reservation.Failed {
			taken[kk] = true // a second order of the key in this batch
		}
		switch {
		case o.Claim == reservation.Failed:
			res[i].Reason = ReasonReleased
		case dupKey:
			res[i].Reason = ReasonDuplicateKey
		case sale.archived && o.Claim == reservation.Unknown:
			// The sale was archived with nothing pending: every order not in
			// MySQL by then had been released, and its record went with the
			// archive.
			res[i].Reason = ReasonReleased
		case !sale.found:
			res[i].Reason = ReasonActivityNotFound
		case soldOut:
			res[i].Reason = ReasonSoldOut
		default:
			candidates = append(candidates, i)
		}
	}
	return candidates
}

// buyers are the per-user totals of one attempt's candidates.
type buyers struct {
	users []string         // sorted: the lock order
	held  map[string]int64 // purchases' rows, X-locked; a user without a row is absent
	added map[string]int64 // units this batch confirms
}

// lockBuyers is step 4's read: the candidates' per-user totals, locked in
// user-id order. Rows that exist are X-locked by the read; a missing row
// cannot be locked under READ COMMITTED, so new buyers are added with a plain
// INSERT (buyers.write): a concurrent batch that added the same user first
// makes it fail with a duplicate key, and the whole attempt is rolled back and
// repeated.
func lockBuyers(ctx context.Context, tx *sql.Tx, activityID int64, orders []Order, candidates []int) (buyers, error) {
	b := buyers{held: map[string]int64{}, added: map[string]int64{}}
	for _, i := range candidates {
		if _, ok := b.added[orders[i].UserID]; !ok {
			b.added[orders[i].UserID] = 0
			b.users = append(b.users, orders[i].UserID)
		}
	}
	slices.Sort(b.users)
	uargs := make([]any, 0, 1+len(b.users))
	uargs = append(uargs, activityID)
	for _, u := range b.users {
		uargs = append(uargs, u)
	}
	rows, err := tx.QueryContext(ctx, "SELECT user_id, quantity FROM purchases WHERE activity_id = ? AND user_id IN ("+
		marks(len(b.users))+") ORDER BY user_id FOR UPDATE", uargs...)
	if err != nil {
		return buyers{}, fmt.Errorf("select purchases: %w", err)
	}
	for rows.Next() {
		var u string
		var q int64
		if err := rows.Scan(&u, &q); err != nil {
			rows.Close()
			return buyers{}, fmt.Errorf("scan purchases: %w", err)
		}
		b.held[u] = q
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return buyers{}, fmt.Errorf("select purchases: %w", err)
	}
	return b, nil
}

// admit is step 4's decision: in batch order, a candidate within its user's
// limit is confirmed, the others fail with limit_exceeded (I2). It returns the
// units confirmed.
func (b buyers) admit(orders []Order, candidates []int, limit int64, res []Outcome) (units int64) {
	for _, i := range candidates {
		o := orders[i]
		if b.held[o.UserID]+b.added[o.UserID]+o.Quantity > limit {
			res[i].Reason = ReasonLimitExceeded
			continue
		}
		b.added[o.UserID] += o.Quantity
		units += o.Quantity
		res[i].Confirmed = true
	}
	return units
}

// insertOrders is step 5: every fresh order, in one statement.
func insertOrders(ctx context.Context, tx *sql.Tx, activityID int64, orders []Order, fresh []int, res []Outcome) error {
	args := make([]any, 0, 8*len(fresh))
	for _, i := range fresh {
		o, r := orders[i], res[i]
		status, reason := "confirmed", any(nil)
		if !r.Confirmed {
			status, reason = "failed", r.Reason
		}
		key := any(nil)
		if o.IdempotencyKey != "" && r.Reason != ReasonReleased && r.Reason != ReasonDuplicateKey {
			key = o.IdempotencyKey
		}
		reservedAt := any(nil)
		if o.ReservedAt > 0 {
			reservedAt = ordermsg.Time(o.ReservedAt)
		}
		args = append(args, o.OrderID, activityID, o.UserID, o.Quantity, status, reason, key, reservedAt)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (order_id, activity_id, user_id, quantity, status, reason, idempotency_key, reserved_at) VALUES "+
		tuples(len(fresh), "(?, ?, ?, ?, ?, ?, ?, ?)"), args...); err != nil {
		return fmt.Errorf("insert orders: %w", err)
	}
	return nil
}

// write is step 6: the buyers' new totals: an update of the rows lockBuyers
// locked, a plain insert of new buyers (purchases holds buyers only).
func (b buyers) write(ctx context.Context, tx *sql.Tx, activityID int64) error {
	var upd, ins []any
	for _, u := range b.users {
		if n := b.added[u]; n > 0 {
			if _, ok := b.held[u]; ok {
				upd = append(upd, activityID, u, n)
			} else {
				ins = append(ins, activityID, u, n)
			}
		}
	}
	if len(ins) > 0 {
		if _, err := tx.ExecContext(ctx, "INSERT INTO purchases (activity_id, user_id, quantity) VALUES "+
			tuples(len(ins)/3, "(?, ?, ?)"), ins...); err != nil {
			return fmt.Errorf("insert purchases: %w", err)
		}
	}
	if len(upd) > 0 {
		if _, err := tx.ExecContext(ctx, "INSERT INTO purchases (activity_id, user_id, quantity) VALUES "+
			tuples(len(upd)/3, "(?, ?, ?)")+" ON DUPLICATE KEY UPDATE quantity = quantity + VALUES(quantity)", upd...); err != nil {
			return fmt.Errorf("update purchases: %w", err)
		}
	}
	return nil
}

// takeStock is step 7, last: the guard against oversell (I1), on the hot row.
// guardFailed reports that fewer than units were left.
func takeStock(ctx context.Context, tx *sql.Tx, activityID, units int64) (guardFailed bool, err error) {
	r, err := tx.ExecContext(ctx, "UPDATE activities SET stock = stock - ?, sold = sold + ? WHERE id = ? AND stock >= ?",
		units, units, activityID, units)
	if err != nil {
		return false, fmt.Errorf("update stock: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("update stock: %w", err)
	}
	return n == 0, nil
}

// Fail records one order as failed with reason, in columns that hold
// whatever the message carried once it passed ordermsg.Validate (no key, no
// reservation time): the row for an order MySQL refused to write as it
// came. A row that exists already (a redelivery) is returned as it is.
// Permanent(err) tells the caller that even this row is refused.
func (s *Store) Fail(ctx context.Context, o ordermsg.Order, reason string) (Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.db.ExecContext(ctx, `INSERT INTO orders (order_id, activity_id, user_id, quantity, status, reason)
		VALUES (?, ?, ?, ?, 'failed', ?)`, o.OrderID, o.ActivityID, o.UserID, o.Quantity, reason)
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return Outcome{OrderID: o.OrderID, UserID: o.UserID, Quantity: o.Quantity, Reason: reason}, nil
	case !errors.As(err, &me) || me.Number != erDupEntry || strings.Contains(me.Message, "orders_user_key"):
		return Outcome{}, fmt.Errorf("record order %s failed (%s): %w", o.OrderID, reason, err)
	}
	var st Outcome
	var status string
	if err := s.db.QueryRowContext(ctx, `SELECT order_id, user_id, quantity, status, COALESCE(reason, '') FROM orders WHERE order_id = ?`,
		o.OrderID).Scan(&st.OrderID, &st.UserID, &st.Quantity, &status, &st.Reason); err != nil {
		return Outcome{}, fmt.Errorf("read order %s: %w", o.OrderID, err)
	}
	st.Confirmed, st.Redelivered = status == "confirmed", true
	return st, nil
}

// storedOrders reads (and locks) the orders of the batch MySQL has already.
func storedOrders(ctx context.Context, tx *sql.Tx, orders []Order) (map[string]Outcome, error) {
	ids := make([]any, len(orders))
	for i, o := range orders {
		ids[i] = o.OrderID
	}
	rows, err := tx.QueryContext(ctx, "SELECT order_id, user_id, quantity, status, COALESCE(reason, '') FROM orders WHERE order_id IN ("+marks(len(ids))+") FOR UPDATE", ids...)
	if err != nil {
		return nil, fmt.Errorf("select orders: %w", err)
	}
	stored := make(map[string]Outcome)
	for rows.Next() {
		var o Outcome
		var status string
		if err := rows.Scan(&o.OrderID, &o.UserID, &o.Quantity, &status, &o.Reason); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan orders: %w", err)
		}
		o.Confirmed, o.Redelivered = status == "confirmed", true
		stored[o.OrderID] = o
	}
	// A deadlock or timeout can arrive while rows stream: Next then stops
	// early and only Err tells, and the server has already rolled back.
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("select orders: %w", err)
	}
	return stored, nil
}

// takenKeys returns "user\x00key" of the keys MySQL holds for the users of
// the fresh keyed orders.
func takenKeys(ctx context.Context, tx *sql.Tx, activityID int64, orders []Order, fresh []int) (map[string]bool, error) {
	taken := map[string]bool{}
	args := []any{activityID}
	seen := map[string]bool{}
	for _, i := range fresh {
		if u := orders[i].UserID; orders[i].IdempotencyKey != "" && !seen[u] {
			seen[u] = true
			args = append(args, u)
		}
	}
	if len(args) == 1 {
		return taken, nil
	}
	rows, err := tx.QueryContext(ctx, "SELECT user_id, idempotency_key FROM orders WHERE activity_id = ? AND user_id IN ("+
		marks(len(args)-1)+") AND idempotency_key IS NOT NULL FOR UPDATE", args...)
	if err != nil {
		return nil, fmt.Errorf("select keys: %w", err)
	}
	for rows.Next() {
		var u, k string
		if err := rows.Scan(&u, &k); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan keys: %w", err)
		}
		taken[u+"\x00"+k] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("select keys: %w", err)
	}
	return taken, nil
}

// marks returns n comma-separated placeholders.
func marks(n int) string { return tuples(n, "?") }

// tuples repeats t n times, comma-separated.
func tuples(n int, t string) string {
	var b strings.Builder
	b.Grow(n * (len(t) + 2))
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(t)
	}
	return b.String()
}
