package limiter

// Give-backs: slots this instance holds in Redis but will not use (unspent
// lease slots, the hits of decisions nobody waits for any more) go back by
// ZREM, through one queue and one goroutine.

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// giveBack queues slots this instance will not spend for removal (ZREM).
// One goroutine at a time sends what is queued, a pipeline per round trip;
// past maxBack queued slots, they slide out instead (counted).
func (s *Redis) giveBack(key string, members []string) {
	if s.backs.Add(int32(len(members))) > maxBack {
		s.backs.Add(-int32(len(members)))
		s.m.backDropped.Add(float64(len(members)))
		return
	}
	s.backMu.Lock()
	s.backQ = append(s.backQ, backItem{key, members})
	start := !s.backing
	s.backing = true
	s.backMu.Unlock()
	if start {
		go s.sendBack()
	}
}

// backItem is a give-back of one window.
type backItem struct {
	key     string
	members []string
}

const maxBack = 1 << 16

// sendBack sends the queued give-backs until none is left.
func (s *Redis) sendBack() {
	for {
		s.backMu.Lock()
		q := s.backQ
		s.backQ = nil
		if len(q) == 0 {
			s.backing = false
			s.backMu.Unlock()
			return
		}
		s.backMu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, it := range q {
				args := make([]any, len(it.members))
				for i, m := range it.members {
					args[i] = m
				}
				p.ZRem(ctx, it.key, args...)
			}
			return nil
		})
		cancel()
		n := 0
		for _, it := range q {
			n += len(it.members)
		}
		if err == nil {
			s.m.returned.Add(float64(n))
		} else {
			s.m.backDropped.Add(float64(n))
			s.log.Debug("limiter lease give-back failed: the slots slide out", "err", err)
		}
		s.backs.Add(-int32(n))
	}
}
