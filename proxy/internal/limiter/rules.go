package limiter

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	"github.com/seckill/seckill/conf"
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
	PerIP Kind = iota
	Global
)

// Window is one sliding window of a rule.
type Window struct {
	Kind   Kind
	Limit  int
	Length time.Duration
	// Policy is the name in RateLimit-Policy and violated-policies:
	// "<rule>-ip" or "<rule>-global".
	Policy string
	// key is the Redis key (global) or key prefix (per-IP, client key follows).
	key string
	// lease is how long leased slots may be spent locally.
	lease time.Duration
	// item and prefix: see Policy.
	item, prefix string
}

// Rule is a compiled [[proxy.rules]] entry.
type Rule struct {
	Name    string
	methods [][]byte // empty: any
	prefix  []byte
	Windows []*Window // per-IP first
	Mode    Mode
	Shadow  bool

	global  *state // state of the global window, if any
	clients *table // per-client states of the per-IP window, if any

	admitted, limited, shadowed, degraded counterRef
}

// Rules is an immutable compiled rule set; a reload builds a new one.
type Rules struct {
	list []*Rule
}

// Len is the number of rules.
func (rs *Rules) Len() int { return len(rs.list) }

// KeyTag is the hash tag every limiter key carries (see lua/ratelimit.lua).
const KeyTag = "{rl}"

// Compile validates and compiles rules; keyPrefix is [redis] key_prefix.
func Compile(rules []conf.Rule, keyPrefix string, m *Metrics) (*Rules, error) {
	rs := &Rules{}
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
		r := &Rule{Name: cr.Name, prefix: []byte(cr.PathPrefix), Mode: mode, Shadow: cr.Shadow}
		for _, meth := range cr.Methods {
			r.methods = append(r.methods, []byte(meth))
		}
		base := keyPrefix + KeyTag + ":w:" + cr.Name + ":"
		add := func(k Kind, w *conf.Window, suffix, policy string) error {
			if w == nil {
				return nil
			}
			if w.Limit < 1 || w.Window.Duration < time.Millisecond {
				return fmt.Errorf("rule %s: %s window needs limit >= 1 and window >= 1ms", cr.Name, policy)
			}
			lease := w.Window.Duration / 2
			if lease > time.Second {
				lease = time.Second
			}
			name := cr.Name + "-" + policy
			quoted := `"` + name + `"`
			secs := max(1, int64((w.Window.Duration+time.Second-1)/time.Second))
			r.Windows = append(r.Windows, &Window{Kind: k, Limit: w.Limit, Length: w.Window.Duration,
				Policy: name, key: base + suffix, lease: lease,
				item:   quoted + ";q=" + strconv.Itoa(w.Limit) + ";w=" + strconv.FormatInt(secs, 10),
				prefix: quoted + ";r="})
			return nil
		}
		if err := add(PerIP, cr.PerIP, "ip:", "ip"); err != nil {
			return nil, err
		}
		if err := add(Global, cr.Global, "g", "global"); err != nil {
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
			r.admitted = counterRef{m.Decisions.With(cr.Name, "admitted")}
			r.limited = counterRef{m.Decisions.With(cr.Name, "limited")}
			r.shadowed = counterRef{m.Decisions.With(cr.Name, "shadow")}
			r.degraded = counterRef{m.Decisions.With(cr.Name, "degraded")}
		}
		rs.list = append(rs.list, r)
	}
	return rs, nil
}

// Match appends to dst every rule that applies to the method and path.
func (rs *Rules) Match(dst []*Rule, method, path []byte) []*Rule {
	for _, r := range rs.list {
		if !bytes.HasPrefix(path, r.prefix) {
			continue
		}
		if len(r.methods) > 0 {
			ok := false
			for _, m := range r.methods {
				if bytes.Equal(m, method) {
					ok = true
					break
				}
			}
			if !ok {
				continue
			}
		}
		dst = append(dst, r)
	}
	return dst
}

// table holds the per-client states of one rule, sharded to spread locks.
type table struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.RWMutex
		m  map[string]*state
	}
}

func newTable() *table {
	t := &table{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = map[string]*state{}
	}
	return t
}

func (t *table) get(client []byte, now time.Time) *state {
	sh := &t.shards[maphash.Bytes(t.seed, client)&63]
	// lastUse is stored while the shard is locked (read or write), so the
	// sweeper, which holds the write lock, never drops a state in use.
	sh.mu.RLock()
	st := sh.m[string(client)]
	if st != nil {
		st.lastUse.Store(mono(now))
	}
	sh.mu.RUnlock()
	if st != nil {
		return st
	}
	sh.mu.Lock()
	if st = sh.m[string(client)]; st == nil {
		st = newState()
		sh.m[string(client)] = st
	}
	st.lastUse.Store(mono(now))
	sh.mu.Unlock()
	return st
}

// sweep drops states idle for longer than idle that hold nothing worth
// keeping, and returns the leased slots they still held.
func (t *table) sweep(now time.Time, idle time.Duration) (dropped int, slots int) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, st := range sh.m {
			st.mu.Lock()
			m := mono(now)
			old := m-st.lastUse.Load() > int64(idle) && m > st.deniedUntil.Load() && st.inflight == nil
			if old {
				slots += st.slots
				st.slots = 0
			}
			st.mu.Unlock()
			if old {
				delete(sh.m, k)
				dropped++
			}
		}
		sh.mu.Unlock()
	}
	return dropped, slots
}
