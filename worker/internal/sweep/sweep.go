// Package sweep resolves reservations whose deadline passed (I4: nothing stays
// pending past its deadline plus one sweep). One sweeper is active across the
// fleet at a time, through a Redis lease; its writes are idempotent, so a stale
// holder that overlaps a new one for one tick does no harm.
//
// For an overdue reservation the sweeper asks MySQL, the truth:
//   - the order row exists: settle Redis with its outcome;
//   - absent, and the message may still be in flight (before deadline +
//     republish_after): publish the order again (the worker's insert is
//     idempotent) and look again later;
//   - absent after that: insert the order as failed ("expired") with INSERT
//     IGNORE — MySQL arbitrates against a worker committing at the same moment —
//     then settle Redis with whatever row MySQL now holds.
package sweep

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/worker/internal/lease"
)

// Publisher re-publishes an order and returns once the broker confirmed it.
type Publisher interface {
	Publish(ctx context.Context, o ordermsg.Order) error
}

// Config of a sweeper.
type Config struct {
	Interval       time.Duration // between sweeps
	RepublishAfter time.Duration // past the deadline, give up on the message after this
	QueryTimeout   time.Duration // bound of each MySQL and Redis call
	Instance       string        // names the lease holder
	Batch          int64         // overdue orders handled per activity per sweep
}

// Sweeper resolves overdue reservations.
type Sweeper struct {
	cfg   Config
	rdb   redis.UniversalClient
	store *reservation.Store
	db    *sql.DB
	pub   Publisher
	log   *slog.Logger
	lease *lease.Lease
}

// New returns a sweeper.
func New(cfg Config, rdb redis.UniversalClient, store *reservation.Store, db *sql.DB, pub Publisher, log *slog.Logger) *Sweeper {
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	s := &Sweeper{cfg: cfg, rdb: rdb, store: store, db: db, pub: pub, log: log}
	s.lease = lease.New(rdb, s.leaseKey(), cfg.Instance, 3*cfg.Interval)
	return s
}

// Stats counts what one sweep did.
type Stats struct {
	Settled, Republished, Expired int
}

// Run sweeps every Interval while it holds the lease, until ctx ends.
func (s *Sweeper) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.releaseLease()
			return nil
		case <-t.C:
		}
		held, err := s.acquire(ctx)
		if err != nil {
			s.log.Warn("sweeper lease", "err", err)
			continue
		}
		if !held {
			continue
		}
		if st, err := s.Sweep(ctx); err != nil {
			s.log.Warn("sweep", "err", err)
		} else if st != (Stats{}) {
			s.log.Info("swept", "settled", st.Settled, "republished", st.Republished, "expired", st.Expired)
		}
	}
}

func (s *Sweeper) leaseKey() string { return s.store.Prefix() + "seckill:sweeper" }

// acquire takes or renews the lease; the lease lasts three intervals so that
// one slow sweep does not hand it over.
func (s *Sweeper) acquire(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	return s.lease.Acquire(ctx)
}

func (s *Sweeper) releaseLease() {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.QueryTimeout)
	defer cancel()
	s.lease.Release(ctx)
}

// Sweep makes one pass over every warmed activity.
func (s *Sweeper) Sweep(ctx context.Context) (Stats, error) {
	var st Stats
	cctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	ids, err := s.store.Activities(cctx)
	var now time.Time
	if err == nil {
		now, err = s.rdb.Time(cctx).Result() // Redis's clock, as the scripts use
	}
	cancel()
	if err != nil {
		return st, fmt.Errorf("sweep: %w", err)
	}
	var errs []error
	for _, id := range ids {
		if err := s.sweepActivity(ctx, id, now, &st); err != nil {
			errs = append(errs, err)
		}
	}
	return st, errors.Join(errs...)
}

func (s *Sweeper) sweepActivity(ctx context.Context, id int64, now time.Time, st *Stats) error {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	due, err := s.store.Overdue(cctx, id, now, s.cfg.Batch)
	cancel()
	if err != nil {
		return err
	}
	for _, oid := range due {
		if err := s.resolve(ctx, id, oid, now, st); err != nil {
			return fmt.Errorf("sweep order %s: %w", oid, err)
		}
	}
	return nil
}

func (s *Sweeper) resolve(ctx context.Context, id int64, oid string, now time.Time, st *Stats) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	rec, found, err := s.store.Order(ctx, id, oid)
	if err != nil {
		return err
	}
	if !found {
		// A deadline without a record: nothing to resolve.
		return s.store.Forget(ctx, id, oid)
	}
	if rec.State == reservation.Confirmed || rec.State == reservation.Failed {
		return s.store.Forget(ctx, id, oid)
	}
	row, ok, err := s.lookup(ctx, oid)
	if err != nil {
		return err
	}
	if !ok && now.Before(rec.Deadline.Add(s.cfg.RepublishAfter)) {
		key, err := s.store.IdempotencyKey(ctx, id, oid)
		if err != nil {
			return err
		}
		msg := ordermsg.Order{
			V: ordermsg.Version, OrderID: oid, ActivityID: id, UserID: rec.UserID, Quantity: rec.Quantity,
			IdempotencyKey: key, Deadline: rec.Deadline.UnixMilli(),
		}
		if err := s.pub.Publish(ctx, msg); err != nil {
			return fmt.Errorf("republish: %w", err)
		}
		st.Republished++
		// Look again after a while, not on every sweep.
		next := now.Add(min(s.cfg.RepublishAfter/4+s.cfg.Interval, 10*time.Second))
		return s.store.Postpone(ctx, id, oid, next)
	}
	if !ok {
		st.Expired++
		return s.resolveExpired(ctx, id, oid, st)
	}
	st.Settled++
	return s.settle(ctx, id, oid, row)
}

// resolveExpired records an order whose message never reached MySQL as failed.
// INSERT IGNORE makes MySQL the arbiter: a worker that committed first keeps
// its row, and Redis follows whichever row MySQL holds.
func (s *Sweeper) resolveExpired(ctx context.Context, id int64, oid string, _ *Stats) error {
	rec, found, err := s.store.Order(ctx, id, oid)
	if err != nil || !found {
		return err
	}
	if _, err := s.db.ExecContext(ctx, `INSERT IGNORE INTO orders
		(order_id, activity_id, user_id, quantity, status, reason) VALUES (?, ?, ?, ?, 'failed', 'expired')`,
		oid, id, rec.UserID, rec.Quantity); err != nil {
		return fmt.Errorf("expire: %w", err)
	}
	row, ok, err := s.lookup(ctx, oid)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("expire: order row missing after insert")
	}
	return s.settle(ctx, id, oid, row)
}

func (s *Sweeper) settle(ctx context.Context, id int64, oid string, row orderRow) error {
	_, err := s.store.Settle(ctx, id, []reservation.Settlement{{
		OrderID: oid, Confirmed: row.status == "confirmed", Reason: row.reason,
		Quantity: row.quantity, UserID: row.userID,
	}})
	return err
}

type orderRow struct {
	status, reason, userID string
	quantity               int64
}

func (s *Sweeper) lookup(ctx context.Context, oid string) (orderRow, bool, error) {
	var r orderRow
	var reason sql.NullString
	err := s.db.QueryRowContext(ctx, `SELECT status, reason, user_id, quantity FROM orders WHERE order_id = ?`, oid).
		Scan(&r.status, &reason, &r.userID, &r.quantity)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("look up order: %w", err)
	}
	r.reason = reason.String
	return r, true, nil
}
