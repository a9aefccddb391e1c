package reservation

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/lua"
)

// MarkQueuedMany is MarkQueued for the orders of one message of a group
// (one activity) in one round trip: queued.lua once per order, pipelined.
// marked[i] reports whether orderIDs[i] was marked, errs[i] the error of its
// call (a lost round trip is every order's; a script the node does not hold
// is sent once more by source).
func (s *Store) MarkQueuedMany(ctx context.Context, activityID int64, orderIDs []string) (marked []bool, errs []error) {
	p := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(orderIDs))
	for i, oid := range orderIDs {
		// The meta of the shard the order id names, as MarkQueued's.
		cmds[i] = lua.Queued.EvalSha(ctx, p, []string{s.orderKeys(activityID, oid).Meta}, oid)
	}
	_, _ = p.Exec(ctx) // each command holds its own error
	marked = make([]bool, len(orderIDs))
	errs = make([]error, len(orderIDs))
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			cmd = lua.Queued.Eval(ctx, s.rdb, []string{s.orderKeys(activityID, orderIDs[i]).Meta}, orderIDs[i])
		}
		n, err := cmd.Int64()
		if err != nil {
			errs[i] = fmt.Errorf("mark order %s queued: %w", orderIDs[i], err)
			continue
		}
		marked[i] = n == 1
	}
	return marked, errs
}
