package sale

import (
	"github.com/seckill/seckill/internal/ordermsg"
)

// SetAfterWarm sets the hook that runs once an admin change's warm has built
// a sale anew (the moment it becomes visible to buyers).
func SetAfterWarm(s *Service, f func(id int64)) { s.afterWarm = f }

// SetBeforeGroupPublish sets the hook that runs after a group's reserve,
// before the publish of the message carrying its orders (a test stops the
// backend there).
func SetBeforeGroupPublish(s *Service, f func(orders []ordermsg.Order)) { s.beforeGroupPublish = f }

// GroupQueued reports how many purchases of activity id (a sale of one
// stock shard) wait for a group.
func GroupQueued(s *Service, id int64) int {
	return s.groups.Queued(s.store.ShardKeys(id, 0, 1))
}

// SetAfterGroupReserve sets the hook that runs once a group's reserve call
// of n purchases returned (a test panics there).
func SetAfterGroupReserve(s *Service, f func(n int)) { s.afterGroupReserve = f }
