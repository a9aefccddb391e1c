package limiter

import (
	"fmt"
	"strconv"
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
	// ModeEnvoy is the Envoy rate-limit service's alone
	// (rls_on_redis_error = "envoy"): the call fails UNAVAILABLE and Envoy's
	// failure_mode_deny decides. An HTTP rule has no caller to hand the
	// decision to, so ParseMode refuses it.
	ModeEnvoy
)

var modeNames = [...]string{"local", "open", "closed", "envoy"}

// String is the mode's configuration value.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode parses an HTTP rule's on_redis_error value; "" is ModeLocal.
func ParseMode(s string) (Mode, error) { return parseMode("on_redis_error", s, ModeClosed) }

// ParseRLSMode parses [proxy] rls_on_redis_error, which also takes
// "envoy"; "" is ModeLocal.
func ParseRLSMode(s string) (Mode, error) { return parseMode("rls_on_redis_error", s, ModeEnvoy) }

// parseMode is the one parser of both keys: the modes up to last are
// allowed, and the error names the key and exactly those.
func parseMode(key, s string, last Mode) (Mode, error) {
	if s == "" {
		return ModeLocal, nil
	}
	for m := ModeLocal; m <= last; m++ {
		if modeNames[m] == s {
			return m, nil
		}
	}
	want := ""
	for m := ModeLocal; m <= last; m++ {
		switch {
		case m == last:
			want += " or "
		case m > ModeLocal:
			want += ", "
		}
		want += modeNames[m]
	}
	return 0, fmt.Errorf("%s %q: want %s", key, s, want)
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
	// Length is the window.
	Length time.Duration
	// Policy is the name in RateLimit-Policy and violated-policies:
	// "<rule>-ip" (by address), "<rule>-key" (by header or cookie) or
	// "<rule>-global".
	Policy string
	// pre and key: the Redis key of a global window is key; that of a
	// per-client window pre + client + key (Key).
	pre, key string
	// item and prefix: see Policy.
	item, prefix string

	admitted, refused counterRef

	// The negative cache: until when (mono ns) the window is known full —
	// full for a global window, denied per client for a per-client one.
	full   atomic.Int64
	denied *Denied
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

	admitted, limited, shadowed, degraded, shed counterRef
}

// Rules is an immutable compiled rule set; a reload builds a new one.
type Rules struct{ list []*Rule }

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
			win := &Window{Kind: k, Limit: w.Limit, Length: w.Window.Duration}
			switch {
			case k == Global:
				if w.Key != "" {
					return fmt.Errorf("rule %s: a global window has no key", cr.Name)
				}
				win.key = keyPrefix + "{rl:g:" + cr.Name + "}"
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
				win.pre, win.key, win.denied = keyPrefix+"{rl:", "}:"+cr.Name, NewDenied()
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
		if m != nil {
			r.admitted = counterRef{m.decisions.WithLabelValues(cr.Name, "admitted")}
			r.limited = counterRef{m.decisions.WithLabelValues(cr.Name, "limited")}
			r.shadowed = counterRef{m.decisions.WithLabelValues(cr.Name, "shadow")}
			r.degraded = counterRef{m.decisions.WithLabelValues(cr.Name, "degraded")}
			r.shed = counterRef{m.decisions.WithLabelValues(cr.Name, "shed")}
		}
		rs.list = append(rs.list, r)
	}
	return rs, nil
}

// Key is the store's key of w for the client key (docs/limiter.md has the
// layout): "<prefix>{rl:g:<rule>}" for a global window, else
// "<prefix>{rl:<client>}:<rule>", the client's own hash tag.
func (w *Window) Key(client []byte) string {
	if w.Kind == Global {
		return w.key
	}
	return w.pre + string(client) + w.key
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

// deniedUntil is until when (mono ns) the window of client is known full.
func (w *Window) deniedUntil(client []byte) int64 {
	if w.denied == nil {
		return w.full.Load()
	}
	return w.denied.Until(client)
}

// setDenied records the window of client full until u (mono ns).
func (w *Window) setDenied(client []byte, u, now int64, maxStates int, evicted counterRef) {
	if w.denied == nil {
		w.full.Store(u)
		return
	}
	w.denied.set(client, u, now, maxStates, evicted)
}
