package limiter

import (
	"sync"
	"time"
)

// Memory is a Store in this process: per key, the exact sliding log of the
// moments of its admitted hits within the last window. It serves a proxy
// that runs alone ([proxy] limiter = "memory"), tests, and on_redis_error =
// "local" while Redis cannot answer. One lock: a decision touches a few
// logs for a few hundred nanoseconds.
type Memory struct {
	mu   sync.Mutex
	logs map[string]*memLog
}

// memLog holds admission moments (ns since clockBase), oldest first, from
// head on; length is the window it was last used with (for Sweep).
type memLog struct {
	at     []int64
	head   int
	length time.Duration
}

// clockBase anchors the memory store's clock: monotonic ns since start.
var clockBase = time.Now()

// NewMemory makes an empty in-process store.
func NewMemory() *Memory { return &Memory{logs: map[string]*memLog{}} }

// Take implements Store; it never fails.
func (m *Memory) Take(ws []Want, weight int, out []Got) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Read under the lock: the log must see moments in order, or a decision
	// timed before another's prune would count against a stale window.
	now := int64(time.Since(clockBase))
	ok := true
	for i, w := range ws {
		lg := m.logs[w.Key]
		if lg == nil {
			lg = &memLog{}
			m.logs[w.Key] = lg
		}
		lg.length = w.Length
		lg.prune(now)
		n := len(lg.at) - lg.head
		g := Got{Remaining: max(0, w.Limit-n), At: now / 1000}
		switch {
		case weight > w.Limit:
			g.Full, g.Reset = true, w.Length
		case w.Limit-n < weight: // fits once n - limit + weight hits slid out
			g.Full, g.Reset = true, time.Duration(lg.at[lg.head+n-w.Limit+weight-1]+int64(w.Length)-now)
		case n > 0:
			g.Reset = time.Duration(lg.at[lg.head] + int64(w.Length) - now)
		}
		ok = ok && !g.Full
		out[i] = g
	}
	if !ok {
		return false, nil
	}
	for i, w := range ws {
		lg := m.logs[w.Key]
		for range weight {
			lg.at = append(lg.at, now)
		}
		out[i].Remaining -= weight
		if out[i].Reset == 0 {
			out[i].Reset = w.Length
		}
	}
	return true, nil
}

// prune drops the moments that slid out of the window, compacting the
// slice once most of it is dead.
func (lg *memLog) prune(now int64) {
	for lg.head < len(lg.at) && lg.at[lg.head] <= now-int64(lg.length) {
		lg.head++
	}
	if lg.head > 64 && lg.head > len(lg.at)/2 {
		lg.at = append(lg.at[:0], lg.at[lg.head:]...)
		lg.head = 0
	}
}

// Sweep forgets the logs with nothing left in their window (idle clients).
func (m *Memory) Sweep() {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := int64(time.Since(clockBase))
	for k, lg := range m.logs {
		if lg.prune(now); lg.head == len(lg.at) {
			delete(m.logs, k)
		}
	}
}
