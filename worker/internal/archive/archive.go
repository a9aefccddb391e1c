// Package archive ends a sale's life in Redis: open → ended → archived. Once
// a sale's end plus a grace has passed, nothing of it is pending and Redis
// agrees with MySQL, the archiver removes its per-order and per-user Redis
// state (a summary of counters stays, with a TTL), marks the MySQL row
// archived and takes the id off the activity set, so the sweeper and the
// reconciler stop walking it and Redis holds only live sales. MySQL answers
// for an archived sale from then on.
//
// One worker at a time archives (a fenced lease), but correctness does not
// rest on the lease: each sale is archived under MySQL's row lock on the
// activity — the lock every admin change takes — by one atomic script that
// re-checks, in Redis, that the sale is the generation read under that lock,
// is past its end plus grace (Redis TIME), has nothing pending and agrees
// with MySQL's counters. An admin change that reopens or extends the sale
// bumps the generation under the same lock, so it is either before the
// archiver (which then refuses) or after it (and rebuilds the sale whole):
// the admin change wins.
package archive

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/worker/internal/lease"
)

// Config of an archiver.
type Config struct {
	Interval     time.Duration // between passes
	Grace        time.Duration // after a sale's end before it may be archived
	SummaryTTL   time.Duration // of the counters left in Redis
	QueryTimeout time.Duration // bound of each MySQL and Redis call
	Instance     string        // names the lease holder
	// Locked, when set, runs with the activity's row lock held, before the
	// archive script: tests force interleavings with it.
	Locked func(activityID int64)
}

// Metrics of the archiver.
type Metrics struct {
	outcomes *prometheus.CounterVec
}

// NewMetrics registers the archiver's metrics on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "seckill_archive_checks_total",
		Help: "Sales the archiver looked at, by outcome (archived, open, pending, stale, disagree, ...).",
	}, []string{"outcome"})}
	if reg != nil {
		reg.MustRegister(m.outcomes)
	}
	return m
}

// Archiver archives ended sales.
type Archiver struct {
	cfg   Config
	rdb   redis.UniversalClient
	store *reservation.Store
	db    *sql.DB
	log   *slog.Logger
	m     *Metrics
	lease *lease.Lease
}

// New returns an archiver; m may be nil.
func New(cfg Config, rdb redis.UniversalClient, store *reservation.Store, db *sql.DB, log *slog.Logger, m *Metrics) *Archiver {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Archiver{cfg: cfg, rdb: rdb, store: store, db: db, log: log, m: m,
		lease: lease.New(rdb, store.Prefix()+"seckill:archiver", cfg.Instance, 3*cfg.Interval)}
}

// Outcome of looking at one sale.
type Outcome string

// Outcomes besides the script's (reservation.Archive*).
const (
	Archived    Outcome = "archived"     // archived now
	Repaired    Outcome = "repaired"     // archived before; MySQL or the set caught up now
	NotDue      Outcome = "open"         // end + grace still ahead
	Pending     Outcome = "pending"      // reservations not settled yet
	Stale       Outcome = "stale"        // Redis holds another generation than MySQL
	Disagree    Outcome = "disagree"     // counters differ; the reconciler repairs them
	MissingSale Outcome = "missing"      // not in Redis (the reconciler rebuilds it)
	NoRow       Outcome = "no_mysql_row" // warmed in Redis, unknown to MySQL
)

// Run makes a pass every Interval while it holds the lease, until ctx ends.
func (a *Archiver) Run(ctx context.Context) {
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), a.cfg.QueryTimeout)
			a.lease.Release(rctx)
			cancel()
			return
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, a.cfg.QueryTimeout)
		held, err := a.lease.Acquire(lctx)
		cancel()
		if err != nil {
			a.log.Warn("archiver lease", "err", err)
			continue
		}
		if !held {
			continue
		}
		res, err := a.Pass(ctx)
		if err != nil {
			a.log.Warn("archive", "err", err)
		}
		for id, out := range res {
			if out == Archived || out == Repaired {
				a.log.Info("sale archived", "activity_id", id, "outcome", string(out))
			}
		}
	}
}

// Pass looks at every sale in the activity set once and returns each one's
// outcome.
func (a *Archiver) Pass(ctx context.Context) (map[int64]Outcome, error) {
	cctx, cancel := context.WithTimeout(ctx, a.cfg.QueryTimeout)
	ids, err := a.store.Activities(cctx)
	var now time.Time
	if err == nil {
		now, err = a.rdb.Time(cctx).Result() // Redis's clock, as the scripts use
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	out := make(map[int64]Outcome, len(ids))
	var errs []error
	for _, id := range ids {
		o, err := a.Activity(ctx, id, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[id] = o
		a.m.outcomes.WithLabelValues(string(o)).Inc()
	}
	return out, errors.Join(errs...)
}

// Activity archives one sale if it is due; now is Redis's time, for the
// cheap checks made before the row lock (the script checks again).
func (a *Archiver) Activity(ctx context.Context, id int64, now time.Time) (Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.QueryTimeout)
	defer cancel()
	sale, found, err := a.store.Sale(ctx, id)
	if err != nil {
		return "", err
	}
	switch {
	case found && sale.Archived:
		return a.repair(ctx, id, sale.Gen)
	case !found:
		// Redis lost the sale (or its summary expired before the id left the
		// set): an archived row only needs the id off the set; a live one is
		// the reconciler's to rebuild.
		var archived bool
		err := a.db.QueryRowContext(ctx, `SELECT archived_at IS NOT NULL FROM activities WHERE id = ?`, id).Scan(&archived)
		if errors.Is(err, sql.ErrNoRows) {
			return NoRow, nil
		}
		if err != nil {
			return "", fmt.Errorf("archive activity %d: %w", id, err)
		}
		if archived {
			return Repaired, a.store.Deactivate(ctx, id)
		}
		return MissingSale, nil
	case now.Before(sale.End.Add(a.cfg.Grace)):
		return NotDue, nil
	case sale.Pending > 0:
		return Pending, nil
	}
	return a.archive(ctx, id)
}

// archive runs the script under the activity's row lock and records the
// outcome in MySQL in the same transaction.
func (a *Archiver) archive(ctx context.Context, id int64) (Outcome, error) {
	tx, err := a.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return "", fmt.Errorf("archive activity %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	var total, sold, gen int64
	var archived bool
	err = tx.QueryRowContext(ctx, `SELECT total_stock, sold, generation, archived_at IS NOT NULL
		FROM activities WHERE id = ? FOR UPDATE`, id).Scan(&total, &sold, &gen, &archived)
	if errors.Is(err, sql.ErrNoRows) {
		return NoRow, nil
	}
	if err != nil {
		return "", fmt.Errorf("archive activity %d: lock: %w", id, err)
	}
	if a.cfg.Locked != nil {
		a.cfg.Locked(id)
	}
	out, gotGen, err := a.store.Archive(ctx, id, reservation.ArchiveArgs{
		Gen: gen, Total: total, Sold: sold, Grace: a.cfg.Grace, SummaryTTL: a.cfg.SummaryTTL,
	})
	if err != nil {
		return "", err
	}
	switch out {
	case reservation.ArchiveDone:
	case reservation.ArchiveAlready:
		if gotGen != gen {
			return Stale, nil
		}
	case reservation.ArchiveStale:
		return Stale, nil
	case reservation.ArchiveOpen:
		return NotDue, nil
	case reservation.ArchivePending:
		return Pending, nil
	case reservation.ArchiveDisagree:
		return Disagree, nil
	case reservation.ArchiveMissing:
		return MissingSale, nil
	}
	if !archived {
		if _, err := tx.ExecContext(ctx, `UPDATE activities SET archived_at = UTC_TIMESTAMP(3) WHERE id = ?`, id); err != nil {
			return "", fmt.Errorf("archive activity %d: mark: %w", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		// Redis is archived and MySQL not yet: the next pass repairs it.
		return "", fmt.Errorf("archive activity %d: commit: %w", id, err)
	}
	if err := a.store.Deactivate(ctx, id); err != nil {
		return "", err
	}
	if out == reservation.ArchiveAlready {
		return Repaired, nil
	}
	return Archived, nil
}

// repair finishes an archive whose MySQL mark or set removal did not happen
// (a crash or a failed commit after the script): MySQL is marked only while
// it still holds the generation Redis archived — an admin change since then
// wins.
func (a *Archiver) repair(ctx context.Context, id, gen int64) (Outcome, error) {
	if _, err := a.db.ExecContext(ctx, `UPDATE activities SET archived_at = UTC_TIMESTAMP(3)
		WHERE id = ? AND generation = ? AND archived_at IS NULL`, id, gen); err != nil {
		return "", fmt.Errorf("archive activity %d: mark: %w", id, err)
	}
	var archived bool
	if err := a.db.QueryRowContext(ctx, `SELECT archived_at IS NOT NULL FROM activities WHERE id = ?`, id).Scan(&archived); err != nil {
		return "", fmt.Errorf("archive activity %d: %w", id, err)
	}
	if !archived {
		return Stale, nil // reopened: the admin change's warm rebuilds it
	}
	return Repaired, a.store.Deactivate(ctx, id)
}
