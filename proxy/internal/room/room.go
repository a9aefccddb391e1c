// Package room is the proxy's waiting room: a line per [[proxy.rules]]
// waiting_room (and sale), shared by every proxy instance through Redis,
// that lets clients through at admit_per_second, never more at once than
// max_active nor than the sale's units left plus no_show_margin, in the
// order they arrived (docs/waiting-room.md).
//
// Where the work is: the line (place counter, serving counter, who is
// admitted) lives in Redis, in one hash slot per room (lua/room_*.lua).
// A client's place or admission travels in a signed ticket (ticket.go), so
// a poll costs no Redis call: this instance answers it from the line as its
// last step saw it, and records that the holder polled. Every instance
// steps each room it serves every Options.Tick (room_tick.lua): that step
// carries the polls it saw, moves the line, and reads back the serving
// counter. Redis is asked on a request only when a client arrives (or
// comes back) without a usable ticket, when the line has reached its place
// (its admission is fetched once), and before a purchase of an admitted
// client (its admission must not be spent yet).
//
// Units left come from the sale's stock keys (Options.Stock, read at most
// every Options.StockTTL by the step, never on the request path) and the
// stock-event channel, to which the Manager listens through the proxy's one
// subscription (it is a soldout.SoldOutListener): "sold_out" stops
// admissions and is told to every poller at once; news about the sale
// makes the next step read the stock again.
package room

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/backoff"
	"github.com/seckill/seckill/internal/reservation"
	isoldout "github.com/seckill/seckill/internal/soldout"
	"github.com/seckill/seckill/lua"
	"github.com/seckill/seckill/proxy/internal/route"
	"github.com/seckill/seckill/proxy/internal/token"
)

// Stock reads a sale as Redis holds it (reservation.Store.Sale).
type Stock interface {
	Sale(ctx context.Context, activityID int64) (reservation.Sale, bool, error)
}

// Event is one admission handed to a client (Options.Trace).
type Event struct {
	Room     string
	Identity string
	Place    int64
	// Arrival and Granted are Redis times (ms): when the client got its
	// place, and when the line admitted it.
	Arrival, Granted int64
}

// Options configure a Manager.
type Options struct {
	Redis     redis.UniversalClient
	KeyPrefix string
	Stock     Stock // nil: no stock cap (max_active alone)
	Metrics   *Metrics
	Log       *slog.Logger
	// Tick is how often this instance steps each room (default 100 ms);
	// StockTTL how old its read of a sale's units may be (default 250 ms).
	Tick, StockTTL time.Duration
	// Trace, when set, hears every admission handed out; for tests.
	Trace func(Event)
}

// Redis call bounds. A step walks up to maxSteps places in one script
// call, far more than a limiter decision, and runs off the request path;
// an arrival waits for enterTimeout at most, then the room's
// on_redis_error applies.
const (
	tickTimeout  = 500 * time.Millisecond
	enterTimeout = 250 * time.Millisecond
	maxSteps     = 2000
	// touchChunk bounds the polls one step call carries.
	touchChunk = 4096
	// keyKeep: a room's keys expire this long after its last write, so a
	// finished sale's line does not stay in Redis for ever.
	keyKeep = 24 * time.Hour
	// idleAfter: a room no request asked about for this long is not
	// stepped by this instance (the instances that serve it step it);
	// forgetAfter: it is dropped from memory (its line stays in Redis).
	idleAfter   = time.Minute
	forgetAfter = 10 * time.Minute
	// maxKnown bounds the identity -> place memory of a room (the answer
	// to a client that drops its ticket on every try); past it, it starts
	// over (such clients then cost one Redis call each, once).
	maxKnown = 200_000
)

// Mode is what a room does while Redis cannot be asked.
type Mode uint8

// on_redis_error of a room.
const (
	ModeLocal  Mode = iota // the line freezes: waiters keep their places, newcomers get 503
	ModeOpen               // requests pass to the rule's windows
	ModeClosed             // 503 but to admitted clients
)

func parseMode(s string) Mode {
	switch s {
	case "open":
		return ModeOpen
	case "closed":
		return ModeClosed
	}
	return ModeLocal
}

// ruleRoom is a rule's waiting_room as compiled.
type ruleRoom struct {
	rule    string
	match   route.Match
	cfg     conf.WaitingRoom
	keys    *Keyring
	mode    Mode
	opensAt time.Time
}

// Manager holds the rooms of one proxy instance.
type Manager struct {
	o     Options
	rules atomic.Pointer[[]*ruleRoom]
	mu    sync.Mutex
	rooms map[string]*Room
}

// New compiles the waiting rooms of rules; nil when no rule has one.
func New(rules []conf.Rule, o Options) (*Manager, error) {
	if o.Tick <= 0 {
		o.Tick = 100 * time.Millisecond
	}
	if o.StockTTL <= 0 {
		o.StockTTL = 250 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{o: o, rooms: map[string]*Room{}}
	if err := m.SetRules(rules); err != nil {
		return nil, err
	}
	return m, nil
}

// SetRules compiles the rooms of rules and swaps them in (SIGHUP). A
// rule's key file is read again: a new key signs from now on, and the one
// it replaces is still accepted for key_grace. On error nothing changes.
func (m *Manager) SetRules(rules []conf.Rule) error {
	old := map[string]*ruleRoom{}
	if p := m.rules.Load(); p != nil {
		for _, rr := range *p {
			old[rr.rule] = rr
		}
	}
	var out []*ruleRoom
	for i, r := range rules {
		if r.WaitingRoom == nil {
			continue
		}
		w := *r.WaitingRoom
		var kr *Keyring
		var err error
		if prev, ok := old[r.Name]; ok {
			// Rotation mutates the running keyring: done only once every
			// rule compiled (below), so a failed reload leaves it alone.
			kr = prev.keys
			_, err = readKey(w.KeyFile)
		} else {
			kr, err = LoadKeyring(w.KeyFile)
		}
		if err != nil {
			return fmt.Errorf("proxy.rules[%d].waiting_room.key_file: %w", i, err)
		}
		out = append(out, &ruleRoom{rule: r.Name, match: route.New(r.Methods, r.PathPrefix), cfg: w, keys: kr,
			mode: parseMode(w.OnRedisError), opensAt: w.OpensAtTime()})
	}
	now := time.Now()
	for _, rr := range out {
		if _, ok := old[rr.rule]; ok {
			if err := rr.keys.Rotate(rr.cfg.KeyFile, rr.cfg.KeyGrace.Duration, now); err != nil {
				return fmt.Errorf("rule %s: waiting_room.key_file: %w", rr.rule, err)
			}
		}
	}
	m.rules.Store(&out)
	m.mu.Lock()
	for _, rm := range m.rooms {
		rm.rr.Store(nil)
		for _, rr := range out {
			if rr.rule == rm.rule {
				rm.rr.Store(rr)
			}
		}
	}
	m.mu.Unlock()
	return nil
}

// Any reports whether some rule has a room.
func (m *Manager) Any() bool {
	p := m.rules.Load()
	return p != nil && len(*p) > 0
}

// Room is one line: a rule's room for one sale.
type Room struct {
	Name string
	rule string
	hash uint64
	act  int64
	keys []string
	rr   atomic.Pointer[ruleRoom] // nil: the rule lost its room (reload)
	st   atomic.Pointer[state]
	m    *Manager

	degraded atomic.Bool
	lastUse  atomic.Int64 // unix ms of the last request
	// bo and retryAt pace the steps while Redis fails (Step's goroutine only).
	bo      *backoff.Backoff
	retryAt time.Time

	mu    sync.Mutex
	seen  map[string]struct{}  // identities that polled since the last step
	known map[string]placeInfo // identity -> its place, for clients without their ticket

	// Stock, as the step last read it (units -1: no sale known).
	stockMu      sync.Mutex
	units        int64
	startMs      int64
	stockAt      time.Time
	stockDirty   bool
	soldOutEvent bool
	stockSeq     uint64 // stock events heard: a read that overlaps one is not kept
	// boughtLast is meta's bought as the last step saw it; boughtBase its
	// value before the kept stock read (room_tick.lua).
	boughtLast, boughtBase int64
	soldOut                atomic.Bool
}

type placeInfo struct{ place, arrival int64 }

// state is the line as this instance's last step saw it.
type state struct {
	served, next, active, pre int64
	opened                    bool
	at                        time.Time
	rate                      float64 // places decided per second, measured
}

// match returns the rule room and sale of a request, if any.
func (m *Manager) match(method, path []byte) (*ruleRoom, int64) {
	p := m.rules.Load()
	if p == nil {
		return nil, 0
	}
	for _, rr := range *p {
		if !rr.match.Applies(method, path) {
			continue
		}
		if rr.cfg.ActivityID > 0 {
			return rr, rr.cfg.ActivityID
		}
		if id, ok := ActivityFromPath(path); ok {
			return rr, id
		}
		return nil, 0
	}
	return nil, 0
}

var activitiesPrefix = []byte("/api/v1/activities/")

// ActivityFromPath is the sale of /api/v1/activities/{id}[/…].
func ActivityFromPath(path []byte) (int64, bool) {
	if len(path) <= len(activitiesPrefix) || string(path[:len(activitiesPrefix)]) != string(activitiesPrefix) {
		return 0, false
	}
	rest := path[len(activitiesPrefix):]
	for i, c := range rest {
		if c == '/' {
			rest = rest[:i]
			break
		}
	}
	return isoldout.ParseID(rest)
}

func (m *Manager) room(rr *ruleRoom, act int64) *Room {
	name := rr.rule
	if rr.cfg.ActivityID == 0 {
		name += "/" + strconv.FormatInt(act, 10)
	}
	m.mu.Lock()
	r, ok := m.rooms[name]
	m.mu.Unlock()
	if ok {
		return r
	}
	// The sale is read before the room serves its first request: its
	// start is the opening when opens_at is not set (a first arrival must
	// not open the room early). A room per sale named in the path is made
	// only for a sale Redis holds: made-up ids must not make rooms (memory
	// here, keys in Redis); their requests go on to the backend, which
	// answers 404. A failed read makes the room (its own calls then meet
	// on_redis_error).
	units, startMs, read := int64(-1), int64(0), time.Time{}
	if m.o.Stock != nil {
		ctx, cancel := context.WithTimeout(context.Background(), enterTimeout)
		sale, found, err := m.o.Stock.Sale(ctx, act)
		cancel()
		switch {
		case err == nil && !found && rr.cfg.ActivityID == 0:
			return nil
		case err == nil && found:
			units, startMs, read = max(sale.Total-sale.Sold-sale.Pending, 0), sale.Start.UnixMilli(), time.Now()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if made, ok := m.rooms[name]; ok { // made by a request racing this one
		return made
	}
	base := m.o.KeyPrefix + "{room:" + rr.rule + ":" + strconv.FormatInt(act, 10) + "}:"
	r = &Room{Name: name, rule: rr.rule, hash: RoomHash(name), act: act, m: m, units: units, startMs: startMs, stockAt: read,
		stockDirty: read.IsZero(), boughtBase: -1,
		keys: []string{base + "meta", base + "ids", base + "places", base + "seen", base + "pre", base + "active", base + "admitted"},
		seen: map[string]struct{}{}, known: map[string]placeInfo{}, bo: backoff.New(m.o.Tick, 2*time.Second)}
	r.soldOut.Store(units == 0)
	r.rr.Store(rr)
	m.rooms[name] = r
	return r
}

// Answer is what a room decided about a request.
type Answer uint8

// Answers.
const (
	Pass        Answer = iota // no room: on to the windows as if there were none
	Admitted                  // admitted: on to the windows and the upstream
	Waiting                   // in line: answer the position
	PreQueue                  // before the opening: answer that it waits for it
	SoldOut                   // no unit left: 409 sold_out
	Unavailable               // Redis failed and the room refuses: 503
)

var answerNames = [...]string{"open", "admitted", "waiting", "pre_queue", "sold_out", "unavailable"}

// Request is what a room needs of a request.
type Request struct {
	Method, Path []byte
	// Identity: "u:<user>" (verified) or "a:<client key>".
	Identity string
	// Ticket is the Room-Ticket header; else the room's cookie is looked
	// for in Cookies (the Cookie header lines).
	Ticket   []byte
	Cookies  [][]byte
	Purchase bool
	// MayReplay, for a purchase of a sold-out sale, reports whether it may
	// be the keyed replay of an accepted order (it then goes on to the
	// backend, which answers it with its order).
	MayReplay func() bool
	Now       time.Time
}

// Result is a room's decision.
type Result struct {
	Answer   Answer
	Room     *Room // nil: no room
	Identity string
	// Place is the client's place (0: none or the pre-queue), Ahead the
	// places before it not decided yet, ETA the wait at the measured pace.
	Place, Ahead int64
	ETA          time.Duration
	RetryAfter   int64 // seconds
	// Ticket, when not empty, is the client's ticket, valid MaxAge s; Kept:
	// the one it came with, still fresh (its cookie needs no renewal).
	Ticket string
	MaxAge int64
	Kept   bool
	// Cookie is the room's cookie name; Secure its Secure attribute.
	Cookie string
	Secure bool
	// Purchase: a purchase of an admitted client (Finish it on 202/409).
	Purchase bool
	replay   bool // a keyed purchase let through to the backend while sold out
}

// Applies reports whether a request falls to a waiting room (the caller
// then works out its identity for Enter).
func (m *Manager) Applies(method, path []byte) bool {
	rr, _ := m.match(method, path)
	return rr != nil
}

// Enter decides a request of a rule with a waiting room.
func (m *Manager) Enter(q Request) Result {
	rr, act := m.match(q.Method, q.Path)
	if rr == nil {
		return Result{}
	}
	rm := m.room(rr, act)
	if rm == nil {
		return Result{}
	}
	rm.lastUse.Store(q.Now.UnixMilli())
	if len(q.Ticket) == 0 {
		name := []byte(rr.cfg.Cookie)
		for _, line := range q.Cookies {
			if v := token.CookieValue(line, name); len(v) > 0 {
				q.Ticket = v
				break
			}
		}
	}
	res := rm.enter(rr, q)
	res.Room, res.Identity, res.Cookie, res.Secure = rm, q.Identity, rr.cfg.Cookie, rr.cfg.CookieSecure
	res.Purchase = q.Purchase && res.Answer == Admitted && !res.replay
	if mt := m.o.Metrics; mt != nil {
		mt.Answers.WithLabelValues(rm.Name, answerNames[res.Answer]).Inc()
	}
	return res
}

func (rm *Room) bad(reason string) {
	if mt := rm.m.o.Metrics; mt != nil {
		mt.Bad.WithLabelValues(rm.Name, reason).Inc()
	}
}

func (rm *Room) call(script string, err error) {
	if mt := rm.m.o.Metrics; mt != nil {
		res := "ok"
		if err != nil {
			res = "error"
		}
		mt.Calls.WithLabelValues(rm.Name, script, res).Inc()
	}
}

func (rm *Room) enter(rr *ruleRoom, q Request) Result {
	idh := IdentityHash(q.Identity)
	var t Ticket
	valid := false
	if len(q.Ticket) > 0 {
		var err error
		t, err = rr.keys.Parse(q.Ticket, q.Now)
		switch {
		case err != nil:
			rm.bad(Reason(err))
		case t.Room != rm.hash:
			rm.bad(ReasonOtherRoom)
		case t.Identity != idh:
			rm.bad(ReasonOtherIdentity)
		default:
			valid = true
		}
	}
	if valid && t.Kind == KindAdmission {
		if !q.Purchase {
			return Result{Answer: Admitted}
		}
		// A purchase spends the admission: it must still be in force in
		// Redis (not finished by an earlier purchase, not expired).
		ctx, cancel := context.WithTimeout(context.Background(), enterTimeout)
		_, err := rm.m.o.Redis.ZScore(ctx, rm.keys[5], q.Identity).Result()
		cancel()
		rm.call("check", nilIfMissing(err))
		switch {
		case err == nil:
			return Result{Answer: Admitted}
		case err != redis.Nil:
			// Its signature vouches for it; whether it was spent cannot be
			// known now. Every mode lets an admitted client through.
			return Result{Answer: Admitted}
		}
		// Spent (finished, expired) or never given: a replay. Back to the
		// line: the identity's place if it still has one, else the back.
		rm.bad(ReasonStale)
		valid = false
	}
	st := rm.st.Load()
	if rm.degraded.Load() {
		return rm.failed(rr, st, t, valid, q.Now, idh)
	}
	if rm.soldOut.Load() {
		if q.Purchase && q.MayReplay != nil && q.MayReplay() {
			// On to the backend, but not an admission: nothing to finish.
			return Result{Answer: Admitted, replay: true}
		}
		res := Result{Answer: SoldOut}
		if valid && t.Kind == KindPlace {
			res.Place = t.Place
		} else if pi, ok := rm.lookup(q.Identity); ok {
			res.Place = pi.place
		}
		if st != nil && res.Place > st.served {
			res.Ahead = res.Place - st.served - 1
		}
		return res
	}
	if st != nil {
		pi, ok := placeInfo{}, false
		if valid && t.Kind == KindPlace {
			pi, ok = placeInfo{t.Place, t.Arrival}, true
		} else if !valid {
			pi, ok = rm.lookup(q.Identity)
		}
		switch {
		case ok && pi.place > st.served:
			rm.touch(q.Identity)
			var held *heldTicket
			if valid {
				held = &heldTicket{q.Ticket, t.Expires}
			}
			return rm.waiting(rr, st, pi, q.Now, idh, held)
		case ok && pi.place == 0 && !st.opened:
			rm.touch(q.Identity)
			return rm.preQueue(rr, q.Now, idh)
		}
	}
	return rm.arrive(rr, q, t, valid, idh)
}

func nilIfMissing(err error) error {
	if err == redis.Nil {
		return nil
	}
	return err
}

// arrive asks Redis for the client's place or admission.
func (rm *Room) arrive(rr *ruleRoom, q Request, t Ticket, valid bool, idh uint64) Result {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	score := float64(binary.LittleEndian.Uint64(rnd[:])>>11) / (1 << 53)
	ctx, cancel := context.WithTimeout(context.Background(), enterTimeout)
	v, err := lua.RoomEnter.Run(ctx, rm.m.o.Redis, rm.keys, q.Identity, rm.opensMs(rr), score, keyKeep.Milliseconds()).Slice()
	cancel()
	rm.call("enter", err)
	if err != nil || len(v) < 6 {
		// This request is decided by on_redis_error; the room as a whole
		// turns degraded only when its step fails (one slow call under a
		// burst of arrivals is not a Redis failure).
		rm.m.o.Log.Debug("waiting room: enter failed", "room", rm.Name, "err", err)
		return rm.failed(rr, rm.st.Load(), t, valid, q.Now, idh)
	}
	kind, _ := v[0].(string)
	place, arrival, deadline, served := num(v[1]), num(v[2]), num(v[3]), num(v[4])
	if valid && t.Kind == KindPlace && t.Place > 0 && t.Place != place {
		rm.bad(ReasonStale)
	}
	switch kind {
	case "A":
		granted := deadline - rr.cfg.Session.Duration.Milliseconds()
		if mt := rm.m.o.Metrics; mt != nil && arrival > 0 {
			mt.InLine.WithLabelValues(rm.Name).Observe(float64(max(granted-arrival, 0)) / 1000)
		}
		if tr := rm.m.o.Trace; tr != nil {
			tr(Event{Room: rm.Name, Identity: q.Identity, Place: place, Arrival: arrival, Granted: granted})
		}
		tk := rr.keys.Sign(Ticket{Kind: KindAdmission, Room: rm.hash, Identity: idh, Place: place, Arrival: arrival, Expires: deadline})
		return Result{Answer: Admitted, Place: place, Ticket: tk, MaxAge: max((deadline-q.Now.UnixMilli())/1000, 1)}
	case "P":
		rm.remember(q.Identity, placeInfo{})
		return rm.preQueue(rr, q.Now, idh)
	}
	pi := placeInfo{place, arrival}
	rm.remember(q.Identity, pi)
	st := rm.st.Load()
	if st == nil {
		// Before this instance's first step: the line as this call saw
		// it, so the next polls are answered without Redis too.
		st = &state{served: served, next: place, opened: true, at: q.Now}
		rm.st.CompareAndSwap(nil, st)
	} else if st.served < served {
		st = &state{served: served, opened: true}
	}
	return rm.waiting(rr, st, pi, q.Now, idh, nil)
}

// waiting answers a client in line at pi.
func (rm *Room) waiting(rr *ruleRoom, st *state, pi placeInfo, now time.Time, idh uint64, held *heldTicket) Result {
	ahead := max(pi.place-st.served-1, 0)
	rate := st.rate
	if rate <= 0 {
		rate = rr.cfg.AdmitPerSecond
	}
	eta := time.Duration(float64(ahead+1) / rate * float64(time.Second))
	poll := int64(rr.cfg.PollInterval.Duration / time.Second)
	retry := poll
	// Near the front (within two polls of its turn): every second, so the
	// admission and a sell-out are learnt within a second.
	if eta <= 2*rr.cfg.PollInterval.Duration {
		retry = 1
	}
	ttl := rr.cfg.PlaceTTL.Duration
	res := Result{Answer: Waiting, Place: pi.place, Ahead: ahead, ETA: eta, RetryAfter: retry, MaxAge: int64(ttl / time.Second)}
	// The ticket's expiry follows the holder's polls, so a ticket outlives
	// its place by place_ttl at most. One with more than half of it left
	// is handed back as it came (a poll then costs no signature and sets
	// no cookie); polls come at least every place_ttl/3, so it is renewed
	// before it expires.
	if held != nil && held.expires-now.UnixMilli() > ttl.Milliseconds()/2 {
		res.Ticket, res.Kept = string(held.raw), true
		return res
	}
	res.Ticket = rr.keys.Sign(Ticket{Kind: KindPlace, Room: rm.hash, Identity: idh, Place: pi.place,
		Arrival: pi.arrival, Expires: now.Add(ttl).UnixMilli()})
	return res
}

// heldTicket is the valid place ticket a poll came with.
type heldTicket struct {
	raw     []byte
	expires int64
}

func (rm *Room) preQueue(rr *ruleRoom, now time.Time, idh uint64) Result {
	ttl := rr.cfg.PlaceTTL.Duration
	tk := rr.keys.Sign(Ticket{Kind: KindPlace, Room: rm.hash, Identity: idh, Expires: now.Add(ttl).UnixMilli()})
	res := Result{Answer: PreQueue, RetryAfter: int64(rr.cfg.PollInterval.Duration / time.Second), Ticket: tk, MaxAge: int64(ttl / time.Second)}
	if o := rm.opensMs(rr); o > 0 {
		res.ETA = time.Duration(max(o-now.UnixMilli(), 0)) * time.Millisecond
		if res.ETA < rr.cfg.PollInterval.Duration {
			res.RetryAfter = max(int64(math.Ceil(res.ETA.Seconds())), 1)
		}
	}
	return res
}

// failed decides while Redis cannot be asked, by the room's on_redis_error.
func (rm *Room) failed(rr *ruleRoom, st *state, t Ticket, valid bool, now time.Time, idh uint64) Result {
	switch rr.mode {
	case ModeOpen:
		return Result{Answer: Pass}
	case ModeLocal:
		if valid && t.Kind == KindPlace && st != nil && t.Place > 0 {
			// The line is frozen where it was last seen: the place stays.
			return rm.waiting(rr, st, placeInfo{t.Place, t.Arrival}, now, idh, nil)
		}
	}
	return Result{Answer: Unavailable, RetryAfter: 1}
}

func (rm *Room) touch(id string) {
	rm.mu.Lock()
	if len(rm.seen) < maxKnown {
		rm.seen[id] = struct{}{}
	}
	rm.mu.Unlock()
}

func (rm *Room) lookup(id string) (placeInfo, bool) {
	rm.mu.Lock()
	pi, ok := rm.known[id]
	rm.mu.Unlock()
	return pi, ok
}

func (rm *Room) remember(id string, pi placeInfo) {
	rm.mu.Lock()
	if len(rm.known) >= maxKnown {
		clear(rm.known)
	}
	rm.known[id] = pi
	rm.mu.Unlock()
}

func (rm *Room) opensMs(rr *ruleRoom) int64 {
	if !rr.opensAt.IsZero() {
		return rr.opensAt.UnixMilli()
	}
	rm.stockMu.Lock()
	defer rm.stockMu.Unlock()
	return rm.startMs
}

// Finish ends an admitted client's admission: its purchase was answered
// 202 (bought: a unit left the stock) or 409. Its slot goes to the next in
// line at the next step.
func (m *Manager) Finish(rm *Room, identity string, bought bool) {
	ctx, cancel := context.WithTimeout(context.Background(), enterTimeout)
	_, err := m.o.Redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, rm.keys[5], identity)
		p.HDel(ctx, rm.keys[6], identity)
		if bought {
			p.HIncrBy(ctx, rm.keys[0], "bought", 1)
		}
		return nil
	})
	cancel()
	rm.call("finish", err)
	if err == nil && m.o.Metrics != nil {
		m.o.Metrics.Finished.WithLabelValues(rm.Name).Inc()
	}
	rm.mu.Lock()
	delete(rm.known, identity)
	rm.mu.Unlock()
}

func num(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}
