// Package sweep resolves reservations whose deadline passed (I4: nothing stays
// pending past its deadline plus one sweep — except an order whose message the
// broker confirmed, which waits for the workers however long they are away).
// One sweeper is active across the fleet at a time, through a fenced Redis
// lease renewed between chunks, so a long sweep never overlaps the next
// holder's; its writes are idempotent besides.
//
// For overdue reservations, in chunks of Batch per round trip, the sweeper asks
// MySQL, the truth:
//   - the order row exists: settle Redis with its outcome;
//   - absent, and the record says the broker confirmed its message (queued):
//     the message is safe in the queue, so look again later, never expire it;
//   - absent and never confirmed, past deadline + grace: no message can be
//     waiting for it save one whose publish outcome nobody learnt; insert it
//     as failed ("expired") with INSERT IGNORE — MySQL arbitrates against a
//     worker committing at the same moment — then settle Redis with whatever
//     row MySQL now holds. It is never re-published: a reservation nobody saw
//     confirmed may belong to a purchase that was answered 503.
package sweep

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/worker/internal/lease"
)

// Config of a sweeper.
type Config struct {
	Interval time.Duration // between sweeps
	// Grace past the deadline before a reservation whose message the broker
	// never confirmed is expired ([worker] republish_after).
	Grace        time.Duration
	QueryTimeout time.Duration // bound of each MySQL and Redis call
	Instance     string        // names the lease holder
	Batch        int64         // overdue orders handled per round trip
}

// Sweeper resolves overdue reservations.
type Sweeper struct {
	cfg   Config
	rdb   redis.UniversalClient
	store *reservation.Store
	db    *sql.DB
	log   *slog.Logger
	lease *lease.Lease

	afterChunk func() // test hook: runs between the chunks of a sweep
}

// New returns a sweeper.
func New(cfg Config, rdb redis.UniversalClient, store *reservation.Store, db *sql.DB, log *slog.Logger) *Sweeper {
	if cfg.Batch <= 0 {
		cfg.Batch = 1000
	}
	s := &Sweeper{cfg: cfg, rdb: rdb, store: store, db: db, log: log}
	s.lease = lease.New(rdb, s.leaseKey(), cfg.Instance, 3*cfg.Interval)
	return s
}

// Stats counts what one sweep did.
type Stats struct {
	Settled, Expired int
	// Waiting: queued orders (the broker confirmed their message) with no row
	// yet; looked at again later.
	Waiting int
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
		} else if st.Settled+st.Expired > 0 {
			s.log.Info("swept", "settled", st.Settled, "expired", st.Expired, "waiting", st.Waiting)
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

// ErrLeaseLost stops a sweep whose lease another instance took over.
var ErrLeaseLost = errors.New("sweeper lease lost")

// Sweep makes one pass over every warmed activity, in chunks, until nothing
// is overdue; between chunks it renews its lease (when it holds one) and
// stops if the lease was lost.
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
		for {
			n, err := s.sweepChunk(ctx, id, now, &st)
			if err != nil {
				errs = append(errs, err)
				break
			}
			if n < int(s.cfg.Batch) {
				break
			}
			if s.lease.Token() != 0 {
				held, err := s.acquire(ctx)
				if err != nil || !held {
					return st, errors.Join(append(errs, ErrLeaseLost, err)...)
				}
			}
			if s.afterChunk != nil {
				s.afterChunk()
			}
		}
	}
	return st, errors.Join(errs...)
}

// sweepChunk resolves up to Batch overdue orders of one activity; n is how
// many were overdue.
func (s *Sweeper) sweepChunk(ctx context.Context, id int64, now time.Time, st *Stats) (n int, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	due, err := s.store.Overdue(ctx, id, now, s.cfg.Batch)
	if err != nil || len(due) == 0 {
		return 0, err
	}
	recs, err := s.store.Records(ctx, id, due)
	if err != nil {
		return 0, err
	}
	var open []reservation.Record
	var gone []string // no record, or settled already
	for i, oid := range due {
		r, ok := recs[i], recs[i].OrderID != ""
		if !ok || r.State == reservation.Confirmed || r.State == reservation.Failed {
			gone = append(gone, oid)
			continue
		}
		open = append(open, r)
	}
	if err := s.store.Forget(ctx, id, gone...); err != nil {
		return 0, err
	}
	if len(open) == 0 {
		return len(due), nil
	}
	rows, err := s.lookup(ctx, open)
	if err != nil {
		return 0, err
	}
	var later, expire []reservation.Record
	var settle []reservation.Settlement
	for _, r := range open {
		if row, ok := rows[r.OrderID]; ok {
			settle = append(settle, row)
			st.Settled++
			continue
		}
		if r.Queued || now.Before(r.Deadline.Add(s.cfg.Grace)) {
			later = append(later, r)
			continue
		}
		expire = append(expire, r)
	}
	if len(expire) > 0 {
		if err := s.expire(ctx, id, expire); err != nil {
			return 0, err
		}
		again, err := s.lookup(ctx, expire)
		if err != nil {
			return 0, err
		}
		for _, r := range expire {
			row, ok := again[r.OrderID]
			if !ok {
				return 0, fmt.Errorf("expire order %s: row missing after insert", r.OrderID)
			}
			if row.Confirmed {
				st.Settled++ // a worker committed first
			} else {
				st.Expired++
			}
			settle = append(settle, row)
		}
	}
	if _, err := s.store.Settle(ctx, id, settle); err != nil {
		return 0, err
	}
	if len(later) > 0 {
		// Look again after a while, not on every sweep.
		next := now.Add(min(s.cfg.Grace/4+s.cfg.Interval, 10*time.Second))
		ids := make([]string, len(later))
		for i, r := range later {
			ids[i] = r.OrderID
		}
		if err := s.store.Postpone(ctx, id, next, ids...); err != nil {
			return 0, err
		}
		for _, r := range later {
			if r.Queued {
				st.Waiting++
			}
		}
	}
	return len(due), nil
}

// expire inserts orders as failed ("expired") unless MySQL has them.
func (s *Sweeper) expire(ctx context.Context, id int64, recs []reservation.Record) error {
	args := make([]any, 0, 4*len(recs))
	for _, r := range recs {
		args = append(args, r.OrderID, id, r.UserID, r.Quantity)
	}
	q := "INSERT IGNORE INTO orders (order_id, activity_id, user_id, quantity, status, reason) VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, 'failed', 'expired'), ", len(recs)), ", ")
	if _, err := s.db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("expire %d orders: %w", len(recs), err)
	}
	return nil
}

// lookup returns MySQL's rows of the orders, as settlements.
func (s *Sweeper) lookup(ctx context.Context, recs []reservation.Record) (map[string]reservation.Settlement, error) {
	args := make([]any, len(recs))
	for i, r := range recs {
		args[i] = r.OrderID
	}
	rows, err := s.db.QueryContext(ctx, "SELECT order_id, status, COALESCE(reason, ''), user_id, quantity FROM orders WHERE order_id IN ("+
		strings.TrimSuffix(strings.Repeat("?, ", len(recs)), ", ")+")", args...)
	if err != nil {
		return nil, fmt.Errorf("look up %d orders: %w", len(recs), err)
	}
	defer rows.Close()
	out := make(map[string]reservation.Settlement, len(recs))
	for rows.Next() {
		var o reservation.Settlement
		var status string
		if err := rows.Scan(&o.OrderID, &status, &o.Reason, &o.UserID, &o.Quantity); err != nil {
			return nil, fmt.Errorf("look up orders: %w", err)
		}
		o.Confirmed = status == "confirmed"
		out[o.OrderID] = o
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up orders: %w", err)
	}
	return out, nil
}
