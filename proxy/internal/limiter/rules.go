package limiter

import (
	"fmt"
	"hash/maphash"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/proxy/internal/route"
)

// Mode is what a rule does while Redis cannot be asked.
type Mode uint8

// The on_redis_error modes.
const (
	// ModeLocal keeps limiting in-process with the limit divided by the number
	// of live proxy instances (last known), and flags the decision degraded.
	ModeLocal Mode = iota
	// ModeOpen admits.
	ModeOpen
	// ModeClosed refuses (503).
	ModeClosed
)

// ParseMode parses an on_redis_error value; "" is ModeLocal.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "local":
		return ModeLocal, nil
	case "open":
		return ModeOpen, nil
	case "closed":
		return ModeClosed, nil
	}
	return 0, fmt.Errorf("on_redis_error %q: want local, open or closed", s)
}

// Kind tells a per-client window from a global one.
type Kind uint8

// Window kinds.
const (
	PerIP Kind = iota // per client: keyed by address, header or cookie
	Global
)

// Source is what a per-client window counts by.
type Source uint8

// Key sources ([[proxy.rules]] per_ip.key).
const (
	FromAddress Source = iota
	FromHeader
	FromCookie
)

// Window is one sliding window of a rule.
type Window struct {
	Kind   Kind
	Source Source
	// Name is the header or cookie name of a keyed window.
	Name  []byte
	Limit int
	// Length is the window; Lease how long speculatively leased slots may
	// be spent locally.
	Length, Lease time.Duration
	// Policy is the name in RateLimit-Policy and violated-policies:
	// "<rule>-ip" (by address), "<rule>-key" (by header or cookie) or
	// "<rule>-global".
	Policy string
	// key: the Redis key of a global window; for a per-client window the
	// part after the client's hash tag (see Key).
	key string
	// item and prefix: see Policy.
	item, prefix string

	admitted, refused counterRef
}

// KindName is the window's kind as metrics label it: address, header,
// cookie or global.
func (w *Window) KindName() string {
	if w.Kind == Global {
		return "global"
	}
	return [...]string{"address", "header", "cookie"}[w.Source]
}

// Rule is a compiled [[proxy.rules]] entry.
type Rule struct {
	Name    string
	match   route.Match
	Windows []*Window // per-client first
	Mode    Mode
	Shadow  bool

	global  *state // state of the global window, if any
	clients *table // per-client states of the per-client window, if any

	admitted, limited, shadowed, degraded counterRef
}

// Rules is an immutable compiled rule set; a reload builds a new one.
type Rules struct {
	list      []*Rule
	keyPrefix string
}

// Len is the number of rules.
func (rs *Rules) Len() int { return len(rs.list) }

// Redis key layout (cluster-ready: every key one call touches shares one
// hash tag, and per-client windows spread over the slots by client):
//
//	<prefix>{rl:<client>}:<rule>   per-client window; <client> is "a:<address>"
//	                               or "h:"/"c:" + a hash of header/cookie name
//	                               and value; every per-client window of one
//	                               client key shares the tag, so one call
//	                               checks them together
//	<prefix>{rl:g:<rule>}          global window of a rule: its own slot
//	<prefix>{rl}:instances         live proxy instances (heartbeat)
const (
	tagOpen   = "{rl:"
	globalTag = "{rl:g:"
)

// Compile validates and compiles rules; keyPrefix is [redis] key_prefix.
func Compile(rules []conf.Rule, keyPrefix string, m *Metrics) (*Rules, error) {
	rs := &Rules{keyPrefix: keyPrefix}
	seen := map[string]bool{}
	for i, cr := range rules {
		if cr.Name == "" || seen[cr.Name] {
			return nil, fmt.Errorf("rule %d: empty or duplicate name %q", i, cr.Name)
		}
		seen[cr.Name] = true
		mode, err := ParseMode(cr.OnRedisError)
		if err != nil {
			return nil, fmt.Errorf("rule %s: %w", cr.Name, err)
		}
		r := &Rule{Name: cr.Name, match: route.New(cr.Methods, cr.PathPrefix), Mode: mode, Shadow: cr.Shadow}
		add := func(k Kind, w *conf.Window) error {
			if w == nil {
				return nil
			}
			policy := "global"
			if k == PerIP {
				policy = "ip"
			}
			if w.Limit < 1 || w.Window.Duration < time.Millisecond {
				return fmt.Errorf("rule %s: %s window needs limit >= 1 and window >= 1ms", cr.Name, policy)
			}
			win := &Window{Kind: k, Limit: w.Limit, Length: w.Window.Duration, Lease: min(w.Window.Duration/2, time.Second)}
			switch {
			case k == Global:
				if w.Key != "" {
					return fmt.Errorf("rule %s: a global window has no key", cr.Name)
				}
				win.key = keyPrefix + globalTag + cr.Name + "}"
			default:
				src, name, err := conf.ParseKey(w.Key)
				if err != nil {
					return fmt.Errorf("rule %s: per_ip.key: %w", cr.Name, err)
				}
				switch src {
				case conf.KeyHeader:
					win.Source, win.Name, policy = FromHeader, []byte(name), "key"
				case conf.KeyCookie:
					win.Source, win.Name, policy = FromCookie, []byte(name), "key"
				}
				win.key = "}:" + cr.Name
			}
			win.Policy = cr.Name + "-" + policy
			quoted := `"` + win.Policy + `"`
			secs := max(1, int64((w.Window.Duration+time.Second-1)/time.Second))
			win.item = quoted + ";q=" + strconv.Itoa(w.Limit) + ";w=" + strconv.FormatInt(secs, 10)
			win.prefix = quoted + ";r="
			if m != nil {
				win.admitted = counterRef{m.windows.WithLabelValues(cr.Name, win.KindName(), "admitted")}
				win.refused = counterRef{m.windows.WithLabelValues(cr.Name, win.KindName(), "refused")}
			}
			r.Windows = append(r.Windows, win)
			return nil
		}
		if err := add(PerIP, cr.PerIP); err != nil {
			return nil, err
		}
		if err := add(Global, cr.Global); err != nil {
			return nil, err
		}
		if len(r.Windows) == 0 {
			return nil, fmt.Errorf("rule %s: needs per_ip, global or both", cr.Name)
		}
		for _, w := range r.Windows {
			if w.Kind == Global {
				r.global = newState()
			} else {
				r.clients = newTable()
			}
		}
		if m != nil {
			r.admitted = counterRef{m.decisions.WithLabelValues(cr.Name, "admitted")}
			r.limited = counterRef{m.decisions.WithLabelValues(cr.Name, "limited")}
			r.shadowed = counterRef{m.decisions.WithLabelValues(cr.Name, "shadow")}
			r.degraded = counterRef{m.decisions.WithLabelValues(cr.Name, "degraded")}
		}
		rs.list = append(rs.list, r)
	}
	return rs, nil
}

// Key is the Redis key of window w for the client key (ignored for a global
// window).
func (rs *Rules) Key(w *Window, client []byte) string {
	if w.Kind == Global {
		return w.key
	}
	return rs.keyPrefix + tagOpen + string(client) + w.key
}

// Match appends to dst every rule that applies to the method and path.
func (rs *Rules) Match(dst []*Rule, method, path []byte) []*Rule {
	for _, r := range rs.list {
		if r.match.Applies(method, path) {
			dst = append(dst, r)
		}
	}
	return dst
}

// table holds the per-client states of one rule, sharded to spread locks,
// at most about maxStates of them (Limiter.get).
type table struct {
	seed   maphash.Seed
	shards [tableShards]shard
	n      atomic.Int64 // states held

	mu      sync.Mutex
	orphans []orphan // give-backs of evicted states, for the sweeper
}

const tableShards = 64

type shard struct {
	mu sync.RWMutex
	m  map[string]*state
}

// orphan: slots of an evicted state's client still to be removed from its
// window's log.
type orphan struct {
	client string
	back   []span
}

// evictSample: states looked at to find the least recently used one that no
// request uses (an approximate LRU, as Redis's).
const evictSample = 16

func newTable() *table {
	t := &table{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = map[string]*state{}
	}
	return t
}

// get returns the client's state, made if missing, and counts the caller as
// its user until release; a shard holding its share of maxStates (0: no
// bound) first evicts a state nobody uses (evict). out is the limiter's
// count of leased slots.
func (t *table) get(client []byte, now time.Time, maxStates int, out *atomic.Int64, evicted counterRef) *state {
	sh := &t.shards[maphash.Bytes(t.seed, client)&(tableShards-1)]
	// users and lastUse change while the shard is locked (read or write),
	// so the sweeper and evict, which hold the write lock, never drop a
	// state in use.
	sh.mu.RLock()
	st := sh.m[string(client)]
	if st != nil {
		st.users.Add(1)
		st.lastUse.Store(mono(now))
	}
	sh.mu.RUnlock()
	if st != nil {
		return st
	}
	sh.mu.Lock()
	if st = sh.m[string(client)]; st == nil {
		if per := (maxStates + tableShards - 1) / tableShards; maxStates > 0 && len(sh.m) >= per {
			if t.evict(sh, out) {
				evicted.inc()
			}
		}
		st = newState()
		sh.m[string(client)] = st
		t.n.Add(1)
	}
	st.users.Add(1)
	st.lastUse.Store(mono(now))
	sh.mu.Unlock()
	return st
}

// release ends a use begun by get.
func release(st *state) { st.users.Add(-1) }

// lookup returns the client's state if there is one (tests).
func (t *table) lookup(client []byte) *state {
	sh := &t.shards[maphash.Bytes(t.seed, client)&(tableShards-1)]
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	return sh.m[string(client)]
}

// evict drops the least recently used of a sample of sh's states that no
// request uses (none holds a slot of it or waits on it then). Its leased and
// unspent slots become orphans, given back by the sweeper: the client's
// window stays exact, Redis holds its log. False when every state of the
// shard is in use: the shard then holds one more, so the table exceeds its
// bound by at most the requests in flight. sh.mu held.
func (t *table) evict(sh *shard, out *atomic.Int64) bool {
	var victim string
	var vs *state
	seen := 0
	for k, st := range sh.m {
		if st.users.Load() == 0 && (vs == nil || st.lastUse.Load() < vs.lastUse.Load()) {
			victim, vs = k, st
		}
		if seen++; seen >= evictSample && vs != nil {
			break
		}
	}
	if vs == nil {
		return false
	}
	vs.mu.Lock()
	vs.expireAll(math.MaxInt64, out) // every leased slot goes back
	back := vs.back
	vs.back = nil
	vs.mu.Unlock()
	delete(sh.m, victim)
	t.n.Add(-1)
	if len(back) > 0 {
		t.mu.Lock()
		t.orphans = append(t.orphans, orphan{victim, back})
		t.mu.Unlock()
	}
	return true
}

// takeOrphans returns the orphans and forgets them.
func (t *table) takeOrphans() []orphan {
	t.mu.Lock()
	defer t.mu.Unlock()
	o := t.orphans
	t.orphans = nil
	return o
}

// keepOrphan keeps give-backs that failed for the next sweep.
func (t *table) keepOrphan(o orphan) {
	t.mu.Lock()
	t.orphans = append(t.orphans, o)
	t.mu.Unlock()
}

// sweep drops states idle for longer than idle that hold nothing: no user,
// no slots, nothing to give back, no refill in flight, no negative answer.
func (t *table) sweep(now time.Time, idle time.Duration) (dropped int) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, st := range sh.m {
			st.mu.Lock()
			m := mono(now)
			old := m-st.lastUse.Load() > int64(idle) && m > st.deniedUntil.Load() && st.refill == nil &&
				len(st.batches) == 0 && len(st.back) == 0 && st.users.Load() == 0
			st.mu.Unlock()
			if old {
				delete(sh.m, k)
				dropped++
			}
		}
		sh.mu.Unlock()
	}
	t.n.Add(-int64(dropped))
	return dropped
}

// each calls fn for every state of the table (fn must not block).
func (t *table) each(fn func(client string, st *state)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		for k, st := range sh.m {
			fn(k, st)
		}
		sh.mu.RUnlock()
	}
}
