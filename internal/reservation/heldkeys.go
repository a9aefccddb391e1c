package reservation

import (
	"context"
	"fmt"
	"strings"

	"github.com/seckill/seckill/lua"
)

// Outcomes of HeldKeys (lua/heldkeys.lua).
const (
	HeldSoldOut    = "keys"       // sold out: Pairs is every key that holds an order
	HeldOpen       = "open"       // units are left
	HeldNotFound   = "not_found"  // the sale is not in Redis
	HeldRecovering = "recovering" // rebuilt after a Redis loss; keys may be missing
	HeldSharded    = "sharded"    // several stock shards: not read
	HeldTooMany    = "too_many"   // more keys than the caller keeps
)

// KeyPair is a user's idempotency key.
type KeyPair struct{ User, Key string }

// Held is what HeldKeys read: its outcome and, when HeldSoldOut, the pairs.
type Held struct {
	Outcome string
	Pairs   []KeyPair
}

// heldPage is how many hashes (buckets of user entries) one call of
// heldkeys.lua reads: about 1,000 keys of a full sale, a millisecond or two
// of Redis, so that reading a sale of many keys never stalls the purchases
// and limiter calls sharing that Redis.
const heldPage = 16

// HeldKeys reads every (user, idempotency key) that holds an order of a
// sold-out sale (confirmed, pending or failed), a page of buckets per call,
// each call with the check that no unit is left: the set is exact until
// the sale's next stock event, and a unit that came back during the read
// published one (the caller, who took its news token before, voids the
// read). Up to most keys; a sale with more answers HeldTooMany.
func (s *Store) HeldKeys(ctx context.Context, activityID int64, most int) (Held, error) {
	k := s.Keys(activityID)
	h := Held{Outcome: HeldSoldOut}
	for next := 0; ; {
		r, err := lua.HeldKeys.Run(ctx, s.rdb, []string{k.Meta, k.Recovering}, most-len(h.Pairs), next, heldPage).Slice()
		if err != nil {
			return Held{}, fmt.Errorf("held keys of activity %d: %w", activityID, err)
		}
		outcome, _ := r[0].(string)
		switch outcome {
		case HeldOpen, HeldNotFound, HeldRecovering, HeldSharded, HeldTooMany:
			return Held{Outcome: outcome}, nil
		case HeldSoldOut:
		default:
			return Held{}, fmt.Errorf("%w: held keys of activity %d: %v", ErrScript, activityID, r[0])
		}
		if len(r) < 2 || len(r)%2 != 0 {
			return Held{}, fmt.Errorf("%w: held keys of activity %d: a reply of %d items", ErrScript, activityID, len(r))
		}
		for i := 2; i < len(r); i += 2 {
			user, _ := r[i].(string)
			index, _ := r[i+1].(string)
			// The index is "\n<key>\t<order id>" per key (lua/record.lua).
			for _, line := range strings.Split(index, "\n")[1:] {
				key, _, ok := strings.Cut(line, "\t")
				if !ok {
					return Held{}, fmt.Errorf("%w: key index of user %s: %q", ErrScript, user, index)
				}
				h.Pairs = append(h.Pairs, KeyPair{User: user, Key: key})
			}
		}
		n, _ := r[1].(int64)
		if n == 0 {
			return h, nil
		}
		next = int(n)
	}
}
