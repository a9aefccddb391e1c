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

// HeldKeys reads every (user, idempotency key) that holds an order of a
// sold-out sale (confirmed, pending or failed), in one script call with the
// check that no unit is left, so the set is exact until the sale's next
// stock event. Up to most keys; a sale with more answers HeldTooMany.
func (s *Store) HeldKeys(ctx context.Context, activityID int64, most int) (Held, error) {
	k := s.Keys(activityID)
	r, err := lua.HeldKeys.Run(ctx, s.rdb, []string{k.Meta, k.Recovering}, most).StringSlice()
	if err != nil {
		return Held{}, fmt.Errorf("held keys of activity %d: %w", activityID, err)
	}
	if len(r) == 0 {
		return Held{}, fmt.Errorf("%w: held keys of activity %d: empty reply", ErrScript, activityID)
	}
	h := Held{Outcome: r[0]}
	switch h.Outcome {
	case HeldOpen, HeldNotFound, HeldRecovering, HeldSharded, HeldTooMany:
		return h, nil
	case HeldSoldOut:
	default:
		return Held{}, fmt.Errorf("%w: held keys of activity %d: %q", ErrScript, activityID, h.Outcome)
	}
	if len(r)%2 != 1 {
		return Held{}, fmt.Errorf("%w: held keys of activity %d: odd reply", ErrScript, activityID)
	}
	for i := 1; i < len(r); i += 2 {
		// The index is "\n<key>\t<order id>" per key (lua/record.lua).
		for _, line := range strings.Split(r[i+1], "\n")[1:] {
			key, _, ok := strings.Cut(line, "\t")
			if !ok {
				return Held{}, fmt.Errorf("%w: key index of user %s: %q", ErrScript, r[i], r[i+1])
			}
			h.Pairs = append(h.Pairs, KeyPair{User: r[i], Key: key})
		}
	}
	return h, nil
}
