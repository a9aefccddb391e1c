// Package reconcile compares each sale's Redis counters with MySQL, the truth,
// exports the drift, and repairs it in the safe direction.
//
// Lag is normal while orders are in flight: a committed order stays "pending"
// in Redis until the worker settles it. Redis is unsafe only when it would sell
// more than MySQL still holds (Redis available > MySQL stock) or its total
// differs from MySQL's; then, and on demand (-force), the reconciler takes the
// activity's row lock in MySQL (no worker commits meanwhile), settles every open
// reservation MySQL already decided, and sets Redis's total, sold, pending and
// per-user totals exactly (lua/sync.lua). A sale missing from Redis is rebuilt
// from MySQL.
package reconcile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
)

// Metrics of the reconciler.
type Metrics struct {
	passes    prometheus.Counter
	repairs   *prometheus.CounterVec
	soldDrift *prometheus.GaugeVec
	unsafe    *prometheus.GaugeVec
}

// NewMetrics registers the reconciler's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seckill_reconcile_passes_total", Help: "Reconciliation passes run.",
		}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seckill_reconcile_repairs_total", Help: "Repairs made to Redis, by kind.",
		}, []string{"kind"}),
		soldDrift: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seckill_reconcile_sold_drift",
			Help: "MySQL sold minus Redis sold at the last pass (orders committed, not yet settled).",
		}, []string{"activity"}),
		unsafe: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seckill_reconcile_unsafe",
			Help: "1 when the last pass found Redis drifted beyond in-flight lag (and repaired it).",
		}, []string{"activity"}),
	}
	if reg != nil {
		reg.MustRegister(m.passes, m.repairs, m.soldDrift, m.unsafe)
	}
	return m
}

// Reconciler compares and repairs.
type Reconciler struct {
	db      *sql.DB
	store   *reservation.Store
	log     *slog.Logger
	m       *Metrics
	timeout time.Duration
	// recovery bounds the recovery of a rebuilt sale (SetRecoveryWindow).
	recovery time.Duration
}

// SetRecoveryWindow sets the longest recovery of a sale rebuilt after a
// Redis loss (reservation TTL plus queued_expire_after: past it the sweeper
// takes an order queued before the loss as gone). The recovery ends
// earlier, when a worker takes the sale's drain marker; a backend sends it
// on the first purchase that meets the recovery.
func (c *Reconciler) SetRecoveryWindow(d time.Duration) { c.recovery = d }

// New returns a reconciler; m may be nil.
func New(db *sql.DB, store *reservation.Store, log *slog.Logger, m *Metrics, timeout time.Duration) *Reconciler {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Reconciler{db: db, store: store, log: log, m: m, timeout: timeout}
}

// Report is one activity's comparison.
type Report struct {
	ActivityID            int64
	MySQLTotal, MySQLSold int64
	RedisFound            bool
	RedisTotal, RedisSold int64
	RedisPending          int64
	Archived              bool // archived: not compared
	Unsafe                bool
	Repairs               []string
}

func (r Report) String() string {
	s := fmt.Sprintf("activity %d: mysql total=%d sold=%d | redis ", r.ActivityID, r.MySQLTotal, r.MySQLSold)
	if r.Archived {
		return s + "archived"
	}
	if !r.RedisFound {
		s += "missing"
	} else {
		s += fmt.Sprintf("total=%d sold=%d pending=%d", r.RedisTotal, r.RedisSold, r.RedisPending)
	}
	if r.Unsafe {
		s += " | UNSAFE"
	}
	if len(r.Repairs) > 0 {
		s += " | repaired: " + strings.Join(r.Repairs, "; ")
	}
	return s
}

// Run makes a pass every interval until ctx ends.
func (c *Reconciler) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		reports, err := c.Pass(ctx, false)
		if err != nil {
			c.log.Warn("reconcile", "err", err)
		}
		for _, r := range reports {
			if len(r.Repairs) > 0 {
				c.log.Info("reconciled", "activity", r.ActivityID, "repairs", strings.Join(r.Repairs, "; "))
			}
		}
	}
}

// Pass compares every sale that is warmed in Redis or not yet over in MySQL.
// With force, every sale is synced exactly under MySQL's row lock.
func (c *Reconciler) Pass(ctx context.Context, force bool) ([]Report, error) {
	c.m.passes.Inc()
	ids, err := c.activities(ctx)
	if err != nil {
		return nil, err
	}
	var out []Report
	var errs []error
	for _, id := range ids {
		r, err := c.activity(ctx, id, force)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

func (c *Reconciler) activities(ctx context.Context) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	seen := map[int64]bool{}
	ids, err := c.store.Activities(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		seen[id] = true
	}
	rows, err := c.db.QueryContext(ctx, `SELECT id FROM activities WHERE ends_at > UTC_TIMESTAMP(3) - INTERVAL 1 DAY AND archived_at IS NULL`)
	if err != nil {
		return nil, fmt.Errorf("list activities: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, rows.Err()
}

type mysqlSale struct {
	total, sold, stock, limit int64
	start, end                time.Time
	gen                       int64
	archived                  bool
	shards                    int
}

func (c *Reconciler) activity(ctx context.Context, id int64, force bool) (Report, error) {
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	rep := Report{ActivityID: id}
	// Redis first, then MySQL: a worker's commit and settle only move MySQL's
	// sold up before Redis's, so in this order a healthy sale never looks
	// drifted.
	sale, found, err := c.store.Sale(cctx, id)
	if err != nil {
		return rep, err
	}
	var ms mysqlSale
	err = c.db.QueryRowContext(cctx, `SELECT total_stock, sold, stock, per_user_limit, starts_at, ends_at, generation, archived_at IS NOT NULL, stock_shards
		FROM activities WHERE id = ?`, id).Scan(&ms.total, &ms.sold, &ms.stock, &ms.limit, &ms.start, &ms.end, &ms.gen, &ms.archived, &ms.shards)
	if errors.Is(err, sql.ErrNoRows) {
		// Warmed in Redis, unknown to MySQL: nothing may be sold from it.
		return rep, fmt.Errorf("activity %d is in Redis but not in MySQL", id)
	}
	if err != nil {
		return rep, fmt.Errorf("read activity %d: %w", id, err)
	}
	rep.MySQLTotal, rep.MySQLSold = ms.total, ms.sold
	if ms.archived && (!found || sale.Archived) {
		// Archived (the archiver's work): MySQL answers for it, Redis keeps
		// at most its summary, and nothing walks it any more.
		rep.Archived = true
		return rep, c.store.Deactivate(cctx, id)
	}
	if found && sale.Archived && sale.Gen >= ms.gen {
		// Archived in Redis, not yet marked in MySQL: the archiver finishes
		// it (it walks the set, so the id stays).
		rep.Archived = true
		return rep, nil
	}
	if found && sale.Archived {
		// An admin change reopened the sale in MySQL and its Redis write did
		// not happen: a newer generation rebuilds it whole.
		found = false
	}
	if !found {
		if err := c.rebuild(cctx, id, ms); err != nil {
			return rep, err
		}
		rep.Repairs = append(rep.Repairs, "rebuilt missing sale from MySQL")
		c.m.repairs.WithLabelValues("rebuild").Inc()
		sale, found, err = c.store.Sale(cctx, id)
		if err != nil || !found {
			return rep, err
		}
	}
	rep.RedisFound = true
	rep.RedisTotal, rep.RedisSold, rep.RedisPending = sale.Total, sale.Sold, sale.Pending
	// Healthy: same total; Redis's sold lags MySQL's by at most what is still
	// pending (committed, not yet settled). Anything else is drift: Redis
	// selling more than MySQL holds, or answering sold out too early.
	rep.Unsafe = sale.Total != ms.total || sale.Sold > ms.sold || sale.Sold+sale.Pending < ms.sold
	label := strconv.FormatInt(id, 10)
	c.m.soldDrift.WithLabelValues(label).Set(float64(ms.sold - sale.Sold))
	if rep.Unsafe {
		c.m.unsafe.WithLabelValues(label).Set(1)
	} else {
		c.m.unsafe.WithLabelValues(label).Set(0)
	}
	if !force && !rep.Unsafe {
		return rep, nil
	}
	repairs, err := c.sync(ctx, id)
	if err != nil {
		return rep, err
	}
	rep.Repairs = append(rep.Repairs, repairs...)
	if sale, found, err = c.store.Sale(cctx, id); err == nil && found {
		rep.RedisTotal, rep.RedisSold, rep.RedisPending = sale.Total, sale.Sold, sale.Pending
		rep.Unsafe = false
		c.m.unsafe.WithLabelValues(label).Set(0)
		c.m.soldDrift.WithLabelValues(label).Set(float64(ms.sold - sale.Sold))
	}
	return rep, err
}

func (c *Reconciler) rebuild(ctx context.Context, id int64, ms mysqlSale) error {
	users, err := c.users(ctx, c.db, id)
	if err != nil {
		return err
	}
	// Before the sale exists again: decided orders get their records and
	// keys back, and the sale recovers until its drain marker is taken.
	c.store.SetShards(id, ms.shards)
	if _, err := salesdb.Restore(ctx, c.db, c.store, id, ms.total, c.recovery); err != nil {
		return err
	}
	out, _, err := c.store.Warm(ctx, id, reservation.WarmArgs{
		Total: ms.total, Limit: ms.limit, Start: ms.start, End: ms.end, Sold: ms.sold, Users: users,
		CreateOnly: true, // a sale that exists meanwhile is newer than this read
		Gen:        ms.gen,
		Shards:     ms.shards,
	})
	if err != nil {
		return err
	}
	switch out {
	case reservation.WarmCreated, reservation.WarmExists, reservation.WarmArchived:
		return nil // created, or the backend rebuilt it meanwhile, or the archiver archived it
	}
	return fmt.Errorf("rebuild activity %d: %s", id, out)
}

func (c *Reconciler) users(ctx context.Context, q salesdb.Querier, id int64) (map[string]int64, error) {
	return salesdb.Users(ctx, q, id)
}

// sync runs the exact repair under the activity's row lock.
func (c *Reconciler) sync(ctx context.Context, id int64) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	tx, err := c.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("sync activity %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	var total, sold int64
	if err := tx.QueryRowContext(ctx, `SELECT total_stock, sold FROM activities WHERE id = ? FOR UPDATE`, id).Scan(&total, &sold); err != nil {
		return nil, fmt.Errorf("lock activity %d: %w", id, err)
	}
	var repairs []string
	open, err := c.store.Open(ctx, id, 100_000)
	if err != nil {
		return nil, err
	}
	if settled, err := c.settleDecided(ctx, tx, id, open); err != nil {
		return nil, err
	} else if settled > 0 {
		repairs = append(repairs, fmt.Sprintf("settled %d orders MySQL had decided", settled))
		c.m.repairs.WithLabelValues("settle").Add(float64(settled))
	}
	users, err := c.users(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	res, err := c.store.Sync(ctx, id, total, sold, users)
	if err != nil {
		return nil, err
	}
	if !res.Found {
		return repairs, nil
	}
	if res.OldTotal != total || res.OldSold != sold || res.OldPending != res.NewPending {
		repairs = append(repairs, fmt.Sprintf("total %d→%d sold %d→%d pending %d→%d",
			res.OldTotal, total, res.OldSold, sold, res.OldPending, res.NewPending))
		c.m.repairs.WithLabelValues("counters").Inc()
	}
	if res.StaleIndexEntries > 0 {
		repairs = append(repairs, fmt.Sprintf("dropped %d settled orders from the deadline index", res.StaleIndexEntries))
	}
	return repairs, tx.Commit()
}

// settleDecided settles, in Redis, open reservations whose order MySQL holds.
func (c *Reconciler) settleDecided(ctx context.Context, tx *sql.Tx, id int64, open []reservation.Record) (int, error) {
	n := 0
	for start := 0; start < len(open); start += 500 {
		chunk := open[start:min(start+500, len(open))]
		args := make([]any, len(chunk))
		for i, r := range chunk {
			args[i] = r.OrderID
		}
		rows, err := tx.QueryContext(ctx, `SELECT order_id, status, COALESCE(reason, ''), user_id, quantity
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
			if _, err := c.store.Settle(ctx, id, set); err != nil {
				return n, err
			}
			n += len(set)
		}
	}
	return n, nil
}
