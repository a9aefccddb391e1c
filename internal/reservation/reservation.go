// Package reservation is the Redis side of a sale: the key layout and typed
// wrappers of the purchase-path scripts in package lua. Redis accelerates and
// MySQL decides: every wrapper here only moves Redis in ways that can lag MySQL,
// never lead it.
package reservation

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/soldout"
	"github.com/seckill/seckill/lua"
)

// State of an order's reservation record in Redis.
type State byte

// Reservation states (see lua/reserve.lua).
const (
	Pending   State = 'P' // reserved, not yet taken by a worker
	Claimed   State = 'C' // a worker is writing it to MySQL
	Confirmed State = 'K'
	Failed    State = 'F'
	Unknown   State = '?' // no record: Redis lost it
)

// Public reports the contract's status word for a state.
func (s State) Public() string {
	switch s {
	case Confirmed:
		return "confirmed"
	case Failed:
		return "failed"
	default:
		return "pending"
	}
}

func (s State) String() string { return string(s) }

// Keys names the Redis keys of one activity. All share the {act:ID} hash tag.
// The records and the user entries are in buckets (Order, User), small hashes
// whose count the sale's meta holds ("buckets", see lua/record.lua).
type Keys struct {
	Meta, Deadlines string
	// Recovering exists while a sale rebuilt after a Redis loss may have
	// orders in flight whose keys Redis forgot.
	Recovering string
	// Base is what every key of the sale starts with ("<prefix>{act:ID}:").
	Base string
	// Shard is the stock shard these keys name (0: {act:ID}, k: {act:ID:k};
	// see shards.go), Shards the sale's shard count they were chosen for (0
	// when not known: any).
	Shard, Shards int
}

// KeysFor returns the keys of activity id under prefix.
func KeysFor(prefix string, id int64) Keys {
	base := prefix + "{act:" + strconv.FormatInt(id, 10) + "}:"
	return Keys{
		Meta:       base + "meta",
		Deadlines:  base + "deadlines",
		Recovering: base + "recovering",
		Base:       base,
	}
}

// Bucket kinds: records (order id -> record) and user entries (user id ->
// units held and idempotency keys).
const (
	OrderBuckets = 'o'
	UserBuckets  = 'u'
)

// Bucket is the bucket of id in a sale of n buckets: the first 32 bits of
// SHA-1 of id (big-endian) mod n, as lua/record.lua computes it.
func Bucket(n int64, id string) int64 {
	sum := sha1.Sum([]byte(id))
	return int64(binary.BigEndian.Uint32(sum[:4])) % n
}

// Hash names the hash of kind (OrderBuckets, UserBuckets) that holds id in a
// sale of n buckets; n = 0 is a sale without buckets (warmed by a version
// before them, or not in Redis), whose hashes are "orders" and "users".
func (k Keys) Hash(kind byte, n int64, id string) string {
	if n <= 0 {
		return k.unbucketed(kind)
	}
	return k.Base + string(kind) + ":" + strconv.FormatInt(Bucket(n, id), 10)
}

// ReserveKeys are the KEYS of reserve.lua for user and order oid in a sale
// of n buckets.
func (k Keys) ReserveKeys(n int64, user, oid string) []string {
	return []string{k.Meta, k.Deadlines, k.Recovering, k.Order(n, oid), k.User(n, user)}
}

// Order and User name the hashes of order oid's record and user uid's entry.
func (k Keys) Order(n int64, oid string) string { return k.Hash(OrderBuckets, n, oid) }
func (k Keys) User(n int64, uid string) string  { return k.Hash(UserBuckets, n, uid) }

// Hashes lists every hash of kind a sale of n buckets may hold: the
// unbucketed one first, then each bucket (as sale_hashes in lua/record.lua).
func (k Keys) Hashes(kind byte, n int64) []string {
	out := make([]string, 0, n+1)
	out = append(out, k.unbucketed(kind))
	for b := int64(0); b < n; b++ {
		out = append(out, k.Base+string(kind)+":"+strconv.FormatInt(b, 10))
	}
	return out
}

func (k Keys) unbucketed(kind byte) string {
	if kind == OrderBuckets {
		return k.Base + "orders"
	}
	return k.Base + "users"
}

// Channel is the pub/sub channel on which an activity id is published whenever
// units become sellable again (a failed order, more stock, a rebuilt sale).
// It also carries news of an admin change (Store.Announce): every cache of an
// activity's state or sold-out flag forgets the activity on it.
func Channel(prefix string) string { return prefix + "seckill:stock-events" }

// OrderChannel is the pub/sub channel on which settle.lua announces the orders
// it settled, one "order_id|K|" or "order_id|F|reason" line each.
func OrderChannel(prefix string) string { return prefix + "seckill:order-events" }

// Announce publishes news about an activity (an admin change) on Channel.
func (s *Store) Announce(ctx context.Context, activityID int64) error {
	if err := s.rdb.Publish(ctx, Channel(s.prefix), activityID).Err(); err != nil {
		return fmt.Errorf("announce activity %d: %w", activityID, err)
	}
	return nil
}

// AnnounceSoldOut publishes on Channel that an activity has no unit left
// (the v2 event of internal/soldout; subscribers before v2 ignore it).
func (s *Store) AnnounceSoldOut(ctx context.Context, activityID int64) error {
	if err := s.rdb.Publish(ctx, Channel(s.prefix), soldout.SoldOutEvent(activityID)).Err(); err != nil {
		return fmt.Errorf("announce activity %d sold out: %w", activityID, err)
	}
	return nil
}

// ActiveSet is the set of activity ids that have been warmed into Redis; the
// sweeper and reconciler walk it. It has no hash tag: it is read, never used in
// a script with sale keys.
func ActiveSet(prefix string) string { return prefix + "seckill:activities" }

// Client is what the store needs of go-redis.
type Client interface {
	redis.Scripter
	HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd
	HGet(ctx context.Context, key, field string) *redis.StringCmd
	HGetAll(ctx context.Context, key string) *redis.MapStringStringCmd
	SAdd(ctx context.Context, key string, members ...any) *redis.IntCmd
	SRem(ctx context.Context, key string, members ...any) *redis.IntCmd
	SMembers(ctx context.Context, key string) *redis.StringSliceCmd
	ZRangeByScore(ctx context.Context, key string, opt *redis.ZRangeBy) *redis.StringSliceCmd
	ZRangeByScoreWithScores(ctx context.Context, key string, opt *redis.ZRangeBy) *redis.ZSliceCmd
	ZCard(ctx context.Context, key string) *redis.IntCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
	Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd
	Get(ctx context.Context, key string) *redis.StringCmd
	ZRem(ctx context.Context, key string, members ...any) *redis.IntCmd
	ZAddXX(ctx context.Context, key string, members ...redis.Z) *redis.IntCmd
	Publish(ctx context.Context, channel string, message any) *redis.IntCmd
	Pipeline() redis.Pipeliner
}

// Store runs the purchase-path scripts against one Redis under one key prefix.
type Store struct {
	rdb    Client
	prefix string
	// buckets caches each shard's bucket count (meta key -> int64) for
	// Reserve, which names its buckets in KEYS; reserve.lua refuses a stale
	// count, and the count changes only when a sale is built anew.
	buckets sync.Map
	// shards caches each sale's stock shard count (activity id -> int),
	// which reserve.lua checks too.
	shards sync.Map
	// moveHook, when set (tests), runs between the steps of a move between
	// shards ("out": the donor gave units up; "in": the recipient added
	// them); an error abandons the move there, as a process dying would.
	moveHook func(stage string) error
}

// New returns a store; prefix isolates stacks that share a Redis.
func New(rdb Client, prefix string) *Store { return &Store{rdb: rdb, prefix: prefix} }

// Prefix is the key prefix of the store.
func (s *Store) Prefix() string { return s.prefix }

// Keys returns the keys of activity id.
func (s *Store) Keys(id int64) Keys { return KeysFor(s.prefix, id) }

// Buckets reads the bucket count of a sale from its meta; 0 when it has
// none (a sale without buckets, or not in Redis: see Keys.Hash).
func (s *Store) Buckets(ctx context.Context, activityID int64) (int64, error) {
	return s.bucketsOf(ctx, activityID, s.Keys(activityID))
}

// bucketsOf reads the bucket count of one shard (each has its own, chosen
// from its allotment).
func (s *Store) bucketsOf(ctx context.Context, activityID int64, k Keys) (int64, error) {
	v, err := s.rdb.HGet(ctx, k.Meta, "buckets").Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the buckets of activity %d: %w", activityID, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("activity %d: %w: buckets %q", activityID, ErrScript, v)
	}
	return n, nil
}

// OrderHash and UserHash name the hash holding order oid's record and user
// uid's entry in the sale as it is now.
func (s *Store) OrderHash(ctx context.Context, activityID int64, oid string) (string, error) {
	k := s.orderKeys(activityID, oid)
	n, err := s.bucketsOf(ctx, activityID, k)
	return k.Order(n, oid), err
}

func (s *Store) UserHash(ctx context.Context, activityID int64, uid string) (string, error) {
	k, err := s.home(ctx, activityID, uid)
	if err != nil {
		return "", err
	}
	n, err := s.bucketsOf(ctx, activityID, k)
	return k.User(n, uid), err
}

// home is the user's home shard as Redis holds the sale now.
func (s *Store) home(ctx context.Context, activityID int64, uid string) (Keys, error) {
	n, err := s.Shards(ctx, activityID)
	if err != nil {
		return Keys{}, err
	}
	return s.ShardKeys(activityID, HomeShard(uid, n), n), nil
}

// SaleKeys lists every key activity id may hold in Redis now (its meta,
// deadlines, recovering mark, and every hash of its records and users).
func (s *Store) SaleKeys(ctx context.Context, activityID int64) ([]string, error) {
	shards, err := s.allShards(ctx, activityID)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range shards {
		n, err := s.bucketsOf(ctx, activityID, k)
		if err != nil {
			return nil, err
		}
		out = append(out, k.Meta, k.Deadlines, k.Recovering)
		out = append(out, k.Hashes(OrderBuckets, n)...)
		out = append(out, k.Hashes(UserBuckets, n)...)
	}
	return out, nil
}

// Outcome of a reservation attempt.
type Outcome string

// Reservation outcomes (see lua/reserve.lua).
const (
	Reserved      Outcome = "ok"
	Replay        Outcome = "replay"
	NotFound      Outcome = "not_found"
	BadQuantity   Outcome = "bad_quantity"
	NotStarted    Outcome = "not_started"
	Ended         Outcome = "ended"
	LimitExceeded Outcome = "limit_exceeded"
	SoldOut       Outcome = "sold_out"
	Insufficient  Outcome = "insufficient"
	IDConflict    Outcome = "conflict"
	// Unsure: the sale recovers from a Redis loss (Result.Recovery names the
	// recovery); nothing was reserved. A key Redis does not know may belong
	// to an order still in the queue (ask MySQL), and the units of those
	// orders are not in pending yet, so no new reservation is made.
	Unsure Outcome = "unsure"
	// Undone: the caller's undo (release with a tombstone) ran before this
	// reserve of the same order id; nothing was reserved.
	Undone Outcome = "undone"
)

// Request is one purchase attempt.
type Request struct {
	ActivityID     int64
	UserID         string
	IdempotencyKey string // "" for none
	Quantity       int64
	// OrderID is chosen before the call: a repeat of the call with the same
	// id answers Reserved again without reserving twice.
	OrderID string
	TTL     time.Duration
	// Keys are the user's home shard (Store.Home), for which OrderID was
	// named; zero: the shard OrderID names, in the sale as this store last
	// read it.
	Keys Keys
}

// Result of Reserve. Fields beyond Outcome are set where the outcome has them.
type Result struct {
	Outcome   Outcome
	OrderID   string    // Reserved, Replay
	State     State     // Replay: the order's state now
	Quantity  int64     // Replay: the original quantity
	Deadline  time.Time // Reserved, Replay (zero when unknown)
	Queued    bool      // Replay: the broker confirmed the order's message
	Limit     int64     // BadQuantity, LimitExceeded
	Held      int64     // LimitExceeded
	Available int64     // Insufficient
	Recovery  string    // Unsure: the recovery token (see MarkRecovering)
}

// ErrScript reports a script answer that does not fit its documented shape.
var ErrScript = errors.New("unexpected script reply")

// Reserve checks and reserves in one round trip on the user's home shard.
// When that shard has too few units and the sale has others, units move
// into it (Rebalance) and it is asked again: SoldOut (or Insufficient) is
// answered only once no other shard had a unit to give. ErrShards: the sale
// has another shard count than r.Keys was chosen for; nothing was reserved.
func (s *Store) Reserve(ctx context.Context, r Request) (Result, error) {
	k, err := s.requestKeys(ctx, r)
	if err != nil {
		return Result{}, fmt.Errorf("reserve activity %d: %w", r.ActivityID, err)
	}
	for moves := 0; ; moves++ {
		res, err := s.reserveOn(ctx, r, k)
		if err != nil || k.Shards <= 1 {
			return res, err
		}
		need := r.Quantity
		switch res.Outcome {
		case SoldOut:
		case Insufficient:
			need -= res.Available
		default:
			return res, nil
		}
		if moves >= 4*k.Shards+4 {
			// Units kept moving under this request: not known to be sold
			// out, and nothing reserved.
			return Result{}, fmt.Errorf("reserve activity %d: %w", r.ActivityID, ErrMoving)
		}
		n, mv, err := s.rebalance(ctx, r.ActivityID, k.Shard, k.Shards, need)
		if err != nil {
			return Result{}, fmt.Errorf("reserve activity %d: %w", r.ActivityID, err)
		}
		if n > 0 {
			continue
		}
		// No donor had a unit; units in motion meanwhile (into a shard
		// already asked, or into this one) are not sold out.
		out, err := s.soldOut(ctx, r.ActivityID, k.Shards, mv)
		if err != nil {
			return Result{}, fmt.Errorf("reserve activity %d: %w", r.ActivityID, err)
		}
		if out && res.Outcome == SoldOut {
			return res, nil
		}
		if out || res.Outcome == Insufficient {
			// Insufficient: the units left anywhere are fewer than asked.
			sale, _, err := s.Sale(ctx, r.ActivityID)
			if err != nil {
				return Result{}, fmt.Errorf("reserve activity %d: %w", r.ActivityID, err)
			}
			if out || sale.Available() < r.Quantity {
				res.Available = sale.Available()
				if res.Available == 0 {
					res.Outcome = SoldOut
				}
				return res, nil
			}
		}
	}
}

// requestKeys are the keys of the shard r reserves in: r.Keys (Store.Home),
// or when zero the shard r.OrderID names, for the shard count this store
// last read.
func (s *Store) requestKeys(ctx context.Context, r Request) (Keys, error) {
	if r.Keys.Meta != "" {
		return r.Keys, nil
	}
	k := s.orderKeys(r.ActivityID, r.OrderID)
	n, err := s.cachedShards(ctx, r.ActivityID)
	if err != nil {
		return Keys{}, err
	}
	k.Shards = n
	return k, nil
}

// bucketCount returns the cached bucket count of shard k, reading it on
// first use in this process rather than guess, so that the reserve sent is
// the one that runs (a late copy of a guessed one would only be answered
// "buckets").
func (s *Store) bucketCount(ctx context.Context, activityID int64, k Keys) (int64, error) {
	if c, ok := s.buckets.Load(k.Meta); ok {
		return c.(int64), nil
	}
	n, err := s.bucketsOf(ctx, activityID, k)
	if err != nil {
		return 0, err
	}
	s.buckets.Store(k.Meta, n)
	return n, nil
}

// reserveOn runs reserve.lua once on shard k.
func (s *Store) reserveOn(ctx context.Context, r Request, k Keys) (Result, error) {
	n, err := s.bucketCount(ctx, r.ActivityID, k)
	if err != nil {
		return Result{}, fmt.Errorf("reserve activity %d: %w", r.ActivityID, err)
	}
	var v []any
	for try := 0; ; try++ {
		v, err = lua.Reserve.Run(ctx, s.rdb, k.ReserveKeys(n, r.UserID, r.OrderID),
			r.UserID, r.IdempotencyKey, r.Quantity, r.OrderID, r.TTL.Milliseconds(), n, max(k.Shards, 1)).Slice()
		if err != nil {
			return Result{}, fmt.Errorf("reserve activity %d: %w", r.ActivityID, err)
		}
		if len(v) == 0 {
			return Result{}, fmt.Errorf("reserve activity %d: %w: empty", r.ActivityID, ErrScript)
		}
		if str(v[0]) == "shards" {
			s.shards.Store(r.ActivityID, max(int(num(at(v, 1))), 1))
			return Result{}, fmt.Errorf("reserve activity %d: %w: %d, not %d", r.ActivityID, ErrShards, num(at(v, 1)), k.Shards)
		}
		// The sale has another bucket count than the cache's (first use,
		// or a sale built anew): once more with its count.
		if str(v[0]) != "buckets" || try > 0 {
			break
		}
		n = num(at(v, 1))
		s.buckets.Store(k.Meta, n)
	}
	return reserveResult(r, v)
}

// ReserveMulti is Reserve for a group of requests of one shard (equal Keys,
// as Store.Home gave them, and one TTL) in one round trip
// (lua/reserve_multi.lua): every request is checked on its own, in order,
// each seeing what the ones before it reserved, and gets its own Result, or
// its own error where the script's reply to it does not fit. A request the
// shard of a sharded sale answers SoldOut or Insufficient is sent again alone
// through Reserve, which moves units in from the other shards first: a group
// answers sold out only as Reserve would. err is for the whole call (nothing
// known of any request: each may or may not have been reserved); ErrShards:
// the sale has another shard count than the Keys were chosen for, and
// nothing was reserved.
func (s *Store) ReserveMulti(ctx context.Context, rs []Request) ([]Result, []error, error) {
	if len(rs) == 0 {
		return nil, nil, nil
	}
	id := rs[0].ActivityID
	k, err := s.requestKeys(ctx, rs[0])
	if err != nil {
		return nil, nil, fmt.Errorf("reserve %d requests of activity %d: %w", len(rs), id, err)
	}
	for _, r := range rs[1:] {
		if r.ActivityID != id || r.Keys != rs[0].Keys || r.TTL != rs[0].TTL {
			return nil, nil, fmt.Errorf("reserve %d requests: of more than one shard or TTL (%s, %s)", len(rs), rs[0].Keys.Meta, r.Keys.Meta)
		}
		if r.Keys.Meta == "" && shardOf(r.OrderID) != shardOf(rs[0].OrderID) {
			return nil, nil, fmt.Errorf("reserve %d requests: order ids of more than one shard (%s, %s)", len(rs), rs[0].OrderID, r.OrderID)
		}
	}
	n, err := s.bucketCount(ctx, id, k)
	if err != nil {
		return nil, nil, fmt.Errorf("reserve %d requests of activity %d: %w", len(rs), id, err)
	}
	var v []any
	for try := 0; ; try++ {
		keys := make([]string, 0, 3+2*len(rs))
		keys = append(keys, k.Meta, k.Deadlines, k.Recovering)
		args := make([]any, 0, 3+4*len(rs))
		args = append(args, rs[0].TTL.Milliseconds(), n, max(k.Shards, 1))
		for _, r := range rs {
			keys = append(keys, k.Order(n, r.OrderID), k.User(n, r.UserID))
			args = append(args, r.UserID, r.IdempotencyKey, r.Quantity, r.OrderID)
		}
		v, err = lua.ReserveMulti.Run(ctx, s.rdb, keys, args...).Slice()
		if err != nil {
			return nil, nil, fmt.Errorf("reserve %d requests of activity %d: %w", len(rs), id, err)
		}
		if len(v) != len(rs) {
			return nil, nil, fmt.Errorf("reserve %d requests of activity %d: %w: %d replies", len(rs), id, ErrScript, len(v))
		}
		// A stale shard or bucket count is answered to every request alike
		// (nothing done). Shards: the caller chooses the home shard anew;
		// buckets: once more with the shard's count.
		first, _ := v[0].([]any)
		if str(at(first, 0)) == "shards" {
			s.shards.Store(id, max(int(num(at(first, 1))), 1))
			return nil, nil, fmt.Errorf("reserve %d requests of activity %d: %w: %d, not %d", len(rs), id, ErrShards, num(at(first, 1)), k.Shards)
		}
		if str(at(first, 0)) != "buckets" || try > 0 {
			break
		}
		n = num(at(first, 1))
		s.buckets.Store(k.Meta, n)
	}
	out := make([]Result, len(rs))
	errs := make([]error, len(rs))
	soldOut := false // Reserve found no unit on any shard for one of them
	for i, x := range v {
		rv, _ := x.([]any)
		if len(rv) == 0 {
			errs[i] = fmt.Errorf("reserve activity %d: %w: %v", id, ErrScript, x)
			continue
		}
		out[i], errs[i] = reserveResult(rs[i], rv)
		if errs[i] != nil || k.Shards <= 1 || (out[i].Outcome != SoldOut && out[i].Outcome != Insufficient) {
			continue
		}
		if soldOut {
			// No shard had a unit during this call: sold out for this
			// request too, as Reserve would have answered it.
			out[i] = Result{Outcome: SoldOut}
			continue
		}
		// This shard's answer alone: the units of the others move in first.
		// Safe to send again: nothing was reserved under its order id.
		r := rs[i]
		r.Keys = k
		out[i], errs[i] = s.Reserve(ctx, r)
		soldOut = errs[i] == nil && out[i].Outcome == SoldOut
	}
	return out, errs, nil
}

// reserveResult decodes reserve.lua's reply v to r (reserve_multi.lua's to
// one of its requests).
func reserveResult(r Request, v []any) (Result, error) {
	res := Result{Outcome: Outcome(str(v[0]))}
	switch res.Outcome {
	case Reserved:
		res.OrderID = str(at(v, 1))
		res.Deadline = time.UnixMilli(num(at(v, 2)))
		if num(at(v, 2)) == 0 {
			// A repeat that found its order settled (a settled record keeps
			// no deadline): the bound of what the caller still does for it.
			res.Deadline = time.Now().Add(r.TTL)
		}
	case Replay:
		res.OrderID = str(at(v, 1))
		if st := str(at(v, 2)); st != "" {
			res.State = State(st[0])
		}
		res.Quantity = num(at(v, 3))
		if ms := num(at(v, 4)); ms > 0 {
			res.Deadline = time.UnixMilli(ms)
		}
		res.Queued = num(at(v, 5)) == 1
	case BadQuantity:
		res.Limit = num(at(v, 1))
	case LimitExceeded:
		res.Held, res.Limit = num(at(v, 1)), num(at(v, 2))
	case Insufficient:
		res.Available = num(at(v, 1))
	case Unsure:
		res.Recovery = str(at(v, 1))
	case NotFound, NotStarted, Ended, SoldOut, IDConflict, Undone:
	case "buckets": // twice: the count moved between the two calls
		return Result{}, fmt.Errorf("reserve activity %d: the bucket count moved to %d during the call", r.ActivityID, num(at(v, 1)))
	default:
		return Result{}, fmt.Errorf("reserve activity %d: %w: %v", r.ActivityID, ErrScript, v)
	}
	return res, nil
}

// ReleaseOutcome tells what Release did.
type ReleaseOutcome string

// Release outcomes (see lua/release.lua).
const (
	Released          ReleaseOutcome = "released"
	AlreadyClaimed    ReleaseOutcome = "claimed"
	AlreadyQueued     ReleaseOutcome = "queued" // the broker confirmed a message of it: a worker decides
	AlreadyConfirmed  ReleaseOutcome = "confirmed"
	AlreadyFailed     ReleaseOutcome = "failed"
	ReservationAbsent ReleaseOutcome = "missing"
	// Taken (Undo only): a keyed replay adopted the order, or the broker
	// confirmed a copy of its message; nothing changed.
	Taken ReleaseOutcome = "taken"
)

// Release gives a still-pending reservation back and marks it failed with reason.
func (s *Store) Release(ctx context.Context, activityID int64, orderID, reason string) (ReleaseOutcome, error) {
	k := s.orderKeys(activityID, orderID)
	v, err := lua.Release.Run(ctx, s.rdb, []string{k.Meta, k.Deadlines},
		orderID, reason, Channel(s.prefix), activityID).Slice()
	if err != nil {
		return "", fmt.Errorf("release %s: %w", orderID, err)
	}
	return ReleaseOutcome(str(at(v, 0))), nil
}

// Undo is Release for the backend, whose client is told that nothing was
// kept (after a failed reserve or publish): when the order is released the
// idempotency key (if any) is forgotten too, so a retry with it reserves
// anew; and when no record exists (the reserve has not run, or is still on
// its way) a tombstone is left that the late reserve refuses. So "released"
// means: nothing is, or ever will be, reserved under orderID.
func (s *Store) Undo(ctx context.Context, activityID int64, orderID, reason, userID, idemKey string) (ReleaseOutcome, error) {
	k := s.orderKeys(activityID, orderID)
	v, err := lua.Release.Run(ctx, s.rdb, []string{k.Meta, k.Deadlines},
		orderID, reason, Channel(s.prefix), activityID, idemKey, userID).Slice()
	if err != nil {
		return "", fmt.Errorf("release %s: %w", orderID, err)
	}
	return ReleaseOutcome(str(at(v, 0))), nil
}

// MarkQueued notes on an order's record that the broker confirmed its
// message (lua/queued.lua); it reports whether the record was marked.
func (s *Store) MarkQueued(ctx context.Context, activityID int64, orderID string) (bool, error) {
	marked, errs := s.MarkQueuedMany(ctx, activityID, []string{orderID})
	return marked[0], errs[0]
}

// Requeue writes back, counted, the record of an order whose message the
// broker confirmed after Redis lost the sale (MarkQueued found no record):
// a queued pending record, its units pending and the user's, its key bound
// (lua/requeued.lua), on the stock shard its id names. It reports whether
// it wrote it; nothing changes when Redis knows the order or holds no live
// sale.
func (s *Store) Requeue(ctx context.Context, activityID int64, o Decided, deadline time.Time) (bool, error) {
	k := s.orderKeys(activityID, o.OrderID)
	n, err := lua.Requeued.Run(ctx, s.rdb, []string{k.Meta, k.Deadlines},
		o.OrderID, o.Quantity, o.UserID, deadline.UnixMilli(), o.IdempotencyKey).Int64()
	if err != nil {
		return false, fmt.Errorf("requeue order %s: %w", o.OrderID, err)
	}
	return n == 1, nil
}

// Claim takes orders over for a MySQL write; it returns one state per order id.
func (s *Store) Claim(ctx context.Context, activityID int64, orderIDs []string) ([]State, error) {
	if len(orderIDs) == 0 {
		return nil, nil
	}
	out := make([]State, len(orderIDs))
	for sh, idx := range byShard(orderIDs) {
		args := make([]any, len(idx))
		for j, i := range idx {
			args[j] = orderIDs[i]
		}
		v, err := lua.Claim.Run(ctx, s.rdb, []string{s.keysOf(activityID, sh).Meta}, args...).StringSlice()
		if err != nil {
			return nil, fmt.Errorf("claim %d orders of activity %d: %w", len(idx), activityID, err)
		}
		if len(v) != len(idx) {
			return nil, fmt.Errorf("claim: %w: %d states for %d orders", ErrScript, len(v), len(idx))
		}
		for j, st := range v {
			out[idx[j]] = Unknown
			if st != "" {
				out[idx[j]] = State(st[0])
			}
		}
	}
	return out, nil
}

// Settlement is the MySQL outcome of one order.
type Settlement struct {
	OrderID   string
	Confirmed bool
	Reason    string // when not confirmed
	Quantity  int64
	UserID    string
}

// Settle applies MySQL outcomes to Redis; it is idempotent.
func (s *Store) Settle(ctx context.Context, activityID int64, orders []Settlement) (int64, error) {
	if len(orders) == 0 {
		return 0, nil
	}
	ids := make([]string, len(orders))
	for i, o := range orders {
		ids[i] = o.OrderID
	}
	var changed int64
	for sh, idx := range byShard(ids) {
		k := s.keysOf(activityID, sh)
		args := make([]any, 0, 3+5*len(idx))
		args = append(args, Channel(s.prefix), activityID, OrderChannel(s.prefix))
		for _, i := range idx {
			o := orders[i]
			outcome := "F"
			if o.Confirmed {
				outcome = "K"
			}
			args = append(args, o.OrderID, outcome, o.Reason, o.Quantity, o.UserID)
		}
		n, err := lua.Settle.Run(ctx, s.rdb, []string{k.Meta, k.Deadlines}, args...).Int64()
		if err != nil {
			return changed, fmt.Errorf("settle %d orders of activity %d: %w", len(idx), activityID, err)
		}
		changed += n
	}
	return changed, nil
}

// Sale is the Redis view of one activity.
type Sale struct {
	Total, Sold, Pending, Limit int64
	Start, End                  time.Time
	// Gen is the admin generation Redis was last warmed with.
	Gen int64
	// Archived: only the summary is left (see lua/archive.lua).
	Archived bool
	// Shards is the sale's stock shard count (1: unsharded).
	Shards int
}

// Available is what Redis would still sell.
func (s Sale) Available() int64 {
	if a := s.Total - s.Sold - s.Pending; a > 0 {
		return a
	}
	return 0
}

// WarmArgs are MySQL's facts about a sale.
type WarmArgs struct {
	Total, Limit int64
	Start, End   time.Time
	Sold         int64
	// Users are MySQL's per-user totals; nil when not loaded.
	Users map[string]int64
	// CreateOnly (a rebuild after loss) leaves a sale that exists alone: its
	// settings may be newer than the caller's read of MySQL.
	CreateOnly bool
	// Gen is MySQL's activities.generation of the row these facts are from.
	Gen int64
	// Shards is the sale's stock shard count (0 or 1: unsharded); fixed
	// for the activity's life (MySQL's activities.stock_shards).
	Shards int
}

// WarmOutcome tells what Warm did.
type WarmOutcome string

// Warm outcomes (see lua/warm.lua).
const (
	WarmUpdated   WarmOutcome = "updated"
	WarmCreated   WarmOutcome = "created"
	WarmNeedUsers WarmOutcome = "need_users"
	WarmConflict  WarmOutcome = "conflict"
	WarmExists    WarmOutcome = "exists" // CreateOnly, and the sale exists
	// WarmArchived: the sale is archived at this generation or a newer one.
	WarmArchived WarmOutcome = "archived"
)

// Warm creates or updates a sale in Redis. On WarmConflict the returned Sale
// carries Redis's sold and pending.
//
// A sharded sale is warmed shard by shard (lua/warm.lua, flags "z" and
// "s"): a shard built now gets its sold units and users (those homed on it)
// and an even share of what is left of the stock over the shards built now;
// an update moves shard 0's total by the change of the stock and copies the
// settings to every shard. Shard 0 is updated first (it alone can refuse)
// and built last (it names the shard count, so the sale is found once every
// shard is there).
func (s *Store) Warm(ctx context.Context, activityID int64, a WarmArgs) (WarmOutcome, Sale, error) {
	shards := max(a.Shards, 1)
	s.SetShards(activityID, shards)
	if shards == 1 {
		out, sale, err := s.warmShard(ctx, activityID, s.Keys(activityID), a, a.Total, a.Sold, a.Users, "")
		if err != nil || out == WarmArchived || out == WarmConflict {
			return out, sale, err
		}
		return out, sale, s.register(ctx, activityID)
	}
	keys := make([]Keys, shards)
	p := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, shards)
	for k := range keys {
		keys[k] = s.ShardKeys(activityID, k, shards)
		cmds[k] = p.HMGet(ctx, keys[k].Meta, "total", "sold", "pending", "archived", "gen", "stock")
	}
	if _, err := p.Exec(ctx); err != nil {
		return "", Sale{}, fmt.Errorf("warm activity %d: %w", activityID, err)
	}
	built := make([]bool, shards)
	var live, nbuilt int64
	for k, c := range cmds {
		v := c.Val()
		switch {
		case v[0] == nil:
			built[k] = true
		case v[3] != nil && num(v[4]) < a.Gen:
			built[k] = true // an archive an admin change reopens
		case v[3] != nil:
			if k == 0 {
				return WarmArchived, Sale{}, nil
			}
		default:
			live += num(v[0])
		}
		if built[k] {
			nbuilt++
		}
	}
	if nbuilt > 0 && a.Sold > 0 && a.Users == nil {
		return WarmNeedUsers, Sale{}, nil
	}
	per := SplitUsers(a.Users, shards)
	sold := make([]int64, shards)
	rem := a.Total - live
	for k := range per {
		for _, n := range per[k] {
			sold[k] += n
		}
		if built[k] {
			rem -= sold[k]
		}
	}
	rem = max(rem, 0)
	order := make([]int, 0, shards)
	for k := 1; k < shards; k++ {
		order = append(order, k)
	}
	if built[0] {
		order = append(order, 0)
	} else {
		order = append([]int{0}, order...)
	}
	allots := make([]int64, shards)
	var i int64
	for k := range allots {
		if built[k] {
			allots[k] = sold[k] + allotment(rem, int(i), int(nbuilt))
			i++
		}
	}
	outs := map[WarmOutcome]int{}
	for _, k := range order {
		allot := allots[k]
		flag := "s"
		if k == 0 {
			flag = "z"
		}
		out, _, err := s.warmShard(ctx, activityID, keys[k], a, allot, sold[k], per[k], flag)
		if err == nil && out == WarmConflict && k == 0 {
			// Lowered below what shard 0 holds: units of the others move in
			// first, then once more.
			c := cmds[0].Val()
			need := num(c[1]) + num(c[2]) - num(c[0]) - a.Total + num(c[5])
			if _, err = s.Rebalance(ctx, activityID, 0, shards, max(need, 1)); err == nil {
				out, _, err = s.warmShard(ctx, activityID, keys[k], a, allot, sold[k], per[k], flag)
			}
		}
		if err != nil {
			return "", Sale{}, err
		}
		switch out {
		case WarmConflict, WarmNeedUsers:
			sale, _, err := s.Sale(ctx, activityID)
			return out, Sale{Sold: sale.Sold, Pending: sale.Pending}, err
		case WarmArchived:
			if k == 0 {
				return out, Sale{}, nil
			}
		}
		outs[out]++
	}
	out := WarmUpdated
	switch {
	case outs[WarmCreated] > 0:
		out = WarmCreated
	case outs[WarmExists] == shards:
		out = WarmExists
	}
	return out, Sale{}, s.register(ctx, activityID)
}

func (s *Store) register(ctx context.Context, activityID int64) error {
	if err := s.rdb.SAdd(ctx, ActiveSet(s.prefix), activityID).Err(); err != nil {
		return fmt.Errorf("warm activity %d: register: %w", activityID, err)
	}
	return nil
}

// warmShard runs warm.lua on one shard: total and sold are the shard's (the
// sale's when unsharded), users those homed on it.
func (s *Store) warmShard(ctx context.Context, activityID int64, k Keys, a WarmArgs, total, sold int64, users map[string]int64, flags string) (WarmOutcome, Sale, error) {
	if a.CreateOnly {
		flags += "c"
	}
	if a.Users != nil {
		flags += "u"
	}
	args := []any{total, a.Limit, a.Start.UnixMilli(), a.End.UnixMilli(), sold, flags,
		Channel(s.prefix), activityID, a.Gen, max(a.Shards, 1), a.Total}
	for u, n := range users {
		if n > 0 {
			args = append(args, u, n)
		}
	}
	v, err := lua.Warm.Run(ctx, s.rdb, []string{k.Meta, k.Deadlines}, args...).Slice()
	if err != nil {
		return "", Sale{}, fmt.Errorf("warm activity %d: %w", activityID, err)
	}
	out := WarmOutcome(str(at(v, 0)))
	switch out {
	case WarmUpdated, WarmCreated, WarmNeedUsers, WarmExists, WarmArchived:
		return out, Sale{}, nil
	case WarmConflict:
		return out, Sale{Sold: num(at(v, 1)), Pending: num(at(v, 2))}, nil
	}
	return "", Sale{}, fmt.Errorf("warm activity %d: %w: %v", activityID, ErrScript, v)
}

// Sale reads the Redis view of an activity; found is false when its keys are
// gone (any shard's, for a sharded sale: it is then rebuilt). A sharded
// sale's view sums its shards; Total is its stock (shard 0's "stock").
func (s *Store) Sale(ctx context.Context, activityID int64) (sale Sale, found bool, err error) {
	v, err := s.rdb.HMGet(ctx, s.Keys(activityID).Meta, "total", "sold", "pending", "limit", "start", "end", "gen", "archived", "shards", "stock").Result()
	if err != nil {
		return Sale{}, false, fmt.Errorf("read activity %d: %w", activityID, err)
	}
	if v[0] == nil {
		return Sale{}, false, nil
	}
	sale = Sale{
		Total: num(v[0]), Sold: num(v[1]), Pending: num(v[2]), Limit: num(v[3]),
		Start: time.UnixMilli(num(v[4])).UTC(), End: time.UnixMilli(num(v[5])).UTC(),
		Gen: num(v[6]), Archived: v[7] != nil, Shards: max(int(num(v[8])), 1),
	}
	if sale.Shards == 1 {
		return sale, true, nil
	}
	s.shards.Store(activityID, sale.Shards)
	if v[9] != nil {
		sale.Total = num(v[9])
	}
	p := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, sale.Shards)
	for k := 1; k < sale.Shards; k++ {
		cmds[k] = p.HMGet(ctx, s.ShardKeys(activityID, k, sale.Shards).Meta, "total", "sold", "pending")
	}
	if _, err := p.Exec(ctx); err != nil {
		return Sale{}, false, fmt.Errorf("read activity %d: %w", activityID, err)
	}
	for _, c := range cmds[1:] {
		w := c.Val()
		if w[0] == nil {
			return Sale{}, false, nil
		}
		sale.Sold += num(w[1])
		sale.Pending += num(w[2])
	}
	return sale, true, nil
}

// Record is an order's reservation record.
type Record struct {
	OrderID  string
	State    State
	Quantity int64
	UserID   string
	Deadline time.Time
	Reason   string // F: why it failed
	// Queued (P or C): the broker confirmed the order's message, which is
	// then safe in the queue.
	Queued bool
	// Adopted (P or C, not yet queued): a keyed replay publishes the order
	// (lua/reserve.lua); the undo of the attempt that reserved it refuses.
	Adopted bool
}

// queuedMark ends an open (P or C) record whose message the broker
// confirmed (lua/queued.lua); adoptedMark one a replay publishes.
const (
	queuedMark  = "q"
	adoptedMark = "a"
)

// ParseRecord decodes a record (lua/record.lua): "<S><qty>|<user>" then
// "|<deadline_ms>|<mark>" while open (P, C) or "|<reason>" when failed.
func ParseRecord(orderID, raw string) (Record, error) {
	bad := func() (Record, error) {
		return Record{}, fmt.Errorf("order %s: %w: record %q", orderID, ErrScript, raw)
	}
	head, rest, _ := strings.Cut(raw, "|")
	if len(head) < 2 {
		return bad()
	}
	q, err := strconv.ParseInt(head[1:], 10, 64)
	if err != nil || q < 0 {
		return bad()
	}
	rec := Record{OrderID: orderID, State: State(head[0]), Quantity: q}
	var tail string
	rec.UserID, tail, _ = strings.Cut(rest, "|")
	switch rec.State {
	case Pending, Claimed:
		d, mark, ok := strings.Cut(tail, "|")
		if !ok {
			return bad()
		}
		if d != "" {
			ms, err := strconv.ParseInt(d, 10, 64)
			if err != nil {
				return bad()
			}
			rec.Deadline = time.UnixMilli(ms).UTC()
		}
		rec.Queued, rec.Adopted = mark == queuedMark, mark == adoptedMark
	case Failed:
		rec.Reason = tail
	case Confirmed:
		if tail != "" {
			return bad()
		}
	default:
		return bad()
	}
	return rec, nil
}

// Order reads one order's record; found is false when Redis has none.
func (s *Store) Order(ctx context.Context, activityID int64, orderID string) (Record, bool, error) {
	raw, err := lua.Order.Run(ctx, s.rdb, []string{s.orderKeys(activityID, orderID).Meta}, orderID).Text()
	if errors.Is(err, redis.Nil) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read order %s: %w", orderID, err)
	}
	rec, err := ParseRecord(orderID, raw)
	return rec, err == nil, err
}

// Overdue lists up to max order ids of an activity whose deadline is at or
// before t, oldest first.
// Each shard keeps its own deadline index: up to max from each, merged.
func (s *Store) Overdue(ctx context.Context, activityID int64, t time.Time, max int64) ([]string, error) {
	shards, err := s.allShards(ctx, activityID)
	if err != nil {
		return nil, err
	}
	var all []redis.Z
	for _, k := range shards {
		z, err := s.rdb.ZRangeByScoreWithScores(ctx, k.Deadlines, &redis.ZRangeBy{
			Min: "-inf", Max: strconv.FormatInt(t.UnixMilli(), 10), Count: max,
		}).Result()
		if err != nil {
			return nil, fmt.Errorf("overdue orders of activity %d: %w", activityID, err)
		}
		all = append(all, z...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Score < all[j].Score })
	ids := make([]string, 0, min(int64(len(all)), max))
	for _, z := range all {
		if int64(len(ids)) == max {
			break
		}
		ids = append(ids, z.Member.(string))
	}
	return ids, nil
}

// ArchiveOutcome tells what Archive did (see lua/archive.lua).
type ArchiveOutcome string

// Archive outcomes; only ArchiveDone changed anything.
const (
	ArchiveDone     ArchiveOutcome = "archived"
	ArchiveAlready  ArchiveOutcome = "already"
	ArchiveMissing  ArchiveOutcome = "missing"
	ArchiveStale    ArchiveOutcome = "stale"
	ArchiveOpen     ArchiveOutcome = "open"
	ArchivePending  ArchiveOutcome = "pending"
	ArchiveDisagree ArchiveOutcome = "disagree"
)

// ArchiveArgs are MySQL's facts about a sale, read under its row lock.
type ArchiveArgs struct {
	Gen, Total, Sold int64
	Grace            time.Duration // after the sale's end
	SummaryTTL       time.Duration // of the summary left behind
}

// Archive drops an ended sale's per-order and per-user state when Redis agrees
// with a (the caller holds MySQL's row lock); see lua/archive.lua. gen is the
// generation of an earlier archive (ArchiveAlready). The caller then takes
// the id off the activity set (Deactivate).
//
// A sharded sale is archived shard by shard, shard 0 last (it names the
// shard count), once the shard totals add up to a.Total and their sold to
// a.Sold (ArchiveDisagree otherwise); each shard is checked against its own
// counters, read just before (an ended sale reserves nothing, so nothing
// moves them but a late settle, which makes its archive refuse).
func (s *Store) Archive(ctx context.Context, activityID int64, a ArchiveArgs) (out ArchiveOutcome, gen int64, err error) {
	shards, err := s.allShards(ctx, activityID)
	if err != nil {
		return "", 0, err
	}
	if len(shards) == 1 {
		return s.archiveShard(ctx, activityID, shards[0], a)
	}
	if _, err := s.CompleteMoves(ctx, activityID); err != nil {
		return "", 0, err
	}
	metas, err := s.readShards(ctx, shards)
	if err != nil {
		return "", 0, fmt.Errorf("archive activity %d: %w", activityID, err)
	}
	var total, sold int64
	for _, m := range metas {
		if m["total"] == "" {
			return ArchiveMissing, 0, nil
		}
		t, _ := strconv.ParseInt(m["total"], 10, 64)
		n, _ := strconv.ParseInt(m["sold"], 10, 64)
		total, sold = total+t, sold+n
	}
	if total != a.Total || sold != a.Sold {
		return ArchiveDisagree, 0, nil
	}
	for i := len(shards) - 1; i >= 0; i-- {
		b := a
		b.Total, _ = strconv.ParseInt(metas[i]["total"], 10, 64)
		b.Sold, _ = strconv.ParseInt(metas[i]["sold"], 10, 64)
		out, gen, err = s.archiveShard(ctx, activityID, shards[i], b)
		if err != nil || (out != ArchiveDone && out != ArchiveAlready) {
			return out, gen, err
		}
	}
	return out, gen, nil
}

func (s *Store) archiveShard(ctx context.Context, activityID int64, k Keys, a ArchiveArgs) (out ArchiveOutcome, gen int64, err error) {
	v, err := lua.Archive.Run(ctx, s.rdb, []string{k.Meta, k.Deadlines},
		a.Gen, a.Total, a.Sold, a.Grace.Milliseconds(), a.SummaryTTL.Milliseconds()).Slice()
	if err != nil {
		return "", 0, fmt.Errorf("archive activity %d: %w", activityID, err)
	}
	out = ArchiveOutcome(str(at(v, 0)))
	switch out {
	case ArchiveAlready:
		return out, num(at(v, 1)), nil
	case ArchiveDone, ArchiveMissing, ArchiveStale, ArchiveOpen, ArchivePending, ArchiveDisagree:
		return out, 0, nil
	}
	return "", 0, fmt.Errorf("archive activity %d: %w: %v", activityID, ErrScript, v)
}

// Deactivate takes an activity id off the set the sweeper and the reconciler
// walk (an archived sale).
func (s *Store) Deactivate(ctx context.Context, activityID int64) error {
	if err := s.rdb.SRem(ctx, ActiveSet(s.prefix), activityID).Err(); err != nil {
		return fmt.Errorf("deactivate activity %d: %w", activityID, err)
	}
	return nil
}

// Activities lists the activity ids warmed into this Redis.
func (s *Store) Activities(ctx context.Context) ([]int64, error) {
	m, err := s.rdb.SMembers(ctx, ActiveSet(s.prefix)).Result()
	if err != nil {
		return nil, fmt.Errorf("list activities: %w", err)
	}
	out := make([]int64, 0, len(m))
	for _, x := range m {
		if id, err := strconv.ParseInt(x, 10, 64); err == nil {
			out = append(out, id)
		}
	}
	return out, nil
}

func at(v []any, i int) any {
	if i < len(v) {
		return v[i]
	}
	return nil
}

func str(x any) string {
	switch t := x.(type) {
	case string:
		return t
	case int64:
		return strconv.FormatInt(t, 10)
	}
	return ""
}

func num(x any) int64 {
	switch t := x.(type) {
	case int64:
		return t
	case string:
		n, _ := strconv.ParseInt(t, 10, 64)
		return n
	}
	return 0
}

// UserEntry is a user's entry in a sale (lua/record.lua): the units it
// holds (pending and confirmed) and the order id of each idempotency key it
// reserved with.
type UserEntry struct {
	Held int64
	Keys map[string]string
}

// ParseUser decodes a user's entry: "<held>" then "\n<key>\t<order id>" per key.
func ParseUser(raw string) (UserEntry, error) {
	lines := strings.Split(raw, "\n")
	n, err := strconv.ParseInt(lines[0], 10, 64)
	if err != nil {
		return UserEntry{}, fmt.Errorf("%w: user entry %q", ErrScript, raw)
	}
	u := UserEntry{Held: n, Keys: map[string]string{}}
	for _, l := range lines[1:] {
		k, oid, ok := strings.Cut(l, "\t")
		if !ok {
			return UserEntry{}, fmt.Errorf("%w: user entry %q", ErrScript, raw)
		}
		u.Keys[k] = oid
	}
	return u, nil
}

// User reads a user's entry; a user without one holds nothing.
func (s *Store) User(ctx context.Context, activityID int64, userID string) (UserEntry, error) {
	h, err := s.UserHash(ctx, activityID, userID)
	if err != nil {
		return UserEntry{}, err
	}
	raw, err := s.rdb.HGet(ctx, h, userID).Result()
	if errors.Is(err, redis.Nil) {
		return UserEntry{Keys: map[string]string{}}, nil
	}
	if err != nil {
		return UserEntry{}, fmt.Errorf("read user %s of activity %d: %w", userID, activityID, err)
	}
	return ParseUser(raw)
}

// Forget drops orders from the deadline index (they are settled already).
func (s *Store) Forget(ctx context.Context, activityID int64, orderIDs ...string) error {
	if len(orderIDs) == 0 {
		return nil
	}
	for sh, idx := range byShard(orderIDs) {
		m := make([]any, len(idx))
		for j, i := range idx {
			m[j] = orderIDs[i]
		}
		if err := s.rdb.ZRem(ctx, s.keysOf(activityID, sh).Deadlines, m...).Err(); err != nil {
			return fmt.Errorf("forget %d orders of activity %d: %w", len(idx), activityID, err)
		}
	}
	return nil
}

// Postpone moves orders' next look in the deadline index to t; the
// deadlines in their records stay as they were.
func (s *Store) Postpone(ctx context.Context, activityID int64, t time.Time, orderIDs ...string) error {
	if len(orderIDs) == 0 {
		return nil
	}
	for sh, idx := range byShard(orderIDs) {
		z := make([]redis.Z, len(idx))
		for j, i := range idx {
			z[j] = redis.Z{Score: float64(t.UnixMilli()), Member: orderIDs[i]}
		}
		// XX: only while the order is still indexed (not settled meanwhile).
		if err := s.rdb.ZAddXX(ctx, s.keysOf(activityID, sh).Deadlines, z...).Err(); err != nil {
			return fmt.Errorf("postpone %d orders of activity %d: %w", len(idx), activityID, err)
		}
	}
	return nil
}

// Records reads the records of orderIDs, in order: the sale's bucket count,
// then every record in one pipelined round trip; an order without a record
// gets the zero Record (OrderID "").
func (s *Store) Records(ctx context.Context, activityID int64, orderIDs []string) ([]Record, error) {
	out := make([]Record, len(orderIDs))
	if len(orderIDs) == 0 {
		return out, nil
	}
	for sh, idx := range byShard(orderIDs) {
		k := s.keysOf(activityID, sh)
		n, err := s.bucketsOf(ctx, activityID, k)
		if err != nil {
			return nil, err
		}
		ids := make([]string, len(idx))
		for j, i := range idx {
			ids[j] = orderIDs[i]
		}
		raw, err := s.hmget(ctx, k, n, ids)
		if err != nil {
			return nil, fmt.Errorf("read %d orders of activity %d: %w", len(ids), activityID, err)
		}
		for j, r := range raw {
			if r == nil {
				continue
			}
			if out[idx[j]], err = ParseRecord(ids[j], *r); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// hmget reads the records of orderIDs from their buckets in one round trip
// (one HMGET per bucket, pipelined), in order; nil where there is none.
func (s *Store) hmget(ctx context.Context, k Keys, n int64, orderIDs []string) ([]*string, error) {
	byHash := map[string][]int{}
	for i, oid := range orderIDs {
		h := k.Order(n, oid)
		byHash[h] = append(byHash[h], i)
	}
	p := s.rdb.Pipeline()
	cmds := make(map[string]*redis.SliceCmd, len(byHash))
	for h, idx := range byHash {
		ids := make([]string, len(idx))
		for j, i := range idx {
			ids[j] = orderIDs[i]
		}
		cmds[h] = p.HMGet(ctx, h, ids...)
	}
	if _, err := p.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([]*string, len(orderIDs))
	for h, idx := range byHash {
		v := cmds[h].Val()
		for j, i := range idx {
			if j < len(v) {
				if rs, ok := v[j].(string); ok {
					out[i] = &rs
				}
			}
		}
	}
	return out, nil
}

// SyncResult reports what Sync changed.
type SyncResult struct {
	Found                         bool
	OldTotal, OldSold, OldPending int64
	NewPending, StaleIndexEntries int64
}

// Sync sets a sale's total, sold and per-user totals from MySQL and recounts
// pending from the open reservations; see lua/sync.lua for what the caller
// must hold. A sharded sale is synced shard by shard (each its own sold and
// users, by their home shard, and its own pending; totals kept), then shard
// 0's total moves by what the shard totals miss of total, read from a
// consistent snapshot (Allotted); the result sums the shards.
func (s *Store) Sync(ctx context.Context, activityID, total, sold int64, users map[string]int64) (SyncResult, error) {
	res, _, err := s.sync(ctx, activityID, "", total, sold, users)
	return res, err
}

// EndRecovery ends the sale's recovery if it is still the one named by
// token, in one step with Sync's exact counters, shard by shard (the caller
// holds what Sync needs: see salesdb.EndRecovery); it reports whether it
// ended now.
func (s *Store) EndRecovery(ctx context.Context, activityID int64, token string, total, sold int64, users map[string]int64) (bool, error) {
	if token == "" {
		return false, fmt.Errorf("end recovery of activity %d: no token", activityID)
	}
	res, ended, err := s.sync(ctx, activityID, token, total, sold, users)
	return err == nil && ended && res.Found, err
}

// sync is Sync, and with a token EndRecovery: each shard's counters and the
// deletion of its recovering mark are one step (lua/sync.lua), taken only
// while the shard recovers under token. Shards go N-1..0, shard 0 last:
// Recovery reads shard 0's mark, so the sale shows recovered only once
// every shard is. The shard totals are allotted before shard 0's step, so
// no shard sells before the totals add up to MySQL's stock. It reports
// whether any shard's counters were set (with a token: any recovery ended).
func (s *Store) sync(ctx context.Context, activityID int64, token string, total, sold int64, users map[string]int64) (SyncResult, bool, error) {
	shards, err := s.allShards(ctx, activityID)
	if err != nil {
		return SyncResult{}, false, err
	}
	if len(shards) == 1 {
		return s.syncShard(ctx, activityID, shards[0], token, total, sold, users)
	}
	per := SplitUsers(users, len(shards))
	var out SyncResult
	synced := false
	var oldTotal int64
	for k := len(shards) - 1; k >= 0; k-- {
		if k == 0 {
			// Totals from a consistent snapshot of every shard (Allotted);
			// shard 0's moves by what they miss of total.
			sum, ok, err := s.Allotted(ctx, activityID)
			if err != nil {
				return out, synced, err
			}
			if !ok {
				return SyncResult{}, synced, nil // a shard is missing: rebuilt first (Warm)
			}
			if sum != total {
				if err := s.allot(ctx, activityID, total-sum); err != nil {
					return out, synced, err
				}
			}
			oldTotal = sum
		}
		var sk int64
		for _, n := range per[k] {
			sk += n
		}
		r, ok, err := s.syncShard(ctx, activityID, shards[k], token, -1, sk, per[k])
		if err != nil {
			return out, synced, err
		}
		if !r.Found {
			if ok {
				return SyncResult{}, synced, nil // a shard is missing: rebuilt first (Warm)
			}
			continue // not recovering under token: ended already, or a later loss's
		}
		synced = true
		out.Found = true
		out.OldTotal, out.OldSold, out.OldPending = out.OldTotal+r.OldTotal, out.OldSold+r.OldSold, out.OldPending+r.OldPending
		out.NewPending, out.StaleIndexEntries = out.NewPending+r.NewPending, out.StaleIndexEntries+r.StaleIndexEntries
	}
	if out.Found { // shard 0's turn, the last, has always run by here
		out.OldTotal = oldTotal
	}
	return out, synced, nil
}

// syncShard runs lua/sync.lua on one shard; total < 0 keeps the shard's
// total. The bool is false only when token was given and the shard does not
// recover under it (nothing changed).
func (s *Store) syncShard(ctx context.Context, activityID int64, k Keys, token string, total, sold int64, users map[string]int64) (SyncResult, bool, error) {
	t := any(total)
	if total < 0 {
		t = "-"
	}
	args := []any{t, sold, Channel(s.prefix), activityID, token}
	for u, n := range users {
		args = append(args, u, n)
	}
	v, err := lua.Sync.Run(ctx, s.rdb, []string{k.Meta, k.Deadlines, k.Recovering}, args...).Slice()
	if err != nil {
		return SyncResult{}, false, fmt.Errorf("sync activity %d: %w", activityID, err)
	}
	switch str(at(v, 0)) {
	case "missing":
		return SyncResult{}, true, nil
	case "not_recovering":
		return SyncResult{}, false, nil
	case "synced":
		return SyncResult{Found: true, OldTotal: num(at(v, 1)), OldSold: num(at(v, 2)), OldPending: num(at(v, 3)),
			NewPending: num(at(v, 4)), StaleIndexEntries: num(at(v, 5))}, true, nil
	}
	return SyncResult{}, false, fmt.Errorf("sync activity %d: %w: %v", activityID, ErrScript, v)
}

// Open lists the records of an activity's orders that are still pending or
// claimed (those in the deadline index), up to max.
func (s *Store) Open(ctx context.Context, activityID int64, max int64) ([]Record, error) {
	shards, err := s.allShards(ctx, activityID)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, k := range shards {
		some, err := s.rdb.ZRangeByScore(ctx, k.Deadlines, &redis.ZRangeBy{Min: "-inf", Max: "+inf", Count: max}).Result()
		if err != nil {
			return nil, fmt.Errorf("open orders of activity %d: %w", activityID, err)
		}
		ids = append(ids, some...)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	recs, err := s.Records(ctx, activityID, ids)
	if err != nil {
		return nil, fmt.Errorf("open orders of activity %d: %w", activityID, err)
	}
	out := make([]Record, 0, len(ids))
	for _, rec := range recs {
		if rec.State == Pending || rec.State == Claimed {
			out = append(out, rec)
		}
	}
	return out, nil
}

// MarkRecovering makes reserve.lua answer Unsure to every request that
// would reserve (a key it does not know, or none) until EndRecovery with
// token (the drain marker passed every consumer), or at most for d: set before a sale lost by Redis is rebuilt, so
// that a keyed retry of an order still in the queue is never handed a second
// order id, and no unit is sold twice while the queued orders' units are
// unknown to Redis. d is a safety bound only (a queued order is taken as
// gone after it, see the sweeper); the drain marker ends it.
func (s *Store) MarkRecovering(ctx context.Context, activityID int64, token string, d time.Duration) error {
	shards, err := s.allShards(ctx, activityID)
	if err != nil {
		return err
	}
	// Every shard: each reserve.lua reads its own shard's mark.
	for _, k := range shards {
		if err := s.rdb.Set(ctx, k.Recovering, token, d).Err(); err != nil {
			return fmt.Errorf("mark activity %d recovering: %w", activityID, err)
		}
	}
	if len(shards) == 1 {
		return nil
	}
	// Two backends rebuilding at once interleave their marks (shards on
	// several slots: no one script sets them all), and EndRecovery ends a
	// shard only under its own token: a shard left with the other token
	// would still recover after shard 0 ended. Shard 0's mark names the
	// recovery, so every shard takes its token. Each caller reads shard 0
	// after writing it; the last writer of shard 0 reads its own token, and
	// the other one reads it too unless it read before that write, in which
	// case all of its writes came before the last writer's: the marks agree.
	tok, err := s.rdb.Get(ctx, shards[0].Recovering).Result()
	if err != nil || tok == token {
		if errors.Is(err, redis.Nil) {
			err = nil // ended meanwhile: nothing to agree on
		}
		if err != nil {
			return fmt.Errorf("mark activity %d recovering: %w", activityID, err)
		}
		return nil
	}
	for _, k := range shards[1:] {
		if err := s.rdb.Set(ctx, k.Recovering, tok, d).Err(); err != nil {
			return fmt.Errorf("mark activity %d recovering: %w", activityID, err)
		}
	}
	return nil
}

// Recovery returns the token of the sale's recovery, "" when it is not
// recovering.
func (s *Store) Recovery(ctx context.Context, activityID int64) (string, error) {
	tok, err := s.rdb.Get(ctx, s.Keys(activityID).Recovering).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("recovery of activity %d: %w", activityID, err)
	}
	return tok, nil
}

// RegistryKey is the hash of the live consumers of order queue queue
// (lua/consumers.lua). Every key of the drain markers' registry and passes
// shares one hash tag, so that one script sees every partition's.
func (s *Store) RegistryKey(queue string) string {
	return s.prefix + "{seckill:drain}:consumers:" + queue
}

// passesKey is the hash of the consumers of one partition that passed the
// drain marker of a recovery (lua/pass.lua).
func (s *Store) passesKey(activityID int64, token string, partition int) string {
	return s.prefix + "{seckill:drain}:passed:" + strconv.FormatInt(activityID, 10) + ":" + token + ":" + strconv.Itoa(partition)
}

// Consumer names a consumer of one order queue in the registry.
type Consumer struct{ Queue, ID string }

// RegisterConsumers writes (or refreshes) the entries of consumers in the
// registry of their queues, each live for ttl from now (Redis time); ttl 0
// drops them instead (a consumer whose channel is closed). It returns each
// queue's round after the call (lua/consumers.lua).
func (s *Store) RegisterConsumers(ctx context.Context, ttl time.Duration, consumers []Consumer) ([]string, error) {
	if len(consumers) == 0 {
		return nil, nil
	}
	keys := make([]string, len(consumers))
	args := make([]any, 1+len(consumers))
	args[0] = int64(0)
	if ttl > 0 {
		args[0] = max(1, ttl.Milliseconds())
	}
	for i, c := range consumers {
		keys[i] = s.RegistryKey(c.Queue)
		args[1+i] = c.ID
	}
	v, err := lua.Consumers.Run(ctx, s.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("register %d consumers: %w", len(consumers), err)
	}
	return v, nil
}

// MarkerPass is a consumer's pass of a copy of a sale's drain marker.
type MarkerPass struct {
	ActivityID int64
	Token      string
	// Queues are the order queues of partitions 0..n-1; Partition is the
	// passing consumer's, Consumer its registry id.
	Queues    []string
	Partition int
	Consumer  string
	// Round and Copy are the copy's ("" for the backend's copy); NewCopy
	// names the copy if it is elected to go on now.
	Round, Copy, NewCopy string
	// MinAge is the age a queue's registry must have before its entries
	// count as every live consumer (a registry lost with Redis is rebuilt as
	// each consumer refreshes); TTL bounds how long the passes are kept;
	// Takeover is how long the elected copy may go unseen before another
	// copy takes its place.
	MinAge, TTL, Takeover time.Duration
}

// PassOutcome is what PassMarker answers.
type PassOutcome string

// Outcomes of a pass (lua/pass.lua).
const (
	PassUnregistered PassOutcome = "unregistered" // nothing recorded: register first
	PassStale        PassOutcome = "stale"        // nothing recorded: send the copy round again with Round
	PassWaiting      PassOutcome = "waiting"      // recorded; others must pass yet: send it round again as Copy
	PassDrop         PassOutcome = "drop"         // recorded; another copy goes round: ack this one
	PassDone         PassOutcome = "done"         // every live consumer of every partition passed
)

// PassResult is the outcome of a pass, the partition's round and the
// copy's id (for the copy sent round again), and whether the consumer had
// passed in this round before.
type PassResult struct {
	Outcome     PassOutcome
	Round, Copy string
	Again       bool
}

// PassMarker records that a consumer decided every delivery it received
// before a copy of the sale's drain marker (lua/pass.lua).
func (s *Store) PassMarker(ctx context.Context, p MarkerPass) (PassResult, error) {
	if p.Partition < 0 || p.Partition >= len(p.Queues) {
		return PassResult{}, fmt.Errorf("pass marker of activity %d: partition %d of %d", p.ActivityID, p.Partition, len(p.Queues))
	}
	keys := make([]string, 0, 2*len(p.Queues))
	for _, q := range p.Queues {
		keys = append(keys, s.RegistryKey(q))
	}
	for i := range p.Queues {
		keys = append(keys, s.passesKey(p.ActivityID, p.Token, i))
	}
	v, err := lua.Pass.Run(ctx, s.rdb, keys, p.Partition, p.Consumer, p.Round, p.MinAge.Milliseconds(),
		max(1, p.TTL.Milliseconds()), p.Copy, p.NewCopy, p.Takeover.Milliseconds()).Slice()
	if err != nil {
		return PassResult{}, fmt.Errorf("pass marker of activity %d: %w", p.ActivityID, err)
	}
	r := PassResult{Outcome: PassOutcome(str(at(v, 0))), Round: str(at(v, 1)), Again: num(at(v, 2)) == 1, Copy: str(at(v, 3))}
	switch r.Outcome {
	case PassUnregistered, PassStale, PassWaiting, PassDrop, PassDone:
		return r, nil
	}
	return PassResult{}, fmt.Errorf("pass marker of activity %d: %w: %v", p.ActivityID, ErrScript, v)
}

// RestoreKeys binds idempotency keys back to orders whose records Redis
// lost (a worker that wrote such an order, a backend whose order was
// confirmed after the loss): a keyed retry then replays the order. Only the
// key, never the record: settle.lua writes the record and moves the counters
// (a record restored first would make it skip them). A key bound already
// wins (lua/restore.lua). Orders without a key are skipped.
func (s *Store) RestoreKeys(ctx context.Context, activityID int64, orders []Decided) error {
	ids := make([]string, len(orders))
	for i, o := range orders {
		ids[i] = o.OrderID
	}
	for sh, idx := range byShard(ids) {
		args := make([]any, 0, 1+6*len(idx))
		args = append(args, 0) // the sale exists: restore.lua chooses no bucket count
		for _, i := range idx {
			if o := orders[i]; o.IdempotencyKey != "" {
				args = append(args, o.OrderID, "", "", o.Quantity, o.UserID, o.IdempotencyKey)
			}
		}
		if len(args) == 1 {
			continue
		}
		if err := lua.Restore.Run(ctx, s.rdb, []string{s.keysOf(activityID, sh).Meta}, args...).Err(); err != nil {
			return fmt.Errorf("restore keys of %d orders of activity %d: %w", len(idx), activityID, err)
		}
	}
	return nil
}

// Decided is an order MySQL holds, for Restore.
type Decided struct {
	OrderID, UserID, IdempotencyKey string
	Quantity                        int64
	Confirmed                       bool
	Reason                          string
}

// Restore writes back the records and idempotency keys of orders MySQL has
// decided (lua/restore.lua), after Redis lost a sale or before an archived
// one reopens, so that a client retrying with its Idempotency-Key gets its
// order again instead of a second one. What Redis holds wins: anything it
// learnt is newer.
//
// total is MySQL's stock of the sale: a sale built anew takes its bucket
// count from it (0: the records go to the unbucketed hashes, which the warm
// that builds the sale moves into buckets).
//
// Each order goes to the shard its id names; a shard built anew chooses
// its bucket count from its share of total.
func (s *Store) Restore(ctx context.Context, activityID, total int64, orders []Decided) error {
	shards, err := s.Shards(ctx, activityID)
	if err != nil {
		return err
	}
	ids := make([]string, len(orders))
	for i, o := range orders {
		ids[i] = o.OrderID
	}
	for sh, idx := range byShard(ids) {
		sub := make([]Decided, len(idx))
		for j, i := range idx {
			sub[j] = orders[i]
		}
		n := shards
		if sh.n > 0 {
			n = sh.n // the id names the count
		}
		if err := s.restoreShard(ctx, activityID, s.keysOf(activityID, sh), allotment(total, sh.k, n), sub); err != nil {
			return err
		}
	}
	return nil
}

// allotment is shard's even share of total units over shards.
func allotment(total int64, shard, shards int) int64 {
	n := int64(max(shards, 1))
	a := total / n
	if int64(shard) < total%n {
		a++
	}
	return a
}

func (s *Store) restoreShard(ctx context.Context, activityID int64, k Keys, total int64, orders []Decided) error {
	for start := 0; start < len(orders); start += 500 {
		chunk := orders[start:min(start+500, len(orders))]
		args := make([]any, 0, 1+6*len(chunk))
		args = append(args, total)
		for _, o := range chunk {
			state := "F"
			if o.Confirmed {
				state = "K"
			}
			args = append(args, o.OrderID, state, o.Reason, o.Quantity, o.UserID, o.IdempotencyKey)
		}
		if err := lua.Restore.Run(ctx, s.rdb, []string{k.Meta}, args...).Err(); err != nil {
			return fmt.Errorf("restore %d orders of activity %d: %w", len(chunk), activityID, err)
		}
	}
	return nil
}
