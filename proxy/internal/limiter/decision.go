package limiter

import "time"

// Policy is the state of one window for the RateLimit headers.
type Policy struct {
	Name      string
	Quota     int
	Window    time.Duration
	Remaining int
	Reset     time.Duration
	// Item is this policy's RateLimit-Policy list member, `"name";q=Quota;w=W`
	// with W the window in whole seconds (rounded up, at least 1), and Prefix
	// the start of its RateLimit member, `"name";r=`; both precomputed.
	Item, Prefix string
}

// Outcome of a decision.
type Outcome uint8

// Outcomes.
const (
	Admit       Outcome = iota
	Limited             // 429
	Unavailable         // 503: a closed rule could not ask Redis
	Shed                // 503: the limiter was too busy to decide in time
)

// Decision is the verdict on one request. Reuse one per request (Reset) to
// avoid allocations.
type Decision struct {
	Outcome    Outcome
	RetryAfter time.Duration
	Violated   []string // policies that refused, for violated-policies
	Rules      []string // rules that refused
	Policies   []Policy // the enforced policies the decision looked at, for RateLimit headers
	Shadow     []string // shadow policies that would have refused
	Degraded   bool     // decided by on_redis_error

	matched []*Rule
	ents    []entry // windows of the pass being decided
	wants   []Want
	gots    []Got
	keys    []byte // client keys of the entries
}

// Reset clears d for reuse.
func (d *Decision) Reset() {
	*d = Decision{Violated: d.Violated[:0], Rules: d.Rules[:0], Policies: d.Policies[:0], Shadow: d.Shadow[:0],
		matched: d.matched[:0], ents: d.ents[:0], wants: d.wants[:0], gots: d.gots[:0], keys: d.keys[:0]}
}

// entry is one window of the request being decided.
type entry struct {
	r   *Rule
	w   *Window
	key []byte // client key (per-client windows)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
