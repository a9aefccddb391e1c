package room

import (
	"context"
	"math"
	"time"

	isoldout "github.com/seckill/seckill/internal/soldout"
	"github.com/seckill/seckill/lua"
)

// Run steps every room this instance serves each Tick until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.o.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.Step(ctx)
	}
}

// Step runs one step of every room in use (Run's body; tests call it to
// move a line without waiting for the ticker).
func (m *Manager) Step(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	rooms := make([]*Room, 0, len(m.rooms))
	for name, rm := range m.rooms {
		if now.Sub(time.UnixMilli(rm.lastUse.Load())) > forgetAfter {
			delete(m.rooms, name)
			// Its gauges would keep showing the line as last seen.
			if mt := m.o.Metrics; mt != nil {
				mt.Waiting.DeleteLabelValues(name)
				mt.Active.DeleteLabelValues(name)
			}
			continue
		}
		rooms = append(rooms, rm)
	}
	m.mu.Unlock()
	for _, rm := range rooms {
		rr := rm.rr.Load()
		if rr == nil || now.Sub(time.UnixMilli(rm.lastUse.Load())) > idleAfter || now.Before(rm.retryAt) {
			continue
		}
		rm.step(ctx, rr, now)
	}
}

// readStock refreshes the room's units left when its read is older than
// StockTTL or news about the sale arrived; a failed read keeps the last
// one (the step passes what it knows). It returns the units and the
// bought count to take off them (see room_tick.lua; -1: none).
func (rm *Room) readStock(ctx context.Context, now time.Time) (units, base int64) {
	st := rm.m.o.Stock
	rm.stockMu.Lock()
	due := rm.stockDirty || now.Sub(rm.stockAt) >= rm.m.o.StockTTL
	rm.stockDirty = false
	seq, bought := rm.stockSeq, rm.boughtLast
	rm.stockMu.Unlock()
	if st != nil && due {
		sctx, cancel := context.WithTimeout(ctx, tickTimeout)
		sale, found, err := st.Sale(sctx, rm.act)
		cancel()
		rm.stockMu.Lock()
		switch {
		case err != nil:
			rm.stockDirty = true
			rm.m.o.Log.Debug("waiting room: stock read failed", "room", rm.Name, "err", err)
		case rm.stockSeq != seq:
			// News arrived while reading: what was read may predate it.
			rm.stockDirty = true
		default:
			rm.stockAt = now
			rm.units, rm.startMs, rm.boughtBase = -1, 0, bought
			if found {
				rm.units = max(sale.Total-sale.Sold-sale.Pending, 0)
				rm.startMs = sale.Start.UnixMilli()
			}
			// Read after the sold-out event: this read is the truth.
			rm.soldOutEvent = false
		}
		rm.stockMu.Unlock()
	}
	rm.stockMu.Lock()
	defer rm.stockMu.Unlock()
	units = rm.units
	if rm.soldOutEvent {
		units = 0
	}
	rm.soldOut.Store(units == 0)
	return units, rm.boughtBase
}

// step moves the room's line once: see room_tick.lua.
func (rm *Room) step(ctx context.Context, rr *ruleRoom, now time.Time) {
	units, base := rm.readStock(ctx, now)
	rm.mu.Lock()
	seen := rm.seen
	rm.seen = make(map[string]struct{}, len(seen))
	rm.mu.Unlock()
	c := rr.cfg
	burst := math.Max(1, c.AdmitPerSecond/4)
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	// The polls go in chunks, a script call each, so that no call carries
	// an unbounded argument list; only the last call walks the line (with
	// every poll recorded: no holder is skipped for a poll in a later
	// chunk).
	var v []any
	var err error
	var admitted, skipped, expired int64
	for first := true; first || len(ids) > 0; first = false {
		n := min(len(ids), touchChunk)
		steps := 0
		if n == len(ids) {
			steps = maxSteps
		}
		args := make([]any, 0, 11+n)
		args = append(args, c.AdmitPerSecond, burst, c.MaxActive, units, c.NoShowMargin, c.PlaceTTL.Milliseconds(),
			c.Session.Milliseconds(), rm.opensMs(rr), steps, keyKeep.Milliseconds(), base)
		for _, id := range ids[:n] {
			args = append(args, id)
		}
		ids = ids[n:]
		tctx, cancel := context.WithTimeout(ctx, tickTimeout)
		v, err = lua.RoomTick.Run(tctx, rm.m.o.Redis, rm.keys, args...).Slice()
		cancel()
		rm.call("tick", err)
		if err != nil || len(v) < 10 {
			break
		}
		admitted, skipped, expired = admitted+num(v[3]), skipped+num(v[4]), expired+num(v[5])
	}
	if err != nil || len(v) < 10 {
		if ctx.Err() == nil {
			rm.m.o.Log.Debug("waiting room: step failed", "room", rm.Name, "err", err)
			rm.degraded.Store(true)
			// A Redis that fails is asked again at a backing-off pace, not
			// every tick by every room.
			rm.retryAt = now.Add(rm.bo.Next())
		}
		// The polls it carried are carried again: a holder is not
		// abandoned for a failed step.
		rm.mu.Lock()
		for id := range seen {
			rm.seen[id] = struct{}{}
		}
		rm.mu.Unlock()
		return
	}
	rm.degraded.Store(false)
	rm.bo.Reset()
	ns := &state{served: num(v[0]), next: num(v[1]), active: num(v[2]), opened: num(v[7]) == 1, pre: num(v[8]), at: now}
	if old := rm.st.Load(); old != nil {
		ns.rate = old.rate
		if dt := now.Sub(old.at).Seconds(); dt > 0 && ns.served >= old.served {
			// Places decided per second (admitted or skipped), smoothed over
			// about a second of steps; it only counts while someone waits.
			if ns.next > old.served {
				inst := float64(ns.served-old.served) / dt
				a := math.Min(1, dt)
				ns.rate = (1-a)*old.rate + a*inst
			}
		}
	}
	rm.st.Store(ns)
	rm.stockMu.Lock()
	rm.boughtLast = num(v[9])
	rm.stockMu.Unlock()
	if mt := rm.m.o.Metrics; mt != nil {
		mt.Waiting.WithLabelValues(rm.Name).Set(float64(ns.next - ns.served + ns.pre))
		mt.Active.WithLabelValues(rm.Name).Set(float64(ns.active))
		mt.Admitted.WithLabelValues(rm.Name).Add(float64(admitted))
		mt.Abandoned.WithLabelValues(rm.Name).Add(float64(skipped))
		mt.Expired.WithLabelValues(rm.Name).Add(float64(expired))
	}
}

// Changed: news about a sale (units came back, the sale changed): the
// rooms serving it read its stock at their next step. A soldout.Listener.
func (m *Manager) Changed(id int64) {
	m.each(id, func(rm *Room) {
		rm.stockDirty = true
		rm.soldOutEvent = false
		rm.stockSeq++
	})
}

// SoldOut: the sale has no unit left; its rooms stop admitting and tell
// every poller at once, until a stock read shows units again.
func (m *Manager) SoldOut(id int64) {
	m.each(id, func(rm *Room) {
		rm.soldOutEvent = true
		rm.stockDirty = true
		rm.stockSeq++
		rm.soldOut.Store(true)
	})
}

// Reset: (re)subscribed, events may have been lost: read every stock again.
func (m *Manager) Reset() {
	m.each(0, func(rm *Room) {
		rm.stockDirty = true
		rm.stockSeq++
	})
}

func (m *Manager) each(id int64, fn func(*Room)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, rm := range m.rooms {
		if id == 0 || rm.act == id {
			rm.stockMu.Lock()
			fn(rm)
			rm.stockMu.Unlock()
		}
	}
}

var _ isoldout.SoldOutListener = (*Manager)(nil)
