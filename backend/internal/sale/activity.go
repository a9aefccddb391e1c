package sale

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/seckill/seckill/internal/backoff"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
)

// mysqlRow is an activities row.
type mysqlRow struct {
	Total, Stock, Sold, Limit int64
	Start, End                time.Time
	Gen                       int64 // bumped by every admin change
	Archived                  bool  // Redis holds no per-order state of the sale
	Shards                    int   // stock shards, fixed at creation
	// Fresh: nothing of the sale can be in the queue — the admin change at
	// hand creates it, or reopens it from an archive (archived only once
	// every order was settled). Not read from MySQL.
	Fresh bool
}

const selectActivity = `SELECT total_stock, stock, sold, per_user_limit, starts_at, ends_at, generation, archived_at IS NOT NULL, stock_shards
	FROM activities WHERE id = ?`

func scanActivity(row *sql.Row) (mysqlRow, bool, error) {
	var a mysqlRow
	err := row.Scan(&a.Total, &a.Stock, &a.Sold, &a.Limit, &a.Start, &a.End, &a.Gen, &a.Archived, &a.Shards)
	if errors.Is(err, sql.ErrNoRows) {
		return mysqlRow{}, false, nil
	}
	if err != nil {
		return mysqlRow{}, false, err
	}
	a.Start, a.End = a.Start.UTC(), a.End.UTC()
	return a, true, nil
}

func (s *Service) loadActivity(ctx context.Context, id int64) (mysqlRow, bool, error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	a, found, err := scanActivity(s.db.QueryRowContext(qctx, selectActivity, id))
	if err != nil {
		return mysqlRow{}, false, fmt.Errorf("load activity %d: %w", id, err)
	}
	return a, found, nil
}

func (s *Service) loadUsers(ctx context.Context, id int64) (map[string]int64, error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	return salesdb.Users(qctx, s.db, id)
}

// warm writes MySQL's facts a to Redis, loading per-user totals when Redis
// lost the sale (or archived it, and a reopens it) and MySQL has sold units.
// With createOnly (a rebuild) a sale that exists in Redis is left alone.
// A sale built anew gets the records and keys of the orders MySQL decided,
// so that a client retrying with its Idempotency-Key finds its order: a
// rebuild restores them before it calls warm, and an admin change that
// builds the sale (it reopens an archived sale, or Redis lost it) here,
// before the warm makes the sale visible — a keyed replay arriving in
// between would otherwise reserve a second order for its key.
func (s *Service) warm(ctx context.Context, id int64, a mysqlRow, createOnly bool) (reservation.WarmOutcome, reservation.Sale, error) {
	args := reservation.WarmArgs{Total: a.Total, Limit: a.Limit, Start: a.Start, End: a.End, Sold: a.Sold,
		CreateOnly: createOnly, Gen: a.Gen, Shards: a.Shards}
	if !createOnly {
		if err := s.restoreIfBuilt(ctx, id, a); err != nil {
			return "", reservation.Sale{}, err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	out, sale, err := s.store.Warm(rctx, id, args)
	cancel()
	if err != nil && !timedOut(err) {
		// A broken connection: once more (warm.lua is safe to repeat; a
		// create-only repeat of a create that ran answers "exists").
		rctx, cancel = context.WithTimeout(ctx, s.cfg.RedisTimeout)
		out, sale, err = s.store.Warm(rctx, id, args)
		cancel()
	}
	if err == nil && out == reservation.WarmNeedUsers {
		if args.Users, err = s.loadUsers(ctx, id); err != nil {
			return "", reservation.Sale{}, err
		}
		rctx, cancel = context.WithTimeout(ctx, s.cfg.RedisTimeout)
		out, sale, err = s.store.Warm(rctx, id, args)
		cancel()
	}
	if err == nil && out == reservation.WarmCreated && !createOnly && s.afterWarm != nil {
		s.afterWarm(id)
	}
	return out, sale, err
}

// restoreIfBuilt restores MySQL's decided orders of a sale that a warm of
// generation gen will build anew: Redis holds none of it, or only the
// summary of an archive older than gen (warm.lua reopens it). The caller
// holds the activity's row lock, so no other admin change or archive moves
// the sale meanwhile; a rebuild that builds it first finds the same orders
// (what Redis holds wins, see lua/restore.lua). A live sale Redis lost
// (not a reopened archive, not one this change creates) may have orders in
// the queue: it recovers like a rebuild does, until its drain marker passes.
func (s *Service) restoreIfBuilt(ctx context.Context, id int64, a mysqlRow) error {
	gen := a.Gen
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	cur, found, err := s.store.Sale(rctx, id)
	cancel()
	if err != nil {
		return err
	}
	if found && !(cur.Archived && cur.Gen < gen) {
		return nil
	}
	window := time.Duration(0)
	if !found && !a.Fresh {
		window = s.cfg.RecoveryMax
	}
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	s.store.SetShards(id, a.Shards)
	token, err := salesdb.Restore(qctx, s.db, s.store, id, a.Total, window)
	s.sendMarker(id, token)
	return err
}

// errArchived: the sale is archived; MySQL answers for it.
var errArchived = errors.New("sale archived")

// rebuild puts a sale that Redis lost back from MySQL, once per activity at a
// time however many requests find it missing. found is false when MySQL has
// no such activity; the error is errArchived for an archived sale, which
// stays out of Redis.
func (s *Service) rebuild(ctx context.Context, id int64) (bool, error) {
	ctx = context.WithoutCancel(ctx) // shared by every waiter
	found, err, _ := s.rebuilds.Do(strconv.FormatInt(id, 10), func() (any, error) {
		a, found, err := s.loadActivity(ctx, id)
		if err != nil || !found {
			s.m.rebuilt("not_found", err)
			return false, err
		}
		if a.Archived {
			s.m.rebuilt("archived", nil)
			return true, errArchived
		}
		// Before the sale exists again: orders MySQL decided get their
		// records and keys back (a client retrying with its Idempotency-Key
		// finds its order), and the sale recovers — keys Redis does not
		// know are answered from MySQL or 503, nothing new is reserved —
		// until a worker takes the drain marker sent below: every order
		// queued before the loss is then decided. A failure leaves the sale
		// missing: the next request tries again.
		qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
		s.store.SetShards(id, a.Shards)
		token, err := salesdb.Restore(qctx, s.db, s.store, id, a.Total, s.cfg.RecoveryMax)
		cancel()
		if err != nil {
			s.m.rebuilt("restore", err)
			return false, err
		}
		// Create only: a sale that exists meanwhile (another rebuild, an admin
		// change) is newer than this unlocked read of MySQL.
		out, _, err := s.warm(ctx, id, a, true)
		if err == nil && out == reservation.WarmConflict {
			err = fmt.Errorf("redis refused the rebuild of activity %d: MySQL sold %d of %d", id, a.Sold, a.Total)
		}
		s.m.rebuilt(string(out), err)
		if err != nil {
			return false, err
		}
		if out == reservation.WarmArchived {
			return true, errArchived
		}
		s.sendMarker(id, token)
		s.log.Info("activity rebuilt in Redis from MySQL", "activity_id", id, "outcome", out)
		return true, nil
	})
	return found.(bool), err
}

// errStopped: the service closed before a background step ran.
var errStopped = errors.New("service closed")

// markerSent is the last drain marker this backend sent for an activity.
type markerSent struct {
	token string
	at    time.Time
}

// sendMarker publishes the drain marker of a sale's recovery (token) in the
// background, one copy to every partition (broker.Publisher.PublishMarker),
// retrying until the broker confirms it; never before PublishTimeout after
// the rebuild that began the recovery (the token's time): a purchase whose
// reservation Redis lost may still be publishing, and its message must be
// ahead of the marker if its publish is confirmed at all (past
// PublishTimeout its backend refuses it: failed in MySQL). Once confirmed it is
// sent again only after ReservationTTL, while the sale still recovers under
// that token: a marker lost with its queue (or dead-lettered) would
// otherwise leave the sale recovering until RecoveryMax. Copies are
// harmless: the first one a worker takes ends the recovery, the others find
// it ended. The backend that rebuilt the sale sends the first marker; any
// backend whose purchase meets the recovery (the reconciler rebuilt it)
// sends one too.
func (s *Service) sendMarker(id int64, token string) {
	if token == "" {
		return
	}
	now := s.now()
	s.markersMu.Lock()
	last, ok := s.markers[id]
	if ok && last.token == token && now.Sub(last.at) < s.cfg.ReservationTTL {
		s.markersMu.Unlock()
		return
	}
	s.markers[id] = markerSent{token: token, at: now}
	s.markersMu.Unlock()
	m := ordermsg.Marker{ActivityID: id, Token: token}
	notBefore := now.Add(s.cfg.PublishTimeout)
	if at, ok := salesdb.TokenTime(token); ok {
		notBefore = at.Add(s.cfg.PublishTimeout)
	}
	// Retried as a background Redis call is, up to the reservation TTL; each
	// try waits for notBefore first, then has PublishTimeout of its own.
	p := s.redisRetry("backend_drain_marker", now.Add(s.cfg.ReservationTTL))
	p.TryTimeout = 0
	s.later(p, func(r string) { s.m.purchased("drain_marker_" + r) }, func(ctx context.Context) error {
		// The wait for notBefore ends at Close; the publish after it does not.
		if d := time.Until(notBefore); d > 0 && !backoff.Sleep(s.bgCtx, d) {
			return errStopped
		}
		pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
		defer cancel()
		err := s.pub.PublishMarker(pctx, m)
		if err == nil || errors.Is(err, broker.ErrDuplicate) {
			s.m.purchased("drain_marker_sent")
			return nil
		}
		return err
	}, func(err error) {
		// The next purchase that meets the recovery sends it again.
		s.markersMu.Lock()
		if s.markers[id].token == token {
			delete(s.markers, id)
		}
		s.markersMu.Unlock()
		s.log.Warn("drain marker not confirmed; a later purchase sends it again", "activity_id", id, "err", err)
	})
}

// keyOrder answers a key Redis does not know while a sale recovers from a
// Redis loss: MySQL's order of that key is restored to Redis and replayed;
// without one the outcome of the key's earlier attempt is unknown: 503.
func (s *Service) keyOrder(ctx context.Context, r PurchaseRequest) (PurchaseResult, error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	d, found, err := salesdb.KeyOrder(qctx, s.db, r.ActivityID, r.UserID, r.IdempotencyKey)
	cancel()
	if err != nil {
		return PurchaseResult{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if !found {
		return PurchaseResult{}, fmt.Errorf("%w: key of activity %d unknown while the sale recovers from a Redis loss", ErrUnavailable, r.ActivityID)
	}
	// The key only: the record is the worker's settle to write (with the
	// counters; a record written first would make it skip them).
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	if err := s.store.RestoreKeys(rctx, r.ActivityID, []reservation.Decided{d}); err != nil {
		s.log.Debug("restore of a key's order failed; MySQL answered it", "order_id", d.OrderID, "err", err)
	}
	cancel()
	status := "failed"
	if d.Confirmed {
		status = "confirmed"
	}
	return PurchaseResult{Outcome: Accepted, OrderID: d.OrderID, Status: status, Replay: true}, nil
}

// State words of an activity.
const (
	StateUpcoming = "upcoming"
	StateOpen     = "open"
	StateSoldOut  = "sold_out"
	StateEnded    = "ended"
)

// ActivityView is the contract's view of a sale.
type ActivityView struct {
	ActivityID   int64     `json:"activity_id"`
	Stock        int64     `json:"stock"`
	Available    int64     `json:"available"`
	Pending      int64     `json:"pending"`
	Sold         int64     `json:"sold"`
	PerUserLimit int64     `json:"per_user_limit"`
	StartsAt     time.Time `json:"starts_at"`
	EndsAt       time.Time `json:"ends_at"`
	State        string    `json:"state"`
	// AsOf is when this state was read from Redis (or MySQL); answers from
	// the local cache are up to one TTL old.
	AsOf time.Time `json:"as_of"`
	// Stale marks the last known state, answered while Redis and MySQL could
	// not be read in time.
	Stale bool `json:"stale,omitempty"`
}

func stateAt(now, start, end time.Time, available int64) string {
	switch {
	case now.Before(start):
		return StateUpcoming
	case !now.Before(end):
		return StateEnded
	case available <= 0:
		return StateSoldOut
	}
	return StateOpen
}

func mysqlView(id int64, a mysqlRow, now time.Time) ActivityView {
	v := ActivityView{
		ActivityID: id, Stock: a.Total, Available: a.Stock, Sold: a.Sold, PerUserLimit: a.Limit,
		StartsAt: a.Start, EndsAt: a.End, AsOf: now,
	}
	v.State = stateAt(now, v.StartsAt, v.EndsAt, v.Available)
	return v
}

// OrderView is the contract's view of an order.
type OrderView struct {
	OrderID    string `json:"order_id"`
	ActivityID int64  `json:"activity_id"`
	UserID     string `json:"user_id"`
	Quantity   int64  `json:"quantity"`
	Status     string `json:"status"`
	Reason     string `json:"reason,omitempty"`
}

// Order answers an order's status: a pending (or claimed) record in Redis,
// else MySQL's row (the truth once written), else Redis's final record.
func (s *Service) Order(ctx context.Context, orderID string) (OrderView, error) {
	id, err := ordermsg.ActivityOf(orderID)
	if err != nil {
		return OrderView{}, ErrOrderNotFound
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	rec, inRedis, rerr := s.store.Order(rctx, id, orderID)
	cancel()
	if rerr != nil {
		inRedis = false
	}
	fromRecord := func() OrderView {
		v := OrderView{OrderID: orderID, ActivityID: id, UserID: rec.UserID, Quantity: rec.Quantity, Status: rec.State.Public()}
		if v.Status == "failed" {
			v.Reason = rec.Reason
			if v.Reason == "" {
				v.Reason = "failed"
			}
		}
		return v
	}
	if inRedis && (rec.State == reservation.Pending || rec.State == reservation.Claimed) {
		return fromRecord(), nil
	}
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	var v OrderView
	var reason sql.NullString
	err = s.db.QueryRowContext(qctx,
		`SELECT activity_id, user_id, quantity, status, reason FROM orders WHERE order_id = ?`, orderID).
		Scan(&v.ActivityID, &v.UserID, &v.Quantity, &v.Status, &reason)
	switch {
	case err == nil:
		v.OrderID, v.Reason = orderID, reason.String
		if v.Status == "failed" && v.Reason == "" {
			v.Reason = "failed"
		}
		return v, nil
	case inRedis:
		return fromRecord(), nil
	case errors.Is(err, sql.ErrNoRows):
		if rerr != nil {
			return OrderView{}, fmt.Errorf("%w: %v", ErrUnavailable, rerr)
		}
		return OrderView{}, ErrOrderNotFound
	}
	return OrderView{}, fmt.Errorf("%w: read order %s: %v", ErrUnavailable, orderID, err)
}

// Spec is an admin's description of a sale.
type Spec struct {
	Stock, PerUserLimit int64
	StartsAt, EndsAt    time.Time
	// StockShards splits the stock over this many Redis slots; 0: the
	// configured default for a new activity, the activity's own count for
	// an existing one (fixed at creation: another count is a conflict).
	StockShards int
}

// PutActivity creates or updates a sale. Raising stock (or creating): MySQL
// first, then Redis. Lowering: Redis first (refused below what Redis sold and
// reserved), then MySQL (refused below what MySQL sold; Redis is then put
// back). The activities row stays locked (FOR UPDATE) across both steps so
// admin changes of one activity are serialised across backends. Errors wrap
// ErrConflict or ErrUnavailable.
func (s *Service) PutActivity(ctx context.Context, id int64, spec Spec) (ActivityView, bool, error) {
	spec.StartsAt = spec.StartsAt.UTC().Truncate(time.Millisecond)
	spec.EndsAt = spec.EndsAt.UTC().Truncate(time.Millisecond)
	created, err := s.putActivity(ctx, id, spec)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1062 {
		// Two creates raced; the loser updates what the winner created.
		created, err = s.putActivity(ctx, id, spec)
	}
	if err != nil {
		if errors.Is(err, ErrConflict) || errors.Is(err, ErrUnavailable) {
			return ActivityView{}, false, err
		}
		return ActivityView{}, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	// This backend forgets at once; the others hear it on the stock-event
	// channel (an unsent event leaves them one TTL behind, no more).
	s.Changed(id)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RedisTimeout)
	if err := s.store.Announce(actx, id); err != nil {
		s.log.Warn("admin change saved; other instances see it when their caches expire", "activity_id", id, "err", err)
	}
	cancel()
	v, err := s.Activity(ctx, id)
	return v, created, err
}

func (s *Service) putActivity(ctx context.Context, id int64, spec Spec) (created bool, err error) {
	ctx = context.WithoutCancel(ctx) // an admin change runs to its end
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	tx, err := s.db.BeginTx(qctx, nil)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	old, found, err := scanActivity(tx.QueryRowContext(qctx, selectActivity+` FOR UPDATE`, id))
	if err != nil {
		return false, err
	}
	next := mysqlRow{Total: spec.Stock, Limit: spec.PerUserLimit, Start: spec.StartsAt, End: spec.EndsAt, Gen: old.Gen + 1,
		Shards: old.Shards}
	if !found {
		next.Shards = spec.StockShards
		if next.Shards == 0 {
			next.Shards = max(s.cfg.StockShards, 1)
		}
		if _, err = tx.ExecContext(qctx, `INSERT INTO activities
			(id, total_stock, stock, sold, per_user_limit, starts_at, ends_at, stock_shards) VALUES (?, ?, ?, 0, ?, ?, ?, ?)`,
			id, spec.Stock, spec.Stock, spec.PerUserLimit, spec.StartsAt, spec.EndsAt, next.Shards); err != nil {
			return false, err
		}
		if err = tx.Commit(); err != nil {
			return false, err
		}
		next.Fresh = true
		return true, s.warmAfterCommit(ctx, id, next)
	}
	if spec.StockShards != 0 && spec.StockShards != old.Shards {
		// Users are homed, and order ids named, by the shard count: it
		// stays what the activity was created with.
		return false, fmt.Errorf("%w: stock_shards is fixed when the activity is created (%d), got %d",
			ErrConflict, old.Shards, spec.StockShards)
	}
	next.Sold = old.Sold
	next.Fresh = old.Archived
	if spec.Stock < old.Sold {
		return false, fmt.Errorf("%w: stock %d is below the %d units MySQL has sold", ErrConflict, spec.Stock, old.Sold)
	}
	update := func() error {
		// A new generation, and no longer archived: whatever the archiver
		// checked before this change is no longer what it would archive.
		_, err := tx.ExecContext(qctx, `UPDATE activities SET total_stock = ?, stock = ? - sold,
			per_user_limit = ?, starts_at = ?, ends_at = ?, generation = generation + 1, archived_at = NULL WHERE id = ?`,
			spec.Stock, spec.Stock, spec.PerUserLimit, spec.StartsAt, spec.EndsAt, id)
		return err
	}
	if spec.Stock >= old.Total {
		if err = update(); err != nil {
			return false, err
		}
		if err = tx.Commit(); err != nil {
			return false, err
		}
		return false, s.warmAfterCommit(ctx, id, next)
	}
	// Lowering: Redis first.
	out, rs, err := s.warm(ctx, id, next, false)
	if err != nil {
		return false, err
	}
	if out == reservation.WarmConflict {
		return false, fmt.Errorf("%w: stock %d is below the %d sold and %d reserved in Redis",
			ErrConflict, spec.Stock, rs.Sold, rs.Pending)
	}
	if err = update(); err == nil {
		err = tx.Commit()
	}
	if err != nil {
		// MySQL kept the old total: put Redis back to it (raising Redis to what
		// MySQL holds is the safe direction).
		if _, _, rerr := s.warm(ctx, id, old, false); rerr != nil {
			s.log.Error("lowering stock failed in MySQL and Redis could not be restored; the reconciler repairs it",
				"activity_id", id, "err", err, "restore_err", rerr)
		}
		return false, err
	}
	return false, nil
}

// warmAfterCommit brings Redis up to a change MySQL already holds. It warms
// from the row as it is now, read under its lock: a later change of the same
// activity (which takes that lock too) may have committed meanwhile, and an
// older value must never overwrite what it wrote to Redis.
func (s *Service) warmAfterCommit(ctx context.Context, id int64, next mysqlRow) error {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	tx, err := s.db.BeginTx(qctx, nil)
	if err != nil {
		return fmt.Errorf("%w: saved in MySQL, Redis not updated (repeat the request): %v", ErrUnavailable, err)
	}
	defer func() { _ = tx.Rollback() }()
	cur, found, err := scanActivity(tx.QueryRowContext(qctx, selectActivity+` FOR UPDATE`, id))
	if err != nil || !found {
		return fmt.Errorf("%w: saved in MySQL, Redis not updated (repeat the request): re-read: found=%v %v", ErrUnavailable, found, err)
	}
	cur.Fresh = next.Fresh
	out, rs, err := s.warm(ctx, id, cur, false)
	if err != nil {
		return fmt.Errorf("%w: saved in MySQL, Redis not updated (repeat the request): %v", ErrUnavailable, err)
	}
	if out == reservation.WarmConflict {
		return fmt.Errorf("%w: saved in MySQL, but Redis holds %d sold and %d reserved, above stock %d",
			ErrConflict, rs.Sold, rs.Pending, cur.Total)
	}
	return tx.Commit()
}
