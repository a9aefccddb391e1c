// Package load drives a flash sale: many users behind many client addresses
// buy from one activity through one or more targets (usually the proxies),
// in an open loop at a constant rate (latency from the intended send time, so
// coordinated omission is corrected) or a closed loop with N clients, through
// three phases: warm-up, rush and sold-out tail.
package load

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Config of one run.
type Config struct {
	Targets    []string // base URLs, http://host:port
	ActivityID int64
	Users      int
	UserPrefix string // X-User-ID = UserPrefix + index
	Quantity   int

	Warmup, Rush, Tail time.Duration
	// Rate > 0: open loop, requests per second; else closed loop.
	Rate        int
	Connections int
	MaxInFlight int

	// Sources are the client addresses; nil sends from the default address.
	// With ForwardedFor they are sent in X-Forwarded-For instead of bound.
	Sources  []net.IP
	HotShare float64
	// UnkeyedShare of the purchases go without an Idempotency-Key, and are
	// never retried.
	UnkeyedShare float64
	// ReplayShare of the tail's keyed purchases replay a key answered 202
	// earlier in the run (its user and key), when there is one.
	ReplayShare  float64
	ForwardedFor bool

	RequestTimeout time.Duration
	Retries        int
	// MaxRetryWait caps a Retry-After a retry honours (default 2s).
	MaxRetryWait time.Duration

	// The read mix (reads.go): sale-state polls per second in the warm-up,
	// and the long-poll wait for each accepted order's result (0: none).
	StatePollRate int
	OrderWait     time.Duration
}

// SourceAddrs returns the first n host addresses of cidr (skipping the
// network address).
func SourceAddrs(cidr string, n int) ([]net.IP, error) {
	ip, nw, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, err
	}
	v4 := ip.Mask(nw.Mask).To4()
	if v4 == nil {
		return nil, fmt.Errorf("source net %s: not IPv4", cidr)
	}
	ones, bits := nw.Mask.Size()
	if n > 1<<(bits-ones)-2 {
		return nil, fmt.Errorf("source net %s holds fewer than %d addresses", cidr, n)
	}
	base := binary.BigEndian.Uint32(v4)
	out := make([]net.IP, n)
	for i := range out {
		b := make(net.IP, 4)
		binary.BigEndian.PutUint32(b, base+uint32(i)+1)
		out[i] = b
	}
	return out, nil
}

// target is one base URL with a client per source address.
type target struct {
	purchaseURL string
	stateURL    string
	orderURL    string                 // + order id
	clients     []*fasthttp.HostClient // per source; one when not binding
	// waitClients carry the order waits (long-polls), apart from the
	// purchases' connections; nil without order waits.
	waitClients []*fasthttp.HostClient
}

// Runner runs the scenario.
type Runner struct {
	cfg     Config
	rec     *Recorder
	targets []*target
	runID   string
	keys    atomic.Uint64
	rr      atomic.Uint64
	hotIPs  int
	hotUser int
	reads   *reads
	// accepted holds purchases answered 202 (up to maxReplayable), which
	// the tail replays (Config.ReplayShare).
	acceptedMu sync.Mutex
	accepted   []replayable
	tailKeyed  atomic.Uint64
}

// replayable is a keyed purchase answered 202: its user and key.
type replayable struct {
	user int
	key  string
}

// maxReplayable bounds the accepted purchases kept for replays: a sale of
// millions of units needs no more than this to pick replays from.
const maxReplayable = 1 << 16

func (r *Runner) keepAccepted(user int, key string) {
	r.acceptedMu.Lock()
	if len(r.accepted) < maxReplayable {
		r.accepted = append(r.accepted, replayable{user, key})
	}
	r.acceptedMu.Unlock()
}

// replayDue counts the tail's keyed purchases and says which replay: the
// n-th does when ceil(n × share) steps up, so that at least the share of
// them replays however short the run (a coin per purchase fell short).
func (r *Runner) replayDue() bool {
	n := float64(r.tailKeyed.Add(1))
	return math.Ceil(n*r.cfg.ReplayShare) > math.Ceil((n-1)*r.cfg.ReplayShare)
}

// replay picks a purchase answered 202 earlier, if there is one.
func (r *Runner) replay() (replayable, bool) {
	r.acceptedMu.Lock()
	defer r.acceptedMu.Unlock()
	if len(r.accepted) == 0 {
		return replayable{}, false
	}
	return r.accepted[rand.IntN(len(r.accepted))], true
}

// NewRunner prepares clients; nothing is sent yet.
func NewRunner(cfg Config, rec *Recorder) (*Runner, error) {
	if len(cfg.Targets) == 0 {
		return nil, errors.New("no target")
	}
	if cfg.Quantity <= 0 {
		cfg.Quantity = 1
	}
	if cfg.MaxRetryWait <= 0 {
		cfg.MaxRetryWait = 2 * time.Second
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 4096
	}
	r := &Runner{cfg: cfg, rec: rec, runID: strconv.FormatUint(rand.Uint64()&0xffffffffff, 36), reads: newReads()}
	// User ids are formatted per request, not built up front: with -users in
	// the millions a table of them took over a second of CPU after the run's
	// clock had started (eating the warm-up), and the GC then had to mark it
	// during the rush; the open loop fell behind and every request of its
	// first ~0.7 s was late by up to 0.5–1 s (measured from its intended
	// send time, correctly).
	if n := len(cfg.Sources); n > 1 && cfg.HotShare > 0 {
		r.hotIPs = max(1, n/100)
		r.hotUser = int(float64(cfg.Users) * cfg.HotShare)
	}
	bind := len(cfg.Sources) > 0 && !cfg.ForwardedFor
	for _, base := range cfg.Targets {
		u, err := url.Parse(base)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("target %q: not a URL", base)
		}
		t := &target{
			purchaseURL: fmt.Sprintf("%s/api/v1/activities/%d/purchase", trimSlash(base), cfg.ActivityID),
			stateURL:    fmt.Sprintf("%s/api/v1/activities/%d", trimSlash(base), cfg.ActivityID),
			orderURL:    trimSlash(base) + "/api/v1/orders/",
		}
		n := 1
		if bind {
			n = len(cfg.Sources)
		}
		for i := 0; i < n; i++ {
			var local net.IP
			if bind {
				local = cfg.Sources[i]
			}
			t.clients = append(t.clients, newClient(u.Host, local, cfg, bind))
			if cfg.OrderWait > 0 {
				wc := cfg
				wc.RequestTimeout += cfg.OrderWait
				t.waitClients = append(t.waitClients, newClient(u.Host, local, wc, bind))
			}
		}
		r.targets = append(r.targets, t)
	}
	return r, nil
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

func newClient(addr string, local net.IP, cfg Config, bound bool) *fasthttp.HostClient {
	maxConns := 64
	if !bound {
		maxConns = max(cfg.Connections, cfg.MaxInFlight, 64)
	}
	d := &net.Dialer{}
	if local != nil {
		d.LocalAddr = &net.TCPAddr{IP: local}
	}
	return &fasthttp.HostClient{
		Addr:                      addr,
		Name:                      "seckill-bench",
		MaxConns:                  maxConns,
		MaxConnWaitTimeout:        cfg.RequestTimeout,
		MaxIdleConnDuration:       30 * time.Second,
		ReadTimeout:               cfg.RequestTimeout,
		WriteTimeout:              cfg.RequestTimeout,
		MaxIdemponentCallAttempts: 1,
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		DialTimeout: func(a string, timeout time.Duration) (net.Conn, error) {
			dd := *d
			dd.Timeout = timeout
			return dd.Dial("tcp4", a)
		},
	}
}

// sourceOf maps a user to a source address index: the first HotShare of the
// users share a few "hot" addresses (NAT, bots), the rest spread over the
// others.
func (r *Runner) sourceOf(user int) int {
	n := len(r.cfg.Sources)
	switch {
	case n == 0:
		return -1
	case r.hotIPs > 0 && user < r.hotUser:
		return user % r.hotIPs
	case r.hotIPs > 0 && n > r.hotIPs:
		return r.hotIPs + user%(n-r.hotIPs)
	default:
		return user % n
	}
}

func (r *Runner) client(t *target, src int) *fasthttp.HostClient {
	if src < 0 || len(t.clients) == 1 {
		return t.clients[0]
	}
	return t.clients[src]
}

// nextTarget spreads requests over the targets in turn.
func (r *Runner) nextTarget() *target {
	return r.targets[r.rr.Add(1)%uint64(len(r.targets))]
}

// Timeline of a run, fixed by Run's start.
type Timeline struct {
	Start, RushStart, TailStart, End time.Time
}

// Plan returns the phases' times for a run starting at start.
func (r *Runner) Plan(start time.Time) Timeline {
	rs := start.Add(r.cfg.Warmup)
	ts := rs.Add(r.cfg.Rush)
	return Timeline{Start: start, RushStart: rs, TailStart: ts, End: ts.Add(r.cfg.Tail)}
}

// Run executes warm-up, rush and tail per tl. The warm-up reads the sale's
// state through every (source, target) pair so connections exist before the
// rush; it fails when a target never answers.
func (r *Runner) Run(ctx context.Context, tl Timeline) error {
	var polls sync.WaitGroup
	polls.Go(func() { r.pollState(ctx, tl) })
	err := r.warmup(ctx, tl)
	polls.Wait()
	if err != nil {
		return err
	}
	if d := time.Until(tl.RushStart); d > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	if r.cfg.Rate > 0 {
		r.openLoop(ctx, tl)
	} else {
		r.closedLoop(ctx, tl)
	}
	return ctx.Err()
}

func (r *Runner) phaseOf(tl Timeline, t time.Time) Phase {
	switch {
	case t.Before(tl.RushStart):
		return Warmup
	case t.Before(tl.TailStart):
		return Rush
	default:
		return Tail
	}
}

func (r *Runner) warmup(ctx context.Context, tl Timeline) error {
	type pair struct{ t, src int }
	var pairs []pair
	nsrc := max(1, len(r.cfg.Sources))
	if r.cfg.ForwardedFor {
		nsrc = 1
	}
	for s := 0; s < nsrc; s++ {
		for t := range r.targets {
			pairs = append(pairs, pair{t, s})
		}
	}
	ok := make([]atomic.Int64, len(r.targets))
	lastErr := make([]atomic.Value, len(r.targets))
	var next atomic.Int64
	workers := min(64, len(pairs))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				// One full pass at least, then until the rush.
				if i >= len(pairs) && !time.Now().Before(tl.RushStart) {
					return
				}
				p := pairs[i%len(pairs)]
				t := r.targets[p.t]
				src := p.src
				if len(r.cfg.Sources) == 0 {
					src = -1
				}
				intended := time.Now()
				r.rec.Sent()
				status, code, _, _, err := r.do(t, src, fasthttp.MethodGet, t.stateURL, "", "", nil)
				res := Result{Phase: Warmup, Status: status, Code: code, Latency: time.Since(intended),
					Done: time.Now(), IP: src, User: -1}
				if err != nil {
					res.Code = errKind(err)
					lastErr[p.t].Store(err.Error())
				} else if status == 200 {
					ok[p.t].Add(1)
				} else {
					lastErr[p.t].Store(MixKey(status, code))
				}
				r.rec.Record(res, intended)
				if i >= len(pairs) && time.Until(tl.RushStart) > 0 {
					// Past the first pass: a gentle read rate, not a flood.
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, t := range r.targets {
		if ok[i].Load() == 0 {
			last, _ := lastErr[i].Load().(string)
			return fmt.Errorf("warm-up: %s never answered 200 (last: %s)", t.stateURL, last)
		}
	}
	return nil
}

func (r *Runner) openLoop(ctx context.Context, tl Timeline) {
	interval := float64(time.Second) / float64(r.cfg.Rate)
	sem := make(chan struct{}, r.cfg.MaxInFlight)
	var wg sync.WaitGroup
	start := tl.RushStart
loop:
	for i := 0; ; i++ {
		intended := start.Add(time.Duration(float64(i) * interval))
		if !intended.Before(tl.End) {
			break
		}
		if d := time.Until(intended); d > 0 {
			select {
			case <-ctx.Done():
				break loop
			case <-time.After(d):
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		wg.Add(1)
		r.rec.Sent()
		go func() {
			defer func() { <-sem; wg.Done() }()
			r.purchase(ctx, tl, intended)
		}()
	}
	wg.Wait()
}

func (r *Runner) closedLoop(ctx context.Context, tl Timeline) {
	var wg sync.WaitGroup
	for w := 0; w < r.cfg.Connections; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				now := time.Now()
				if !now.Before(tl.End) {
					return
				}
				r.rec.Sent()
				r.purchase(ctx, tl, now)
			}
		}()
	}
	wg.Wait()
}

// purchase is one logical purchase: a random user, a fresh Idempotency-Key,
// retried with the same key after 502/503/504 or a connection error; or,
// for UnkeyedShare of them, no key and no retry; or, for ReplayShare of the
// tail's keyed ones, the user and key of a purchase answered 202 before.
func (r *Runner) purchase(ctx context.Context, tl Timeline, intended time.Time) {
	phase := r.phaseOf(tl, intended)
	user := rand.IntN(r.cfg.Users)
	key, replay := "", false
	if r.cfg.UnkeyedShare == 0 || rand.Float64() >= r.cfg.UnkeyedShare {
		key = r.runID + "-" + strconv.FormatUint(r.keys.Add(1), 36)
		if phase == Tail && r.cfg.ReplayShare > 0 && r.replayDue() {
			var a replayable
			if a, replay = r.replay(); replay {
				user, key = a.user, a.key
			}
		}
	}
	src := r.sourceOf(user)
	body := `{"quantity":` + strconv.Itoa(r.cfg.Quantity) + `}`
	res := Result{Phase: phase, User: user, IP: src, Key: key, UserID: r.cfg.UserPrefix + strconv.Itoa(user), Purchase: true, Replay: replay}
	for attempt := 0; ; attempt++ {
		t := r.nextTarget()
		status, code, orderID, retryAfter, err := r.do(t, src, fasthttp.MethodPost, t.purchaseURL, res.UserID, key, []byte(body))
		res.Status, res.Code, res.OrderID = status, code, orderID
		if err != nil {
			res.Status, res.Code = 0, errKind(err)
		}
		retry := key != "" && (err != nil || status == 502 || status == 503 || status == 504)
		if !retry || attempt >= r.cfg.Retries || ctx.Err() != nil {
			break
		}
		res.Retries++
		res.RetryCauses = append(res.RetryCauses, MixKey(res.Status, res.Code))
		wait := time.Duration(25<<attempt) * time.Millisecond
		if retryAfter > 0 {
			wait = min(retryAfter, r.cfg.MaxRetryWait)
		}
		wait += time.Duration(rand.Int64N(int64(wait)/4 + 1))
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	res.Done = time.Now()
	res.Latency = res.Done.Sub(intended)
	r.rec.Record(res, intended)
	if res.Status == 202 && res.OrderID != "" && key != "" && !replay && r.cfg.ReplayShare > 0 {
		r.keepAccepted(user, key)
	}
	if res.Status == 202 && res.OrderID != "" {
		r.waitOrder(res.OrderID, res.UserID, src, res.Done)
	}
}

// answer is the part of a JSON body the bench reads.
type answer struct {
	OrderID  string   `json:"order_id"`
	Code     string   `json:"code"`
	Violated []string `json:"violated-policies"`
}

// do sends one request and reads status, code (the body's "code", or the
// violated policies of a 429), the order id of a 202, and Retry-After.
func (r *Runner) do(t *target, src int, method, uri, user, key string, body []byte) (int, string, string, time.Duration, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(uri)
	req.Header.SetMethod(method)
	if user != "" {
		req.Header.Set("X-User-ID", user)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if r.cfg.ForwardedFor && src >= 0 {
		req.Header.Set("X-Forwarded-For", r.cfg.Sources[src].String())
	}
	if body != nil {
		req.Header.SetContentType("application/json")
		req.SetBody(body)
	}
	if err := r.client(t, src).DoTimeout(req, resp, r.cfg.RequestTimeout); err != nil {
		return 0, "", "", 0, err
	}
	status := resp.StatusCode()
	var a answer
	if b := resp.Body(); len(b) > 0 && b[0] == '{' {
		_ = json.Unmarshal(b, &a)
	}
	code := a.Code
	if code == "" && len(a.Violated) > 0 {
		code = a.Violated[0]
		for _, v := range a.Violated[1:] {
			code += "+" + v
		}
	}
	var ra time.Duration
	if s := resp.Header.Peek(fasthttp.HeaderRetryAfter); len(s) > 0 {
		if n, err := strconv.Atoi(string(s)); err == nil && n >= 0 {
			ra = time.Duration(n) * time.Second
		}
	}
	return status, code, a.OrderID, ra, nil
}

// errKind names a transport error for the status mix.
func errKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, fasthttp.ErrNoFreeConns), errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection"
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Op + "_error"
	}
	return "connection"
}
