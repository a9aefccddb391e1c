package reservation

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/lua"
)

// Stock shards. A sale may split its stock over K shards (1..MaxShards),
// each a sale-shaped key set under its own hash tag, so that one sale's
// reservations spread over K slots (K masters of a cluster). Shard 0 is the
// unsharded layout ({act:ID}); shard k >= 1 is {act:ID:k.n} (ShardTag). A user is homed on
// one shard (HomeShard): the user's entry, idempotency keys and orders live
// there, so reserve.lua runs on one slot and the per-user limit and the keys
// stay exact; the order id names its shard (ordermsg.NewShardOrderID). Each
// shard's meta holds its own total (its allotment of the stock), sold and
// pending, and a copy of the sale's settings; every shard's meta holds
// "shards" = K, shard 0's the sale's stock ("stock"). Units move between
// shards when a buyer's home shard runs dry (Rebalance), so a sale answers
// sold out only once no shard holds a unit.

// MaxShards bounds a sale's stock shards.
const MaxShards = ordermsg.MaxShards

// ErrShards: the sale has another shard count than the caller chose the
// home shard (and the order id) for; nothing was reserved. Choose again
// (Store.Home).
var ErrShards = errors.New("the sale's stock shards changed")

// ErrMoving: units kept moving between the sale's shards through every try
// of a purchase whose home shard was empty; nothing was reserved, and the
// sale is not known to be sold out (answer "unavailable, retry").
var ErrMoving = errors.New("units kept moving between stock shards")

// ShardKeys returns the keys of stock shard shard of activity id in a sale
// of shards shards; shard 0 is KeysFor.
func ShardKeys(prefix string, id int64, shard, shards int) Keys {
	if shard == 0 {
		k := KeysFor(prefix, id)
		k.Shards = shards
		return k
	}
	base := prefix + "{" + ShardTag(id, shard, shards) + "}:"
	return Keys{
		Meta: base + "meta", Deadlines: base + "deadlines", Recovering: base + "recovering",
		Base: base, Shard: shard, Shards: shards,
	}
}

// ShardTag is the hash tag of shard shard (>= 1) of a sale of shards
// shards: "act:ID:k.n", with the smallest n >= 0 whose Redis Cluster slot
// lies within 4 slots past the k-th of shards evenly spaced points of the
// slot ring, counted from shard 0's slot. A cluster's masters hold contiguous, about
// equal ranges of slots, so evenly spaced slots spread a sale's shards over
// the masters as evenly as their count allows (plain "act:ID:k" tags land
// where CRC16 puts them: three shards on one master one time in nine).
// Deterministic: every process computes the same tags, and they are part of
// the layout (never change the rule under a live sale).
func ShardTag(id int64, shard, shards int) string {
	key := tagKey{id, shard, shards}
	if t, ok := tags.Load(key); ok {
		return t.(string)
	}
	const ring = 16384
	s0 := Slot("act:" + strconv.FormatInt(id, 10))
	target := (s0 + shard*ring/shards) % ring
	// A narrow window, so a point near a range's end rarely crosses into
	// the next master's: ~4096 CRC16s a tag (well under a millisecond, once
	// per process and shard).
	const width = 4
	head := "act:" + strconv.FormatInt(id, 10) + ":" + strconv.Itoa(shard) + "."
	// CRC16 runs on: the head's once, then each candidate's digits only.
	h := crc16(0, head)
	var digits []byte
	n := 0
	for ; ; n++ {
		digits = strconv.AppendInt(digits[:0], int64(n), 10)
		if (int(crc16(h, string(digits))%ring)-target+ring)%ring < width {
			break
		}
	}
	tag := head + strconv.Itoa(n)
	tags.Store(key, tag)
	return tag
}

type tagKey struct {
	id            int64
	shard, shards int
}

var tags sync.Map // tagKey -> string

// Slot is the Redis Cluster hash slot of a key without a hash tag (CRC16
// XMODEM mod 16384, as CLUSTER KEYSLOT).
func Slot(key string) int { return int(crc16(0, key) % 16384) }

// crc16 continues CRC16 XMODEM from crc over s.
func crc16(crc uint16, s string) uint16 {
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for j := 0; j < 8; j++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// HomeShard is the shard of a sale of shards shards on which user's orders
// live: FNV-1a of the user id mod shards. Not the SHA-1 of the buckets, so
// that the users of one shard still spread over all of its buckets.
func HomeShard(userID string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(userID))
	return int(h.Sum64() % uint64(shards))
}

// SplitUsers splits per-user units by the users' home shards.
func SplitUsers(users map[string]int64, shards int) []map[string]int64 {
	out := make([]map[string]int64, max(shards, 1))
	for k := range out {
		out[k] = map[string]int64{}
	}
	for u, n := range users {
		out[HomeShard(u, shards)][u] = n
	}
	return out
}

// shardID names a shard as an order id does: the shard and the sale's
// shard count (0 and 0 for shard 0, whose keys do not depend on it).
type shardID struct{ k, n int }

// shardOf is the shard an order id names (shard 0 for an id that names none).
func shardOf(orderID string) shardID {
	k, n, err := ordermsg.ShardOf(orderID)
	if err != nil {
		return shardID{}
	}
	return shardID{k, n}
}

// SetShards tells the store the shard count MySQL holds for a sale, for
// the steps of a rebuild that run while Redis does not hold the sale
// (MarkRecovering, Restore); what Redis holds wins once it does.
func (s *Store) SetShards(activityID int64, shards int) {
	s.shards.Store(activityID, max(shards, 1))
}

// Shards reads the sale's stock shard count from shard 0's meta (1 for an
// unsharded sale); a sale Redis does not hold gets what SetShards said, else 1.
func (s *Store) Shards(ctx context.Context, activityID int64) (int, error) {
	v, err := s.rdb.HMGet(ctx, s.Keys(activityID).Meta, "total", "shards").Result()
	if err != nil {
		return 0, fmt.Errorf("read the shards of activity %d: %w", activityID, err)
	}
	if v[0] == nil {
		if c, ok := s.shards.Load(activityID); ok {
			return c.(int), nil
		}
		return 1, nil
	}
	n := max(int(num(v[1])), 1)
	s.shards.Store(activityID, n)
	return n, nil
}

// cachedShards is the shard count the purchase path uses: read once per
// process and sale, corrected by reserve.lua's "shards" answer.
func (s *Store) cachedShards(ctx context.Context, activityID int64) (int, error) {
	if c, ok := s.shards.Load(activityID); ok {
		return c.(int), nil
	}
	return s.Shards(ctx, activityID)
}

// Home returns the keys of user's home shard in the sale: the purchase path
// names its order id for that shard (ordermsg.NewShardOrderID(id,
// k.Shard, k.Shards)) and reserves with Request.Keys = k.
func (s *Store) Home(ctx context.Context, activityID int64, userID string) (Keys, error) {
	n, err := s.cachedShards(ctx, activityID)
	if err != nil {
		return Keys{}, err
	}
	return s.ShardKeys(activityID, HomeShard(userID, n), n), nil
}

// ShardKeys returns the keys of one shard of a sale of shards shards.
func (s *Store) ShardKeys(activityID int64, shard, shards int) Keys {
	return ShardKeys(s.prefix, activityID, shard, shards)
}

// orderKeys are the keys of the shard holding order oid: its id names them.
func (s *Store) orderKeys(activityID int64, oid string) Keys {
	sh := shardOf(oid)
	return s.ShardKeys(activityID, sh.k, sh.n)
}

// keysOf are the keys of shard sh.
func (s *Store) keysOf(activityID int64, sh shardID) Keys {
	return s.ShardKeys(activityID, sh.k, sh.n)
}

// allShards lists the keys of every shard of a sale, shard 0 first.
func (s *Store) allShards(ctx context.Context, activityID int64) ([]Keys, error) {
	n, err := s.Shards(ctx, activityID)
	if err != nil {
		return nil, err
	}
	out := make([]Keys, n)
	for k := range out {
		out[k] = s.ShardKeys(activityID, k, n)
	}
	return out, nil
}

// byShard groups indexes of order ids by the shard they name.
func byShard(orderIDs []string) map[shardID][]int {
	out := map[shardID][]int{}
	for i, oid := range orderIDs {
		k := shardOf(oid)
		out[k] = append(out[k], i)
	}
	return out
}

// Rebalance moves units into shard to of a sale of shards shards from the
// others, at least need if one donor has them (and up to half of what that
// donor has); it returns the units moved, 0 when no other shard has any.
// Each move runs in three steps on two slots (lua/move_out.lua): the donor
// takes the units off its total and records the move, the recipient adds
// them once (it keeps the last move it applied per donor), the donor clears
// its record. A move left half done (a process died) is completed by the
// next mover of the same pair, or by the reconciler (CompleteMoves).
func (s *Store) Rebalance(ctx context.Context, activityID int64, to, shards int, need int64) (int64, error) {
	n, _, err := s.rebalance(ctx, activityID, to, shards, need)
	return n, err
}

// rebalance is Rebalance; with nothing moved it also returns every shard's
// move count as met (the donors' from their empty answers, the
// recipient's read last), for soldOut.
func (s *Store) rebalance(ctx context.Context, activityID int64, to, shards int, need int64) (int64, []int64, error) {
	if shards <= 1 {
		return 0, nil, nil
	}
	mv := make([]int64, shards)
	// Concurrent movers start at different donors. A donor that cannot be
	// asked (its master is failing over) is passed over: another may have
	// units; but then nothing is sold out.
	var failed error
	first := rand.IntN(shards - 1)
	for i := 0; i < shards-1; i++ {
		from := (to + 1 + (first+i)%(shards-1)) % shards
		n, v, err := s.move(ctx, activityID, from, to, shards, need)
		if n > 0 || (err != nil && ctx.Err() != nil) {
			// Moved (an error: its last steps failed, and the next mover of
			// the pair completes it), or out of time.
			return n, nil, err
		}
		if err != nil {
			failed = err
			continue
		}
		mv[from] = v
	}
	if failed != nil {
		return 0, nil, failed
	}
	r, err := s.rdb.HGet(ctx, s.ShardKeys(activityID, to, shards).Meta, "mv").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, nil, fmt.Errorf("read the moves of activity %d: %w", activityID, err)
	}
	mv[to] = num(r)
	return 0, mv, nil
}

// soldOut tells whether no shard held a unit at one instant: every shard
// has none now, has no move in flight (a donor's record "mo:<r>": its units
// are on the way, in no shard's total), and took part in no move step since
// mv (rebalance's counts) was read; every step (move_out, move_in,
// move_done) counts in "mv". A shard no step touched between its two reads
// was in the state of its second read at the instant between the two
// rounds, so at that instant no shard held a unit and none was in flight.
// (A release that gives units back after that instant does not make the
// answer false: the sale was sold out then.)
func (s *Store) soldOut(ctx context.Context, activityID int64, shards int, mv []int64) (bool, error) {
	keys := make([]Keys, shards)
	for k := range keys {
		keys[k] = s.ShardKeys(activityID, k, shards)
	}
	metas, err := s.readShards(ctx, keys)
	if err != nil {
		return false, fmt.Errorf("read the shards of activity %d: %w", activityID, err)
	}
	for k, m := range metas {
		if len(m) == 0 {
			if mv[k] != -1 {
				return false, nil
			}
			continue
		}
		if num(m["total"])-num(m["sold"])-num(m["pending"]) > 0 || num(m["mv"]) != mv[k] || len(m.inFlight()) > 0 {
			return false, nil
		}
	}
	return true, nil
}

func (s *Store) move(ctx context.Context, activityID int64, from, to, shards int, need int64) (int64, int64, error) {
	d := s.ShardKeys(activityID, from, shards)
	for try := 0; try < 3; try++ {
		v, err := lua.MoveOut.Run(ctx, s.rdb, []string{d.Meta, d.Recovering}, to, need).Slice()
		if err != nil {
			return 0, 0, fmt.Errorf("move units of activity %d from shard %d to %d: %w", activityID, from, to, err)
		}
		seq, n := num(at(v, 1)), num(at(v, 2))
		switch str(at(v, 0)) {
		case "empty":
			return 0, seq, nil
		case "pending":
			if err := s.completeMove(ctx, activityID, from, to, shards, seq, n); err != nil {
				return 0, 0, err
			}
			continue
		case "moved":
			if s.moveHook != nil {
				if err := s.moveHook("out"); err != nil {
					return n, 0, err
				}
			}
			return n, 0, s.completeMove(ctx, activityID, from, to, shards, seq, n)
		}
		return 0, 0, fmt.Errorf("move units of activity %d: %w: %v", activityID, ErrScript, v)
	}
	// Three moves of the pair completed in a row: others keep emptying this
	// donor; count it as met with units in motion.
	return 0, -2, nil
}

// completeMove applies move seq of n units from shard from to shard to
// (once, however often it runs) and clears the donor's record of it.
func (s *Store) completeMove(ctx context.Context, activityID int64, from, to, shards int, seq, n int64) error {
	d, r := s.ShardKeys(activityID, from, shards), s.ShardKeys(activityID, to, shards)
	v, err := lua.MoveIn.Run(ctx, s.rdb, []string{r.Meta}, from, seq, n).Slice()
	if err != nil {
		return fmt.Errorf("move units of activity %d into shard %d: %w", activityID, to, err)
	}
	if str(at(v, 0)) == "missing" {
		// The recipient is not in Redis: the move stays in flight, and
		// counts as such, until the shard is rebuilt.
		return nil
	}
	if s.moveHook != nil {
		if err := s.moveHook("in"); err != nil {
			return err
		}
	}
	rec := strconv.FormatInt(seq, 10) + ":" + strconv.FormatInt(n, 10)
	if err := lua.MoveDone.Run(ctx, s.rdb, []string{d.Meta}, to, rec).Err(); err != nil {
		return fmt.Errorf("move units of activity %d: clear the move from shard %d: %w", activityID, from, err)
	}
	return nil
}

// shardMeta is one shard's meta as read, for Allotted.
type shardMeta map[string]string

// inFlight lists the moves shard from has in flight: recipient -> seq, n.
func (m shardMeta) inFlight() map[int][2]int64 {
	out := map[int][2]int64{}
	for f, v := range m {
		r, ok := strings.CutPrefix(f, "mo:")
		if !ok {
			continue
		}
		to, err1 := strconv.Atoi(r)
		a, b, _ := strings.Cut(v, ":")
		seq, err2 := strconv.ParseInt(a, 10, 64)
		n, err3 := strconv.ParseInt(b, 10, 64)
		if err1 == nil && err2 == nil && err3 == nil {
			out[to] = [2]int64{seq, n}
		}
	}
	return out
}

// protocol is what of a shard's meta moves change: its total and its move
// count; two equal reads of it mean no move step touched the shard in
// between (move_done counts too, though it moves no unit).
func (m shardMeta) protocol() string {
	return m["total"] + "|" + m["mv"]
}

func (s *Store) readShards(ctx context.Context, keys []Keys) ([]shardMeta, error) {
	p := s.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = p.HGetAll(ctx, k.Meta)
	}
	if _, err := p.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([]shardMeta, len(keys))
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}

// CompleteMoves completes every move left in flight between the shards of
// a sale (a mover died between its steps); it returns how many it met.
func (s *Store) CompleteMoves(ctx context.Context, activityID int64) (int, error) {
	keys, err := s.allShards(ctx, activityID)
	if err != nil || len(keys) == 1 {
		return 0, err
	}
	metas, err := s.readShards(ctx, keys)
	if err != nil {
		return 0, fmt.Errorf("read the shards of activity %d: %w", activityID, err)
	}
	n := 0
	for from, m := range metas {
		for to, sn := range m.inFlight() {
			if to < 0 || to >= len(keys) {
				continue
			}
			if err := s.completeMove(ctx, activityID, from, to, len(keys), sn[0], sn[1]); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// Allotted returns the units a sale's shards hold: their totals and the
// units of the moves in flight between them (taken off a donor, not yet
// applied by the recipient), from two reads of every shard between which
// none took part in a move (so the sum held at one instant: every first
// read came before every second one). It only reads. ok is false when moves
// kept going through every attempt, or a shard is missing.
func (s *Store) Allotted(ctx context.Context, activityID int64) (sum int64, ok bool, err error) {
	keys, err := s.allShards(ctx, activityID)
	if err != nil {
		return 0, false, err
	}
	for attempt := 0; attempt < 5; attempt++ {
		a, err := s.readShards(ctx, keys)
		if err != nil {
			return 0, false, fmt.Errorf("read the shards of activity %d: %w", activityID, err)
		}
		b, err := s.readShards(ctx, keys)
		if err != nil {
			return 0, false, fmt.Errorf("read the shards of activity %d: %w", activityID, err)
		}
		sum, stable := int64(0), true
		for i := range a {
			if a[i]["total"] == "" {
				return 0, false, nil
			}
			if a[i].protocol() != b[i].protocol() {
				stable = false
				break
			}
			t, _ := strconv.ParseInt(a[i]["total"], 10, 64)
			sum += t
			for to, sn := range a[i].inFlight() {
				if to >= 0 && to < len(a) {
					applied, _ := strconv.ParseInt(a[to]["mi:"+strconv.Itoa(i)], 10, 64)
					if sn[0] > applied {
						sum += sn[1]
					}
				}
			}
		}
		if stable {
			return sum, true, nil
		}
	}
	return 0, false, nil
}

// allot moves shard 0's total by delta (lua/allot.lua).
func (s *Store) allot(ctx context.Context, activityID int64, delta int64) error {
	if err := lua.Allot.Run(ctx, s.rdb, []string{s.Keys(activityID).Meta}, delta, Channel(s.prefix), activityID).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("allot %d units to activity %d: %w", delta, activityID, err)
	}
	return nil
}

// ShardBuckets reads one shard's bucket count (see Buckets).
func (s *Store) ShardBuckets(ctx context.Context, activityID int64, k Keys) (int64, error) {
	return s.bucketsOf(ctx, activityID, k)
}
