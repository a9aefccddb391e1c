// Package sale is the backend's purchase and admin logic: reserve in Redis,
// publish with confirms, compensate on failure, and keep Redis behind MySQL
// when a sale changes. It knows nothing of HTTP; the api package maps its
// results and sentinel errors to the contract.
package sale

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
)

// Errors the HTTP edge maps with errors.Is.
var (
	ErrActivityNotFound = errors.New("activity not found")
	ErrOrderNotFound    = errors.New("order not found")
	// ErrUnavailable: a dependency failed; nothing was kept.
	ErrUnavailable = errors.New("service unavailable")
	// ErrConflict: an admin change would let Redis sell more than MySQL holds.
	ErrConflict = errors.New("conflicting change")
)

// Publisher hands an order to the broker; nil only after the broker confirmed.
type Publisher interface {
	Publish(ctx context.Context, o ordermsg.Order) error
}

// Config holds the timeouts and TTLs of the service.
type Config struct {
	ReservationTTL time.Duration
	RedisTimeout   time.Duration // each Redis call
	PublishTimeout time.Duration // the wait for a confirm
	QueryTimeout   time.Duration // each MySQL statement or transaction
	SoldOutTTL     time.Duration // trust of a local sold-out flag without news
	NegativeTTL    time.Duration // trust of "no such activity in MySQL"
}

// Service runs purchases and admin changes.
type Service struct {
	store *reservation.Store
	db    *sql.DB
	pub   Publisher
	cfg   Config
	log   *slog.Logger
	m     *Metrics

	soldOut *flags
	missing *flags
	flight  group
	now     func() time.Time
}

// New returns a service. m may be nil.
func New(store *reservation.Store, db *sql.DB, pub Publisher, cfg Config, log *slog.Logger, m *Metrics) *Service {
	if cfg.NegativeTTL <= 0 {
		cfg.NegativeTTL = time.Second
	}
	return &Service{
		store: store, db: db, pub: pub, cfg: cfg, log: log, m: m,
		soldOut: newFlags(cfg.SoldOutTTL),
		missing: newFlags(cfg.NegativeTTL),
		flight:  group{calls: make(map[int64]*call)},
		now:     time.Now,
	}
}

// Outcome of a purchase that was decided (not an error).
type Outcome string

// Purchase outcomes.
const (
	Accepted      Outcome = "accepted"
	SoldOut       Outcome = "sold_out"
	Insufficient  Outcome = "insufficient_stock"
	LimitExceeded Outcome = "limit_exceeded"
	NotStarted    Outcome = "not_started"
	Ended         Outcome = "ended"
	BadQuantity   Outcome = "bad_quantity"
)

// PurchaseRequest is a validated purchase.
type PurchaseRequest struct {
	ActivityID     int64
	UserID         string
	IdempotencyKey string // "" for none
	Quantity       int64
}

// PurchaseResult is a decided purchase.
type PurchaseResult struct {
	Outcome   Outcome
	OrderID   string // Accepted
	Status    string // Accepted: "pending" | "confirmed" | "failed"
	Replay    bool   // Accepted: an earlier order of the same key
	Limit     int64  // BadQuantity, LimitExceeded
	Held      int64  // LimitExceeded
	Available int64  // Insufficient
}

// Purchase reserves, publishes and answers. The error is ErrActivityNotFound or
// wraps ErrUnavailable; ctx only bounds nothing itself: every call gets its own
// timeout from Config, derived from ctx.
func (s *Service) Purchase(ctx context.Context, r PurchaseRequest) (PurchaseResult, error) {
	now := s.now()
	// The key is checked first (docs/contract.md, idempotency), so only key-less requests may be
	// answered from the local flag.
	if r.IdempotencyKey == "" && s.soldOut.Has(r.ActivityID, now) {
		s.m.reserved("sold_out_cached", 0)
		return PurchaseResult{Outcome: SoldOut}, nil
	}
	if s.missing.Has(r.ActivityID, now) {
		s.m.reserved("not_found_cached", 0)
		return PurchaseResult{}, ErrActivityNotFound
	}
	epoch := s.soldOut.Epoch()
	res, err := s.reserve(ctx, r)
	if err != nil {
		return PurchaseResult{}, err
	}
	if res.Outcome == reservation.NotFound {
		missEpoch := s.missing.Epoch()
		found, err := s.rebuild(ctx, r.ActivityID)
		if errors.Is(err, errArchived) {
			return s.archived(ctx, r)
		}
		if err != nil {
			return PurchaseResult{}, fmt.Errorf("%w: rebuild activity %d: %v", ErrUnavailable, r.ActivityID, err)
		}
		if !found {
			s.missing.Set(r.ActivityID, missEpoch, s.now())
			return PurchaseResult{}, ErrActivityNotFound
		}
		if res, err = s.reserve(ctx, r); err != nil {
			return PurchaseResult{}, err
		}
		if res.Outcome == reservation.NotFound {
			return PurchaseResult{}, fmt.Errorf("%w: activity %d still missing in Redis after a rebuild", ErrUnavailable, r.ActivityID)
		}
	}
	switch res.Outcome {
	case reservation.Reserved:
		return s.publish(ctx, r, res)
	case reservation.Replay:
		return PurchaseResult{Outcome: Accepted, OrderID: res.OrderID, Status: res.State.Public(), Replay: true}, nil
	case reservation.SoldOut:
		s.soldOut.Set(r.ActivityID, epoch, s.now())
		return PurchaseResult{Outcome: SoldOut}, nil
	case reservation.Insufficient:
		return PurchaseResult{Outcome: Insufficient, Available: res.Available}, nil
	case reservation.LimitExceeded:
		return PurchaseResult{Outcome: LimitExceeded, Held: res.Held, Limit: res.Limit}, nil
	case reservation.NotStarted:
		return PurchaseResult{Outcome: NotStarted}, nil
	case reservation.Ended:
		if r.IdempotencyKey != "" {
			// An archived sale keeps no keys in Redis: MySQL knows them.
			return s.archived(ctx, r)
		}
		return PurchaseResult{Outcome: Ended}, nil
	case reservation.BadQuantity:
		return PurchaseResult{Outcome: BadQuantity, Limit: res.Limit}, nil
	}
	return PurchaseResult{}, fmt.Errorf("%w: reserve answered %q", ErrUnavailable, res.Outcome)
}

// archived answers a purchase of a sale that is over and may be archived:
// a keyed replay gets its order from MySQL (the key is stored with it), any
// other attempt "ended". While MySQL cannot say, a keyed attempt gets 503.
func (s *Service) archived(ctx context.Context, r PurchaseRequest) (PurchaseResult, error) {
	if r.IdempotencyKey == "" {
		return PurchaseResult{Outcome: Ended}, nil
	}
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	o, found, err := salesdb.KeyOrder(qctx, s.db, r.ActivityID, r.UserID, r.IdempotencyKey)
	if err != nil {
		return PurchaseResult{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if !found {
		return PurchaseResult{Outcome: Ended}, nil
	}
	status := "failed"
	if o.Confirmed {
		status = "confirmed"
	}
	s.m.reserved("replay_mysql", 0)
	return PurchaseResult{Outcome: Accepted, OrderID: o.OrderID, Status: status, Replay: true}, nil
}

// reserve runs reserve.lua with its own timeout; an order id collision (128
// random bits: practically never) is retried once with a fresh id.
func (s *Service) reserve(ctx context.Context, r PurchaseRequest) (reservation.Result, error) {
	for attempt := 0; ; attempt++ {
		req := reservation.Request{
			ActivityID: r.ActivityID, UserID: r.UserID, IdempotencyKey: r.IdempotencyKey,
			Quantity: r.Quantity, OrderID: ordermsg.NewOrderID(r.ActivityID), TTL: s.cfg.ReservationTTL,
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
		start := time.Now()
		res, err := s.store.Reserve(rctx, req)
		cancel()
		if err != nil {
			s.m.reserved("error", time.Since(start))
			// After a timeout the script may have run and only its reply been
			// lost: undo a reservation under this order id, so that the 503
			// keeps nothing ("missing": it never ran). One try, so that a
			// stalled Redis does not multiply the latency of every 503.
			if !timedOut(err) {
				return reservation.Result{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
			}
			if _, rerr := s.release(ctx, r, req.OrderID, "reserve_failed", 1); rerr != nil {
				s.log.Warn("reserve failed and its undo failed; a reservation made meanwhile is swept",
					"order_id", req.OrderID, "reserve_err", err, "release_err", rerr)
			}
			return reservation.Result{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		s.m.reserved(string(res.Outcome), time.Since(start))
		if res.Outcome != reservation.IDConflict || attempt > 0 {
			if res.Outcome == reservation.IDConflict {
				return reservation.Result{}, fmt.Errorf("%w: order id collision twice", ErrUnavailable)
			}
			return res, nil
		}
	}
}

// publish hands a fresh reservation to the broker. Confirmed: 202. Any
// failure: release.lua decides atomically against the worker's claim.lua —
// released (nothing kept: 503), or a worker already has it (202).
func (s *Service) publish(ctx context.Context, r PurchaseRequest, res reservation.Result) (PurchaseResult, error) {
	o := ordermsg.Order{
		V: ordermsg.Version, OrderID: res.OrderID, ActivityID: r.ActivityID, UserID: r.UserID,
		Quantity: r.Quantity, IdempotencyKey: r.IdempotencyKey,
		ReservedAt: res.Deadline.Add(-s.cfg.ReservationTTL).UnixMilli(), Deadline: res.Deadline.UnixMilli(),
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	perr := s.pub.Publish(pctx, o)
	cancel()
	if perr == nil {
		s.m.purchased("accepted")
		return PurchaseResult{Outcome: Accepted, OrderID: o.OrderID, Status: "pending"}, nil
	}
	out, rerr := s.release(ctx, r, o.OrderID, "publish_failed", releaseTries)
	if rerr != nil {
		// Unknown: the reservation stays pending with its deadline, and the
		// sweeper will re-publish or release it, so the order does end
		// confirmed or failed — that is a 202, not "nothing kept".
		s.m.purchased("accepted_unsettled")
		s.log.Warn("publish failed and release failed; the sweeper settles the order",
			"order_id", o.OrderID, "publish_err", perr, "release_err", rerr)
		return PurchaseResult{Outcome: Accepted, OrderID: o.OrderID, Status: "pending"}, nil
	}
	switch out {
	case reservation.Released:
		s.m.purchased("released")
		return PurchaseResult{}, fmt.Errorf("%w: %v (reservation released)", ErrUnavailable, perr)
	case reservation.AlreadyClaimed:
		s.m.purchased("accepted_claimed")
		return PurchaseResult{Outcome: Accepted, OrderID: o.OrderID, Status: "pending"}, nil
	case reservation.AlreadyConfirmed:
		s.m.purchased("accepted_claimed")
		return PurchaseResult{Outcome: Accepted, OrderID: o.OrderID, Status: "confirmed"}, nil
	case reservation.AlreadyFailed:
		s.m.purchased("accepted_claimed")
		return PurchaseResult{Outcome: Accepted, OrderID: o.OrderID, Status: "failed"}, nil
	}
	// missing: Redis lost the record in between; the publish outcome is
	// unknown and no sweeper can find it. Answer as a failed publish.
	s.m.purchased("released")
	return PurchaseResult{}, fmt.Errorf("%w: %v (reservation record lost)", ErrUnavailable, perr)
}

// releaseTries bounds the attempts of a compensation whose reply was lost:
// release.lua answers "released" again for a release already made, so a
// retry is safe and turns an unknown outcome into a known one.
const releaseTries = 3

// release gives an unpublished reservation back (release.lua), retrying when
// the reply is lost. It runs even when ctx was cancelled (shutdown).
func (s *Service) release(ctx context.Context, r PurchaseRequest, orderID, reason string, tries int) (reservation.ReleaseOutcome, error) {
	var err error
	for range tries {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RedisTimeout)
		var out reservation.ReleaseOutcome
		out, err = s.store.ReleaseUnpublished(rctx, r.ActivityID, orderID, reason, r.UserID, r.IdempotencyKey)
		cancel()
		if err == nil {
			return out, nil
		}
	}
	return "", err
}

// timedOut reports an error after which a Redis command may have run.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// group is a single-flight per activity id.
type group struct {
	mu    sync.Mutex
	calls map[int64]*call
}

type call struct {
	done  chan struct{}
	found bool
	err   error
}

func (g *group) do(id int64, fn func() (bool, error)) (bool, error) {
	g.mu.Lock()
	if c, ok := g.calls[id]; ok {
		g.mu.Unlock()
		<-c.done
		return c.found, c.err
	}
	c := &call{done: make(chan struct{})}
	g.calls[id] = c
	g.mu.Unlock()
	c.found, c.err = fn()
	g.mu.Lock()
	delete(g.calls, id)
	g.mu.Unlock()
	close(c.done)
	return c.found, c.err
}
