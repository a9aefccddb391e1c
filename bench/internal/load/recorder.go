package load

import (
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seckill/seckill/bench/internal/hist"
	"github.com/seckill/seckill/internal/verify"
)

// Class is the outcome class latencies are reported by.
type Class int

// Outcome classes, in report order.
const (
	Accepted    Class = iota // 202
	SoldOut                  // 409 sold_out
	Limited                  // 429
	ServerError              // 5xx
	Other                    // other 4xx, other 409 codes, connection errors
	numClasses
)

// Classes lists every class in report order.
var Classes = []Class{Accepted, SoldOut, Limited, ServerError, Other}

func (c Class) String() string {
	switch c {
	case Accepted:
		return "202"
	case SoldOut:
		return "409 sold_out"
	case Limited:
		return "429"
	case ServerError:
		return "5xx"
	default:
		return "other"
	}
}

// Classify maps an answer to its class; status 0 is a connection error.
func Classify(status int, code string) Class {
	switch {
	case status == 202:
		return Accepted
	case status == 409 && code == "sold_out":
		return SoldOut
	case status == 429:
		return Limited
	case status >= 500:
		return ServerError
	default:
		return Other
	}
}

// Phase of the scenario.
type Phase int

// Phases in order.
const (
	Warmup Phase = iota
	Rush
	Tail
	numPhases
)

// Phases lists every phase in order.
var Phases = []Phase{Warmup, Rush, Tail}

func (p Phase) String() string {
	switch p {
	case Warmup:
		return "warmup"
	case Rush:
		return "rush"
	default:
		return "tail"
	}
}

// Result is one logical request: its final answer after any retries, with
// the latency from its intended send time.
type Result struct {
	Phase   Phase
	Status  int    // 0: no answer (connection error, timeout)
	Code    string // the answer's code, or the error kind
	Latency time.Duration
	Done    time.Time
	Retries int
	// RetryCauses are the answers that were retried, in order.
	RetryCauses []string
	User        int
	IP          int // index of the source address, -1 when not bound
	OrderID     string
	Key         string
	UserID      string
	Purchase    bool // false for the warm-up's reads
	Replay      bool // the replay of a key answered 202 before (Config.ReplayShare)
}

// MixKey names a status/code pair, e.g. "409 sold_out", "429 purchase-ip".
func MixKey(status int, code string) string {
	s := "error"
	if status > 0 {
		s = strconv.Itoa(status)
	}
	if code == "" {
		return s
	}
	return s + " " + code
}

// PhaseStats are the counts of one phase.
type PhaseStats struct {
	Requests int64
	Classes  [numClasses]int64
	Hist     *hist.Histogram
	First    time.Time // first intended send
	Last     time.Time // last completion
}

// Point is one time bucket of the series (by completion time).
type Point struct {
	Classes [numClasses]int64
	Hist    *hist.Histogram // purchases of every class
}

// Recorder collects results; it is safe for concurrent use.
type Recorder struct {
	start  time.Time
	bucket time.Duration

	mu       sync.Mutex
	classes  [numClasses]*hist.Histogram // purchases of rush and tail
	phases   [numPhases]*PhaseStats
	mix      map[string]int64
	readMix  map[string]int64
	retryMix map[string]int64
	// replayMix: the answers to replays of keys answered 202 before.
	replayMix map[string]int64
	series    []*Point
	accepted  []verify.Accepted
	retries   int64
	users     []uint64 // bitset of users that sent a purchase
	ips       []uint64 // bitset of source addresses used
	nUsers    int64
	nIPs      int64

	done     atomic.Int64
	inFlight atomic.Int64
	live     [numClasses]atomic.Int64
}

// NewRecorder starts the clock at start; bucket is the series resolution.
func NewRecorder(start time.Time, bucket time.Duration, users, ips int) *Recorder {
	r := &Recorder{start: start, bucket: bucket, mix: map[string]int64{}, readMix: map[string]int64{}, retryMix: map[string]int64{}, replayMix: map[string]int64{},
		users: make([]uint64, users/64+1), ips: make([]uint64, ips/64+1)}
	for i := range r.classes {
		r.classes[i] = hist.New(11)
	}
	for i := range r.phases {
		r.phases[i] = &PhaseStats{Hist: hist.New(11)}
	}
	return r
}

// Start is the recorder's time zero.
func (r *Recorder) Start() time.Time { return r.start }

// Bucket is the series resolution.
func (r *Recorder) Bucket() time.Duration { return r.bucket }

func setBit(b []uint64, i int) bool {
	if i < 0 || i/64 >= len(b) {
		return false
	}
	w, m := i/64, uint64(1)<<(i%64)
	if b[w]&m != 0 {
		return false
	}
	b[w] |= m
	return true
}

// Sent marks a request as started (for the in-flight gauge).
func (r *Recorder) Sent() { r.inFlight.Add(1) }

// Record adds one finished logical request.
func (r *Recorder) Record(res Result, intended time.Time) {
	r.inFlight.Add(-1)
	r.done.Add(1)
	class := Classify(res.Status, res.Code)
	if res.Purchase {
		r.live[class].Add(1)
	}
	us := res.Latency.Microseconds()

	r.mu.Lock()
	defer r.mu.Unlock()
	ps := r.phases[res.Phase]
	ps.Requests++
	ps.Classes[class]++
	ps.Hist.Record(us)
	if ps.First.IsZero() || intended.Before(ps.First) {
		ps.First = intended
	}
	if res.Done.After(ps.Last) {
		ps.Last = res.Done
	}
	r.retries += int64(res.Retries)
	for _, c := range res.RetryCauses {
		r.retryMix[c]++
	}
	if !res.Purchase {
		r.readMix["GET "+MixKey(res.Status, res.Code)]++
		return
	}
	r.mix[MixKey(res.Status, res.Code)]++
	if res.Replay {
		r.replayMix[MixKey(res.Status, res.Code)]++
	}
	r.classes[class].Record(us)
	if setBit(r.users, res.User) {
		r.nUsers++
	}
	if setBit(r.ips, res.IP) {
		r.nIPs++
	}
	if res.Status == 202 && res.OrderID != "" {
		r.accepted = append(r.accepted, verify.Accepted{OrderID: res.OrderID, UserID: res.UserID, Key: res.Key})
	}
	i := int(res.Done.Sub(r.start) / r.bucket)
	if i < 0 {
		i = 0
	}
	for len(r.series) <= i {
		r.series = append(r.series, &Point{Hist: hist.New(7)})
	}
	r.series[i].Classes[class]++
	r.series[i].Hist.Record(us)
}

// Live is a cheap view for the progress display.
type Live struct {
	Done     int64
	InFlight int64
	Classes  [numClasses]int64
}

// Live reads the counters without locking.
func (r *Recorder) Live() Live {
	l := Live{Done: r.done.Load(), InFlight: r.inFlight.Load()}
	for i := range l.Classes {
		l.Classes[i] = r.live[i].Load()
	}
	return l
}

// Snapshot is a consistent copy of everything recorded, for the report.
type Snapshot struct {
	Start        time.Time
	Bucket       time.Duration
	Classes      map[Class]*hist.Histogram
	All          *hist.Histogram // purchases of rush and tail
	Phases       map[Phase]PhaseStats
	Mix          []MixEntry // purchases
	ReadMix      []MixEntry // the warm-up's reads
	RetryMix     []MixEntry // answers that were retried
	ReplayMix    []MixEntry // answers to replays of keys answered 202 before
	Series       []Point
	Accepted     []verify.Accepted
	Retries      int64
	DistinctUser int64
	DistinctIPs  int64
}

// MixEntry is one status/code pair and its count.
type MixEntry struct {
	Key   string `json:"answer"`
	Count int64  `json:"count"`
}

// Snapshot copies the recorder's state.
func (r *Recorder) Snapshot() Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Snapshot{Start: r.start, Bucket: r.bucket, Classes: map[Class]*hist.Histogram{}, All: hist.New(11),
		Phases: map[Phase]PhaseStats{}, Retries: r.retries, DistinctUser: r.nUsers, DistinctIPs: r.nIPs}
	for c, h := range r.classes {
		cp := hist.New(11)
		cp.Merge(h)
		s.Classes[Class(c)] = cp
		s.All.Merge(h)
	}
	for p, ps := range r.phases {
		cp := *ps
		cp.Hist = hist.New(11)
		cp.Hist.Merge(ps.Hist)
		s.Phases[Phase(p)] = cp
	}
	s.Mix, s.ReadMix, s.RetryMix, s.ReplayMix = sortedMix(r.mix), sortedMix(r.readMix), sortedMix(r.retryMix), sortedMix(r.replayMix)
	for _, p := range r.series {
		cp := Point{Classes: p.Classes, Hist: hist.New(7)}
		cp.Hist.Merge(p.Hist)
		s.Series = append(s.Series, cp)
	}
	s.Accepted = append([]verify.Accepted(nil), r.accepted...)
	return s
}

func sortedMix(m map[string]int64) []MixEntry {
	out := make([]MixEntry, 0, len(m))
	for k, n := range m {
		out = append(out, MixEntry{Key: k, Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Key < out[j].Key
	})
	return out
}
