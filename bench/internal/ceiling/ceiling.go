// Package ceiling measures the raw ceilings the purchase path is compared
// with, on the same services and in the same run: a bare async-confirm
// publisher on a quorum queue, the worker's 100-order transaction without
// the worker, and the bare reserve script without the backend. Each one
// checks afterwards that the work it counted was done (the queue holds every
// confirmed message, MySQL every order, Redis every reservation) and removes
// what it made.
package ceiling

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
)

// Result is one ceiling.
type Result struct {
	Name        string  `json:"name"`
	Unit        string  `json:"unit"` // what PerSecond counts
	Ops         int64   `json:"ops"`
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"per_second"`
	Concurrency int     `json:"concurrency"`
	Detail      string  `json:"detail"`
}

func result(name, unit string, ops int64, d time.Duration, conc int, detail string) Result {
	r := Result{Name: name, Unit: unit, Ops: ops, Seconds: d.Seconds(), Concurrency: conc, Detail: detail}
	if d > 0 {
		r.PerSecond = float64(ops) / d.Seconds()
	}
	return r
}

// Names of the ceilings (Result.Name).
const (
	Publish     = "publish"
	Transaction = "transaction"
	Reserve     = "reserve"
)

// sample is an order message body of the size the backend publishes.
func sample(activityID int64, i int64) ([]byte, error) {
	now := time.Now()
	return ordermsg.Order{V: ordermsg.Version, OrderID: ordermsg.NewOrderID(activityID), ActivityID: activityID,
		UserID: fmt.Sprintf("u%d", i), Quantity: 1, ReservedAt: now.UnixMilli(), Deadline: now.Add(time.Minute).UnixMilli()}.Encode()
}

// PublishConfirm publishes persistent order-sized messages to a quorum queue
// of its own (queue, declared here and deleted at the end) for d, with up to
// window messages awaiting their confirm, and counts the broker's acks. A
// nack, a return or a queue that holds another count than the acks is an
// error.
func PublishConfirm(ctx context.Context, url, queue string, d time.Duration, window int) (Result, error) {
	if window <= 0 || d <= 0 {
		return Result{}, fmt.Errorf("publish ceiling: window %d and duration %v must be positive", window, d)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		return Result{}, fmt.Errorf("publish ceiling: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return Result{}, fmt.Errorf("publish ceiling: %w", err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		return Result{}, fmt.Errorf("publish ceiling: declare %s: %w", queue, err)
	}
	defer func() {
		// A channel of its own: ch may be closed by an error.
		if c, err := conn.Channel(); err == nil {
			_, _ = c.QueueDelete(queue, false, false, false)
			_ = c.Close()
		}
	}()
	// The channel the order publisher publishes on; no message ids are
	// tracked (the messages carry none), so any return is a stray.
	cc, err := broker.NewConfirmChannel(ch, 1)
	if err != nil {
		return Result{}, fmt.Errorf("publish ceiling: %w", err)
	}
	body, err := sample(1, 1)
	if err != nil {
		return Result{}, err
	}
	msg := amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body}

	var sent, acked int64
	// The confirms awaited, oldest first: the broker confirms in order.
	awaiting := make([]*amqp.DeferredConfirmation, 0, window)
	wait := func() error {
		dc := awaiting[0]
		awaiting = awaiting[1:]
		select {
		case <-dc.Done():
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Second):
			return errors.New("publish ceiling: no confirm in 30 s")
		}
		if cc.Strays() > 0 {
			return errors.New("publish ceiling: message returned")
		}
		if !dc.Acked() {
			if cc.IsClosed() {
				return errors.New("publish ceiling: channel closed before every confirm")
			}
			return fmt.Errorf("publish ceiling: message %d nacked", dc.DeliveryTag)
		}
		acked++
		return nil
	}
	start := time.Now()
	end := start.Add(d)
	for time.Now().Before(end) {
		for sent-acked >= int64(window) {
			if err := wait(); err != nil {
				return Result{}, err
			}
		}
		dc, err := cc.Publish(ctx, "", queue, msg)
		if err != nil {
			return Result{}, fmt.Errorf("publish ceiling: %w", err)
		}
		awaiting = append(awaiting, dc)
		sent++
	}
	for acked < sent {
		if err := wait(); err != nil {
			return Result{}, err
		}
	}
	took := time.Since(start)
	if cc.Strays() > 0 {
		return Result{}, errors.New("publish ceiling: message returned")
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	if err != nil {
		return Result{}, fmt.Errorf("publish ceiling: count %s: %w", queue, err)
	}
	if int64(q.Messages) != acked {
		return Result{}, fmt.Errorf("publish ceiling: queue %s holds %d messages, %d were confirmed", queue, q.Messages, acked)
	}
	return result(Publish, "msgs/s", acked, took, window,
		fmt.Sprintf("%d persistent %d-byte messages confirmed on a quorum queue, up to %d awaiting their confirm", acked, len(body), window)), nil
}

// Batch is the worker's batch size the transaction ceiling writes.
const Batch = 100

// insertOrders is the worker's INSERT of fresh orders
// (worker/internal/store, insertOrders), for Batch orders.
var insertOrders = "INSERT INTO orders (order_id, activity_id, user_id, quantity, status, reason, idempotency_key, reserved_at) VALUES " +
	strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, 'confirmed', NULL, NULL, ?), ", Batch), ", ")

// takeStock is the worker's guarded stock update (worker/internal/store, takeStock).
const takeStock = "UPDATE activities SET stock = stock - ?, sold = sold + ? WHERE id = ? AND stock >= ?"

// Transactions commits transactions of Batch fresh orders (the worker's
// INSERT, then its guarded stock UPDATE) on conns connections for d, in a
// database of its own (database, on the server of cfg, made with the
// project's schema and dropped at the end). It is the worker's write without
// its redelivery and per-user checks: what MySQL itself can take. Afterwards
// the database must hold every order committed and the sale's sold count.
func Transactions(ctx context.Context, cfg conf.MySQL, database string, d time.Duration, conns int) (Result, error) {
	if conns <= 0 || d <= 0 {
		return Result{}, fmt.Errorf("transaction ceiling: connections %d and duration %v must be positive", conns, d)
	}
	dc, err := cfg.Driver()
	if err != nil {
		return Result{}, fmt.Errorf("transaction ceiling: %w", err)
	}
	if strings.ContainsAny(database, "`'\" ") || database == "" {
		return Result{}, fmt.Errorf("transaction ceiling: bad database name %q", database)
	}
	dc.DBName = database
	cfg.DSN = dc.FormatDSN()
	cfg.MaxOpenConns, cfg.MaxIdleConns = conns, conns
	db, err := schema.Open(ctx, cfg)
	if err != nil {
		return Result{}, fmt.Errorf("transaction ceiling: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = db.ExecContext(dctx, "DROP DATABASE IF EXISTS `"+database+"`")
		_ = db.Close()
	}()
	const activity = 1
	const stock = int64(1) << 50
	now := time.Now()
	if _, err := db.ExecContext(ctx, `INSERT INTO activities (id, total_stock, stock, sold, per_user_limit, starts_at, ends_at)
		VALUES (?, ?, ?, 0, 1, ?, ?)`, activity, stock, stock, now.Add(-time.Minute), now.Add(time.Hour)); err != nil {
		return Result{}, fmt.Errorf("transaction ceiling: create sale: %w", err)
	}
	var users atomic.Int64
	tx := func() error {
		args := make([]any, 0, 5*Batch)
		at := ordermsg.Time(time.Now().UnixMilli())
		for range Batch {
			u := users.Add(1)
			args = append(args, ordermsg.NewOrderID(activity), activity, fmt.Sprintf("u%d", u), 1, at)
		}
		t, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := t.ExecContext(ctx, insertOrders, args...); err != nil {
			_ = t.Rollback()
			return err
		}
		r, err := t.ExecContext(ctx, takeStock, Batch, Batch, activity, Batch)
		if err == nil {
			var n int64
			if n, err = r.RowsAffected(); err == nil && n != 1 {
				err = fmt.Errorf("stock update changed %d rows", n)
			}
		}
		if err != nil {
			_ = t.Rollback()
			return err
		}
		return t.Commit()
	}
	committed, took, err := saturate(conns, d, tx)
	if err != nil {
		return Result{}, fmt.Errorf("transaction ceiling: %w", err)
	}
	orders := committed * Batch
	var rows, sold int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM orders WHERE activity_id = ?", activity).Scan(&rows); err != nil {
		return Result{}, fmt.Errorf("transaction ceiling: count: %w", err)
	}
	if err := db.QueryRowContext(ctx, "SELECT sold FROM activities WHERE id = ?", activity).Scan(&sold); err != nil {
		return Result{}, fmt.Errorf("transaction ceiling: count: %w", err)
	}
	if rows != orders || sold != orders {
		return Result{}, fmt.Errorf("transaction ceiling: %d orders committed, the database holds %d rows and sold %d", orders, rows, sold)
	}
	return result(Transaction, "orders/s", orders, took, conns,
		fmt.Sprintf("%d transactions of %d orders (INSERT + guarded stock UPDATE) on %d connections", orders/Batch, Batch, conns)), nil
}

// Scripts calls reserve.lua through the backend's own call
// (reservation.Store.Reserve) for d from conns goroutines, every call a
// fresh user and order of one sale of its own (activityID under prefix,
// warmed here and deleted at the end), without HTTP, publish or confirm.
// Every call must reserve, and Redis must then hold as many pending units.
func Scripts(ctx context.Context, rdb reservation.Client, prefix string, activityID int64, d time.Duration, conns int) (Result, error) {
	if conns <= 0 || d <= 0 {
		return Result{}, fmt.Errorf("reserve ceiling: connections %d and duration %v must be positive", conns, d)
	}
	st := reservation.New(rdb, prefix)
	now := time.Now()
	out, _, err := st.Warm(ctx, activityID, reservation.WarmArgs{Total: 1 << 40, Limit: 1,
		Start: now.Add(-time.Minute), End: now.Add(time.Hour), Gen: 1, CreateOnly: true})
	if err != nil {
		return Result{}, fmt.Errorf("reserve ceiling: %w", err)
	}
	if out != reservation.WarmCreated {
		return Result{}, fmt.Errorf("reserve ceiling: sale %d under %q: warm answered %q (it exists: pick a fresh id)", activityID, prefix, out)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if keys, err := st.SaleKeys(dctx, activityID); err == nil {
			_ = rdb.Del(dctx, keys...).Err()
		}
		_ = st.Deactivate(dctx, activityID)
	}()
	var users atomic.Int64
	calls, took, err := saturate(conns, d, func() error {
		u := users.Add(1)
		res, err := st.Reserve(ctx, reservation.Request{ActivityID: activityID, UserID: fmt.Sprintf("u%d", u),
			Quantity: 1, OrderID: ordermsg.NewOrderID(activityID), TTL: time.Hour})
		if err == nil && res.Outcome != reservation.Reserved {
			err = fmt.Errorf("call answered %q", res.Outcome)
		}
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("reserve ceiling: %w", err)
	}
	sale, found, err := st.Sale(ctx, activityID)
	if err != nil || !found {
		return Result{}, fmt.Errorf("reserve ceiling: read sale %d: found %v, %v", activityID, found, err)
	}
	if sale.Pending != calls {
		return Result{}, fmt.Errorf("reserve ceiling: %d calls reserved, Redis holds %d pending units", calls, sale.Pending)
	}
	return result(Reserve, "calls/s", calls, took, conns,
		fmt.Sprintf("%d reserve.lua calls (reservation.Store.Reserve, each a fresh user) from %d goroutines", calls, conns)), nil
}

// Results are the ceilings of one run, by name.
type Results []Result

// Get returns the ceiling named name.
func (rs Results) Get(name string) (Result, bool) {
	for _, r := range rs {
		if r.Name == name {
			return r, true
		}
	}
	return Result{}, false
}

// saturate runs op from conns goroutines, each as fast as it returns, for d;
// it reports how many calls succeeded and how long the run took, or the
// first error (its goroutine stops there, the others run out their time).
func saturate(conns int, d time.Duration, op func() error) (int64, time.Duration, error) {
	var n atomic.Int64
	errs := make(chan error, conns)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if err := op(); err != nil {
					errs <- err
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	return n.Load(), took, <-errs
}
