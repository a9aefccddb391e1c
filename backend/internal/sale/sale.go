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

	"golang.org/x/sync/singleflight"

	"github.com/seckill/seckill/backend/internal/coalesce"
	"github.com/seckill/seckill/backend/internal/orderwait"
	"github.com/seckill/seckill/internal/backoff"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
	"github.com/seckill/seckill/internal/soldout"
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

// Publisher hands an order, a group's orders as one message, or a drain
// marker to the broker; nil only after the broker confirmed.
type Publisher interface {
	Publish(ctx context.Context, o ordermsg.Order) error
	PublishBatch(ctx context.Context, orders []ordermsg.Order) error
	PublishMarker(ctx context.Context, m ordermsg.Marker) error
}

// Config holds the timeouts and TTLs of the service.
type Config struct {
	ReservationTTL  time.Duration
	RedisTimeout    time.Duration // each Redis call
	PublishTimeout  time.Duration // the wait for a confirm
	QueryTimeout    time.Duration // each MySQL statement or transaction
	SoldOutTTL      time.Duration // trust of a local sold-out flag without news
	NegativeTTL     time.Duration // trust of "no such activity in MySQL"
	StateTTL        time.Duration // sale state answered from the local cache
	OrderWaitMax    time.Duration // longest order long-poll
	MaxOrderWaiters int           // order long-polls waiting at once
	// StockShards is the stock shard count of an activity created without
	// one ([backend] stock_shards).
	StockShards int
	// RecoveryMax bounds the recovery of a sale rebuilt after a Redis loss
	// (reservation_ttl + [worker] queued_expire_after: past it the sweeper
	// takes any order queued before the loss as gone). The drain marker
	// ends it as soon as the queue has delivered what was queued before;
	// this bound only matters if no marker ever gets through.
	RecoveryMax time.Duration
	// GroupMax and GroupLinger shape the group commit (group.go, package
	// coalesce): the most purchases of one shard reserved in one call, and
	// the longest a purchase waits for a running group of its shard. 0 or 1:
	// every purchase alone.
	GroupMax    int
	GroupLinger time.Duration
	// GroupBatch publishes a group's new orders as one message
	// (ordermsg.Batch) instead of one message each.
	GroupBatch bool
}

// Service runs purchases and admin changes.
type Service struct {
	store *reservation.Store
	db    *sql.DB
	pub   Publisher
	cfg   Config
	log   *slog.Logger
	m     *Metrics

	soldOut  *soldout.Flags
	missing  *soldout.Flags
	state    *stateCache
	waiters  *orderwait.Hub
	rebuilds singleflight.Group // one rebuild per activity id (decimal) at a time
	now      func() time.Time
	// afterWarm, when set (tests), runs once an admin change's warm has
	// built the sale anew, before anything else happens.
	afterWarm func(id int64)
	// beforeGroupPublish, when set (tests), runs after a group's reserve,
	// before the publish of its message.
	beforeGroupPublish func(orders []ordermsg.Order)
	// afterGroupReserve, when set (tests), runs once a group's reserve call
	// of n purchases returned, before its results are handed out.
	afterGroupReserve func(n int)
	groups            *coalesce.Coalescer[reservation.Keys, *groupCall]

	markersMu sync.Mutex
	markers   map[int64]markerSent // the last drain marker sent per recovering activity

	bg        sync.WaitGroup // background undos
	undoSlots chan struct{}  // bounds the undos in the background
	// bgCtx ends at Close: the background retries give up then.
	bgCtx  context.Context
	stopBg context.CancelFunc
}

// New returns a service. m may be nil.
func New(store *reservation.Store, db *sql.DB, pub Publisher, cfg Config, log *slog.Logger, m *Metrics) *Service {
	if cfg.NegativeTTL <= 0 {
		cfg.NegativeTTL = time.Second
	}
	s := &Service{
		store: store, db: db, pub: pub, cfg: cfg, log: log, m: m,
		soldOut:   soldout.NewFlags(cfg.SoldOutTTL),
		missing:   soldout.NewFlags(cfg.NegativeTTL),
		state:     newStateCache(cfg.StateTTL),
		waiters:   orderwait.NewHub(cfg.MaxOrderWaiters),
		now:       time.Now,
		undoSlots: make(chan struct{}, maxUndos),
		markers:   map[int64]markerSent{},
	}
	s.bgCtx, s.stopBg = context.WithCancel(context.Background())
	s.groups = coalesce.New(cfg.GroupMax, cfg.GroupLinger, s.runGroup)
	s.groups.OnPanic(s.groupPanicked)
	return s
}

// Outcome is how a purchase was decided (not an error): the purchase
// path's one vocabulary, reserve.lua's (reservation.Outcome). A refusal the
// script decided reaches the API as the script named it, and package api
// translates each outcome to HTTP in one table.
type Outcome = reservation.Outcome

// The outcomes Purchase returns (the script's other replies, such as a
// replay or an unknown activity, are acted on here, never returned).
const (
	Accepted      = reservation.Reserved // 202: a new order, or a replay of the key's
	SoldOut       = reservation.SoldOut
	Insufficient  = reservation.Insufficient
	LimitExceeded = reservation.LimitExceeded
	NotStarted    = reservation.NotStarted
	Ended         = reservation.Ended
	BadQuantity   = reservation.BadQuantity
)

// Outcomes lists every Outcome Purchase returns.
var Outcomes = []Outcome{Accepted, SoldOut, Insufficient, LimitExceeded, NotStarted, Ended, BadQuantity}

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
	epoch := s.soldOut.Token()
	res, msg, err := s.reserve(ctx, r)
	if err != nil {
		return PurchaseResult{}, err
	}
	if res.Outcome == reservation.NotFound {
		missEpoch := s.missing.Token()
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
		if res, msg, err = s.reserve(ctx, r); err != nil {
			return PurchaseResult{}, err
		}
		if res.Outcome == reservation.NotFound {
			return PurchaseResult{}, fmt.Errorf("%w: activity %d still missing in Redis after a rebuild", ErrUnavailable, r.ActivityID)
		}
	}
	switch res.Outcome {
	case reservation.Reserved:
		return s.publish(ctx, r, s.orderOf(r, res.OrderID, r.Quantity, res.Deadline), msg, false)
	case reservation.Unsure:
		// The sale recovers from a Redis loss: make sure its drain marker
		// is on its way, then answer from MySQL what Redis cannot.
		s.sendMarker(r.ActivityID, res.Recovery)
		if r.IdempotencyKey == "" {
			s.m.purchased("recovering")
			return PurchaseResult{}, fmt.Errorf("%w: activity %d recovers from a Redis loss: orders queued before it are not counted yet", ErrUnavailable, r.ActivityID)
		}
		return s.keyOrder(ctx, r)
	case reservation.Replay:
		if res.State == reservation.Pending && !res.Queued {
			// The broker never confirmed this order's message: its first
			// request died or is still publishing. Publish it now, so the
			// 202 this replay gives is backed by a queued message (a second
			// copy is harmless: workers write an order id once).
			return s.adopt(ctx, r, s.orderOf(r, res.OrderID, res.Quantity, res.Deadline))
		}
		return PurchaseResult{Outcome: Accepted, OrderID: res.OrderID, Status: res.State.Public(), Replay: true}, nil
	case reservation.SoldOut:
		fresh := !s.soldOut.Has(r.ActivityID, now)
		if s.soldOut.Set(r.ActivityID, epoch, s.now()) {
			s.state.soldOut(r.ActivityID)
			if fresh {
				s.announceSoldOut(r.ActivityID)
			}
		}
		return PurchaseResult{Outcome: SoldOut}, nil
	case reservation.Insufficient, reservation.LimitExceeded, reservation.NotStarted, reservation.BadQuantity:
		// Decided by the script: answered as it named it.
		return PurchaseResult{Outcome: res.Outcome, Limit: res.Limit, Held: res.Held, Available: res.Available}, nil
	case reservation.Ended:
		if r.IdempotencyKey != "" {
			// An archived sale keeps no keys in Redis: MySQL knows them.
			return s.archived(ctx, r)
		}
		return PurchaseResult{Outcome: Ended}, nil
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

// reserve runs reserve.lua with its own timeout, in the group of its shard
// (group.go): msg is the group's message when it carries the order. The
// order id is chosen before the call, so the script is idempotent on it. Any error may hide a
// reserve that ran (a lost reply, a reply slower than the timeout, a request
// still on its way to Redis): the order id is then undone in the background
// (a tombstone the late reserve refuses) and the caller answers 503. An
// order id collision (128 random bits: practically never) is retried once.
func (s *Service) reserve(ctx context.Context, r PurchaseRequest) (reservation.Result, *groupMessage, error) {
	for attempt := 0; ; attempt++ {
		start := time.Now()
		// The user's home shard, and an order id that names it; purchases
		// of one home shard share a group.
		hctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
		home, err := s.store.Home(hctx, r.ActivityID, r.UserID)
		cancel()
		if err != nil {
			s.m.reserved("error", time.Since(start))
			return reservation.Result{}, nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		req := reservation.Request{
			ActivityID: r.ActivityID, UserID: r.UserID, IdempotencyKey: r.IdempotencyKey,
			Quantity: r.Quantity, OrderID: ordermsg.NewShardOrderID(r.ActivityID, home.Shard, home.Shards), TTL: s.cfg.ReservationTTL,
			Keys: home,
		}
		res, msg, err := s.reserveIn(r, req)
		retried := false
		var pe *coalesce.PanicError
		if err != nil && !timedOut(err) && !errors.As(err, &pe) && !errors.Is(err, reservation.ErrShards) && ctx.Err() == nil {
			// A broken connection (EOF, reset, a failed dial), not a slow
			// Redis: the same call once more on a fresh connection. Safe,
			// since reserve.lua is idempotent on the order id; it is what
			// go-redis's own retries did, without re-running it blindly.
			retried = true
			res, msg, err = s.reserveIn(r, req)
		}
		if errors.Is(err, reservation.ErrShards) && attempt == 0 {
			if retried {
				// The first call's reply was lost: it may have reserved
				// under this order id before the shard count changed.
				s.undoLater(r, req.OrderID, reasonReserveFailed, start.Add(s.cfg.ReservationTTL))
			}
			continue // nothing reserved under the new count: choose the home shard anew
		}
		if err != nil {
			s.m.reserved("error", time.Since(start))
			s.undoLater(r, req.OrderID, reasonReserveFailed, start.Add(s.cfg.ReservationTTL))
			return reservation.Result{}, nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		s.m.reserved(string(res.Outcome), time.Since(start))
		if res.Outcome == reservation.Undone {
			// Only this request's own undo writes a tombstone under its id,
			// and it runs after an error, which returned above.
			return reservation.Result{}, nil, fmt.Errorf("%w: order %s undone before its reserve", ErrUnavailable, req.OrderID)
		}
		if res.Outcome != reservation.IDConflict || attempt > 0 {
			if res.Outcome == reservation.IDConflict {
				return reservation.Result{}, nil, fmt.Errorf("%w: order id collision twice", ErrUnavailable)
			}
			return res, msg, nil
		}
	}
}

// maxUndos bounds the undos retrying in the background at once.
const maxUndos = 4096

// Reasons a backend records when it undoes an order.
const (
	reasonReserveFailed = "reserve_failed"
	reasonPublishFailed = "publish_failed"
)

// undoLater undoes orderID in the background, retrying until Redis gives a
// definite answer or the reservation's deadline has passed (the sweeper then
// expires it: it never re-publishes a reservation whose message the broker
// did not confirm, so the 503 keeps nothing either way).
func (s *Service) undoLater(r PurchaseRequest, orderID, reason string, deadline time.Time) {
	s.later(s.redisRetry("backend_undo", deadline), s.m.undone, func(ctx context.Context) error {
		out, err := s.store.Undo(ctx, r.ActivityID, orderID, reason, r.UserID, r.IdempotencyKey)
		if err != nil {
			return err
		}
		s.m.undone(string(out))
		if out != reservation.Released {
			// A keyed retry adopted the reservation and published it:
			// the key's answer is that order, not this 503.
			s.log.Info("undo found the order taken over", "order_id", orderID, "state", out)
		}
		return nil
	}, func(err error) {
		s.log.Warn("undo of a failed reserve gave up at its deadline; the sweeper expires it",
			"order_id", orderID, "err", err)
	})
}

// markLater retries marking a confirmed order queued in the background
// until Redis answers or the deadline passes (after it, the sweeper would
// find the order unmarked; the worker outage that lets it get there is
// long).
func (s *Service) markLater(activityID int64, orderID string, deadline time.Time) {
	s.later(s.redisRetry("backend_queued_mark", deadline), func(r string) { s.m.purchased("queued_mark_" + r) }, func(ctx context.Context) error {
		_, err := s.store.MarkQueued(ctx, activityID, orderID)
		return err
	}, func(err error) {
		s.log.Warn("queued mark gave up at the order's deadline", "order_id", orderID, "err", err)
	})
}

// redisRetry is the policy of a background Redis call: each try within
// RedisTimeout, the first retry after a quarter of it, the waits doubling to
// a second, none ending past until (after it the sweeper acts, or a later
// purchase tries again); Close cuts the waits, not a try under way.
func (s *Service) redisRetry(site string, until time.Time) backoff.Policy {
	return backoff.Policy{Site: site, Min: s.cfg.RedisTimeout / 4, Max: time.Second,
		TryTimeout: s.cfg.RedisTimeout, TryOutlivesCtx: true, Until: until, Metrics: s.m.retries()}
}

// later runs once in the background until it returns nil, retried as p
// says, giving up where p gives up or at Close; at most maxUndos run at once
// (beyond, the sweeper is left to act). count gets "skipped" and "gave_up";
// gaveUp gets the last error when p gave up (not at Close).
func (s *Service) later(p backoff.Policy, count func(string), once func(context.Context) error, gaveUp func(error)) {
	select {
	case s.undoSlots <- struct{}{}:
	default:
		// Redis is down for many requests at once: leave the rest to the
		// sweeper rather than pile up retries for its return.
		count("skipped")
		return
	}
	s.bg.Add(1)
	go func() {
		defer func() { <-s.undoSlots; s.bg.Done() }()
		err := backoff.Retry(s.bgCtx, p, once)
		if err == nil {
			return
		}
		count("gave_up")
		if s.bgCtx.Err() == nil {
			gaveUp(err)
		}
	}()
}

// announceSoldOut tells every subscriber of the stock events that the sale
// has no unit left (a v2 event, internal/soldout), once per fresh flag of
// this backend: the proxies read the keys that hold an order then, so they
// can answer keyed purchases. A shortcut only (a proxy also learns from the
// sold-out answers it forwards): one try, in the background, no retry.
func (s *Service) announceSoldOut(id int64) {
	// Until now: one try, no retry.
	s.later(s.redisRetry("backend_sold_out_event", time.Now()), func(r string) { s.m.purchased("sold_out_event_" + r) }, func(ctx context.Context) error {
		return s.store.AnnounceSoldOut(ctx, id)
	}, func(error) {})
}

// Close stops the background undos (each gives up; the sweeper expires what
// they leave) and waits for them.
func (s *Service) Close() {
	s.stopBg()
	s.bg.Wait()
}

// orderOf is the message of a reservation.
func (s *Service) orderOf(r PurchaseRequest, orderID string, qty int64, deadline time.Time) ordermsg.Order {
	o := ordermsg.Order{
		V: ordermsg.Version, OrderID: orderID, ActivityID: r.ActivityID, UserID: r.UserID,
		Quantity: qty, IdempotencyKey: r.IdempotencyKey, Deadline: deadline.UnixMilli(),
	}
	if !deadline.IsZero() {
		o.ReservedAt = deadline.Add(-s.cfg.ReservationTTL).UnixMilli()
	}
	return o
}

// publish hands a reservation to the broker. Confirmed: the record is marked
// queued (the sweeper then never expires it) and the answer is 202. A failure
// after which the message may still reach the queue (a confirm timeout, a
// connection lost after the write: broker.MayHaveArrived) is refused in MySQL
// first — a failed row no worker can confirm over, which survives a Redis
// loss — and answered 503 only if that insert won; Redis is then given back
// best effort. A failure that put nothing in the queue (a nack, not
// connected) is undone in Redis (release.lua decides against the worker's
// claim.lua) and answered 503, also when Redis does not answer: nobody
// publishes the order, the background undo or the sweeper releases it.
//
// msg is the group's message carrying o (nil: o is published alone).
//
// replay (see adopt): the order was reserved by an earlier attempt of the
// same key whose outcome this call does not know; it is never undone in
// Redis with the key (the key may have been answered with this order): any
// failure is decided in MySQL.
func (s *Service) publish(ctx context.Context, r PurchaseRequest, o ordermsg.Order, msg *groupMessage, replay bool) (PurchaseResult, error) {
	var perr error
	if msg != nil {
		perr = msg.send(ctx, s)
	} else {
		pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
		perr = s.pub.Publish(pctx, o)
		cancel()
	}
	accepted := func(status string) (PurchaseResult, error) {
		return PurchaseResult{Outcome: Accepted, OrderID: o.OrderID, Status: status, Replay: replay}, nil
	}
	if perr == nil {
		if replay {
			s.m.purchased("adopted")
		} else {
			s.m.purchased("accepted")
		}
		if msg != nil {
			marked, err := msg.mark(o.OrderID)
			return accepted(s.afterMark(ctx, r, o, marked, err))
		}
		return accepted(s.markQueued(ctx, r, o))
	}
	if replay && errors.Is(perr, broker.ErrDuplicate) {
		// The first request of the key, in this process, still waits for
		// its confirm: it decides the order.
		s.m.purchased("adopted_in_flight")
		return accepted("pending")
	}
	if replay || broker.MayHaveArrived(perr) {
		return s.refuse(ctx, r, o, perr, replay)
	}
	out, rerr := s.release(ctx, r, o.OrderID, reasonPublishFailed, releaseTries)
	if rerr != nil {
		// Nothing is queued for this order id: answering 503 keeps nothing.
		s.undoLater(r, o.OrderID, reasonPublishFailed, time.UnixMilli(o.Deadline))
		s.m.purchased("released_later")
		return PurchaseResult{}, fmt.Errorf("%w: %v (nothing queued; released in the background)", ErrUnavailable, perr)
	}
	switch out {
	case reservation.Released:
		s.m.purchased("released")
		return PurchaseResult{}, fmt.Errorf("%w: %v (reservation released)", ErrUnavailable, perr)
	case reservation.Taken, reservation.AlreadyClaimed, reservation.AlreadyQueued:
		// A keyed replay publishes it (or a copy is queued already).
		s.m.purchased("accepted_claimed")
		return accepted("pending")
	case reservation.AlreadyConfirmed:
		s.m.purchased("accepted_claimed")
		return accepted("confirmed")
	}
	s.m.purchased("accepted_claimed")
	return accepted("failed")
}

// adopt publishes an order reserved by an earlier request of the same key
// whose message the broker never confirmed (reserve.lua marked it adopted,
// so that request's undo no longer releases it). It never undoes the order
// in Redis with the key: a failed publish is decided in MySQL (a failed row
// inserted first: 503, the key keeps naming the order; a row there: 202
// with its status).
func (s *Service) adopt(ctx context.Context, r PurchaseRequest, o ordermsg.Order) (PurchaseResult, error) {
	return s.publish(ctx, r, o, nil, true)
}

// markQueued notes that the broker confirmed o, and returns the status the
// 202 reports. A record that could not be marked because it is settled
// already is answered as it is; a mark that failed is retried in the
// background (an unmarked queued order would be expired by the sweeper
// after a long worker outage).
func (s *Service) markQueued(ctx context.Context, r PurchaseRequest, o ordermsg.Order) string {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RedisTimeout)
	defer cancel()
	marked, err := s.store.MarkQueued(rctx, r.ActivityID, o.OrderID)
	return s.afterMark(ctx, r, o, marked, err)
}

// afterMark is markQueued once the mark was tried (for a group's message,
// all its orders in one round trip: groupMessage.mark).
func (s *Service) afterMark(ctx context.Context, r PurchaseRequest, o ordermsg.Order, marked bool, err error) string {
	if err != nil {
		s.m.purchased("queued_mark_failed")
		s.markLater(r.ActivityID, o.OrderID, time.UnixMilli(o.Deadline))
		return "pending"
	}
	if marked {
		return "pending"
	}
	// Settled meanwhile (a worker was quick, or a replay's failed publish
	// refused it) or lost with Redis (the queued message writes it).
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RedisTimeout)
	defer cancel()
	rec, found, err := s.store.Order(rctx, r.ActivityID, o.OrderID)
	if err != nil {
		return "pending"
	}
	if !found {
		// Redis lost the sale while this publish was in flight: its message
		// may be queued after the drain marker of the rebuild (the marker
		// waits PublishTimeout, but this backend may have stalled between
		// its reserve and its publish), so the recovery may end before a
		// worker writes it. Its record goes back now, counted, with its key:
		// Redis does not sell its unit again, and a retry replays it rather
		// than buy again.
		d := reservation.Decided{OrderID: o.OrderID, UserID: r.UserID, IdempotencyKey: r.IdempotencyKey, Quantity: o.Quantity}
		if _, err := s.store.Requeue(rctx, r.ActivityID, d, time.UnixMilli(o.Deadline)); err != nil {
			s.log.Warn("record of an order confirmed after a Redis loss not written back", "order_id", o.OrderID, "err", err)
		}
		return "pending"
	}
	return rec.State.Public()
}

// refuse settles a publish that may still arrive: MySQL's failed row first
// (503 only if this call inserted it), then Redis best effort. Without
// MySQL the outcome stays open: the reservation is kept and the answer is
// 202 — the message, if queued, is written by a worker; if not, the sweeper
// expires the order (INSERT IGNORE): confirmed or failed either way.
func (s *Service) refuse(ctx context.Context, r PurchaseRequest, o ordermsg.Order, perr error, replay bool) (PurchaseResult, error) {
	accepted := func(status string) (PurchaseResult, error) {
		return PurchaseResult{Outcome: Accepted, OrderID: o.OrderID, Status: status, Replay: replay}, nil
	}
	status, err := s.failInMySQL(ctx, o, reasonPublishFailed)
	switch {
	case err != nil:
		s.m.purchased("accepted_unsettled")
		s.log.Warn("publish outcome unknown and MySQL unreachable; the order is kept for a worker or the sweeper",
			"order_id", o.OrderID, "publish_err", perr, "mysql_err", err)
		return accepted("pending")
	case status != "":
		s.m.purchased("accepted_claimed")
		return accepted(status)
	}
	s.m.purchased("failed_in_mysql")
	if replay {
		// Not Undo: the key stays with this order, which is failed now.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RedisTimeout)
		if _, err := s.store.Release(rctx, r.ActivityID, o.OrderID, reasonPublishFailed); err != nil {
			s.log.Debug("release of a refused replay failed; the sweeper settles it from MySQL", "order_id", o.OrderID, "err", err)
		}
		cancel()
	} else if _, err := s.release(ctx, r, o.OrderID, reasonPublishFailed, releaseTries); err != nil {
		s.undoLater(r, o.OrderID, reasonPublishFailed, time.UnixMilli(o.Deadline))
	}
	return PurchaseResult{}, fmt.Errorf("%w: %v (order recorded failed in MySQL)", ErrUnavailable, perr)
}

// failInMySQL records an order failed with reason unless MySQL holds it
// already. status is "" when this call inserted the row (no worker can
// confirm the order any more), else the stored status.
func (s *Service) failInMySQL(ctx context.Context, o ordermsg.Order, reason string) (string, error) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
	defer cancel()
	// No idempotency key: the client is told nothing was kept and may reuse it.
	res, err := s.db.ExecContext(qctx, `INSERT IGNORE INTO orders (order_id, activity_id, user_id, quantity, status, reason)
		VALUES (?, ?, ?, ?, 'failed', ?)`, o.OrderID, o.ActivityID, o.UserID, o.Quantity, reason)
	if err != nil {
		return "", fmt.Errorf("record order %s failed: %w", o.OrderID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return "", fmt.Errorf("record order %s failed: %w", o.OrderID, err)
	} else if n == 1 {
		return "", nil
	}
	var status string
	if err := s.db.QueryRowContext(qctx, `SELECT status FROM orders WHERE order_id = ?`, o.OrderID).Scan(&status); err != nil {
		return "", fmt.Errorf("read order %s: %w", o.OrderID, err)
	}
	return status, nil
}

// releaseTries bounds the attempts of a compensation whose reply was lost:
// release.lua answers "released" again for a release already made, so a
// retry is safe and turns an unknown outcome into a known one.
const releaseTries = 3

// release undoes an unpublished reservation (Undo: key forgotten, tombstone
// if the record is missing), retrying when the reply is lost. It runs even
// when ctx was cancelled (shutdown).
func (s *Service) release(ctx context.Context, r PurchaseRequest, orderID, reason string, tries int) (reservation.ReleaseOutcome, error) {
	var err error
	for range tries {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RedisTimeout)
		var out reservation.ReleaseOutcome
		out, err = s.store.Undo(rctx, r.ActivityID, orderID, reason, r.UserID, r.IdempotencyKey)
		cancel()
		if err == nil {
			return out, nil
		}
	}
	return "", err
}

// timedOut reports an error of a call that ran out of time (Redis slow, or
// the request or its reply still on the wire).
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
