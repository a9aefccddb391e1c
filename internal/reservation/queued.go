package reservation

import (
	"context"
	"fmt"

	"github.com/seckill/seckill/lua"
)

// MarkQueuedMany is MarkQueued for the orders of one message of a group
// (one activity): queued.lua once per stock shard the ids name (a group's
// message: one call). marked[i] reports whether orderIDs[i] was marked,
// errs[i] the error of its shard's call (a lost round trip is every order's
// of that shard).
func (s *Store) MarkQueuedMany(ctx context.Context, activityID int64, orderIDs []string) (marked []bool, errs []error) {
	marked = make([]bool, len(orderIDs))
	errs = make([]error, len(orderIDs))
	for sh, idx := range byShard(orderIDs) {
		args := make([]any, len(idx))
		for j, i := range idx {
			args[j] = orderIDs[i]
		}
		v, err := lua.Queued.Run(ctx, s.rdb, []string{s.keysOf(activityID, sh).Meta}, args...).Int64Slice()
		if err == nil && len(v) != len(idx) {
			err = fmt.Errorf("%w: %d answers for %d orders", ErrScript, len(v), len(idx))
		}
		for j, i := range idx {
			if err != nil {
				errs[i] = fmt.Errorf("mark order %s queued: %w", orderIDs[i], err)
				continue
			}
			marked[i] = v[j] == 1
		}
	}
	return marked, errs
}
