package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlc "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/proxy/internal/limiter"
)

// Bounds of a request: beyond them it is answered InvalidArgument.
const (
	maxDescriptors = 64
	maxValue       = 4096 // bytes of a domain, key or value
)

// Mode is what a window does while the store cannot decide
// ([proxy] rls_on_redis_error, parsed by limiter.ParseRLSMode): the HTTP
// rules' modes, and limiter.ModeEnvoy.
type Mode = limiter.Mode

// Modes, named here for the service's callers.
const (
	ModeLocal  = limiter.ModeLocal  // limit in this process at limit / live instances
	ModeOpen   = limiter.ModeOpen   // admit
	ModeClosed = limiter.ModeClosed // refuse (OVER_LIMIT)
	ModeEnvoy  = limiter.ModeEnvoy  // answer UNAVAILABLE: Envoy's failure_mode_deny decides
)

// Options of a Service.
type Options struct {
	// Store decides the windows: the HTTP edge's (limiter.SharedStore).
	Store limiter.Store
	// Live is the number of live instances (on_redis_error = local);
	// nil: 1.
	Live func() int
	// Decided counts a decision that used the store (limiter.CountDecision).
	Decided   func()
	KeyPrefix string // [redis] key_prefix
	// Settings at start; SetSettings and Reload change them.
	Settings
	// MaxCached bounds the negative cache (0: no bound).
	MaxCached int
	Metrics   *Metrics
	Log       *slog.Logger
	// Trace, if set, gets every window the store admitted: its key and the
	// admission moment (µs, the store's clock). Tests check exactness by it.
	Trace func(key string, weight int, micros int64)
}

// Settings are the rls_* keys a SIGHUP changes without a restart (the
// listener, reflection and the gRPC bounds need one: docs/envoy.md).
type Settings struct {
	Mode    Mode // rls_on_redis_error
	Headers bool // rls_response_headers: IETF RateLimit headers in response_headers_to_add
	Shadow  bool // rls_shadow_mode: answer OK, count what would be refused
	// NearLimit is rls_near_limit_ratio: admitted hits past this share of
	// a limit are counted as near the limit.
	NearLimit float64
}

// Service implements RateLimitService. Safe for concurrent use.
type Service struct {
	pb.UnimplementedRateLimitServiceServer
	o   Options
	cfg atomic.Pointer[Config]
	// set is read once per call, so one call sees one set of settings.
	set   atomic.Pointer[Settings]
	local *limiter.Memory
	// denied is the negative cache of the running configuration: a reload
	// starts an empty one (a raised limit frees the windows known full).
	denied atomic.Pointer[limiter.Denied]
	m      *Metrics
}

// New makes a Service answering from cfg.
func New(cfg *Config, o Options) *Service {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Live == nil {
		o.Live = func() int { return 1 }
	}
	if o.Decided == nil {
		o.Decided = func() {}
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	s := &Service{o: o, local: limiter.NewMemory(), m: o.Metrics}
	s.SetConfig(cfg)
	s.SetSettings(o.Settings)
	return s
}

// SetSettings swaps the running settings.
func (s *Service) SetSettings(st Settings) { s.set.Store(&st) }

// Settings are the running settings.
func (s *Service) Settings() Settings { return *s.set.Load() }

// SetConfig swaps the running configuration.
func (s *Service) SetConfig(c *Config) {
	s.denied.Store(limiter.NewDenied())
	s.cfg.Store(c)
	s.m.domains.Set(float64(c.Domains()))
}

// Config is the running configuration.
func (s *Service) Config() *Config { return s.cfg.Load() }

// Apply runs c with st, counted as a reload; the caller loaded c (a
// SIGHUP, which validates the rls_* keys and the files together).
func (s *Service) Apply(c *Config, st Settings) {
	s.m.reloads.WithLabelValues("ok").Inc()
	s.SetSettings(st)
	s.SetConfig(c)
}

// CountReloadError counts a reload the caller refused: the running
// configuration and settings stay.
func (s *Service) CountReloadError() { s.m.reloads.WithLabelValues("error").Inc() }

// Reload loads path and runs it with the running settings (a change of
// the files); an invalid one keeps the running one.
func (s *Service) Reload(path string) error {
	c, err := Load(path)
	if err != nil {
		s.CountReloadError()
		return err
	}
	s.m.reloads.WithLabelValues("ok").Inc()
	s.SetConfig(c)
	return nil
}

// Run sweeps the negative cache and the in-process windows until ctx ends.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.denied.Load().Sweep(mono())
			s.local.Sweep()
		}
	}
}

// item is one descriptor with a limit to decide.
type item struct {
	i      int // index of the descriptor
	lim    *Limit
	key    []byte
	weight int
	label  string
	domain string
	st     *pb.RateLimitResponse_DescriptorStatus
	tried  bool // in a group decided (or refused) already
	asked  bool // the store (or on_redis_error) told its state
	over   bool
	// degraded: decided by rls_on_redis_error (counted so, once)
	degraded bool
}

// ShouldRateLimit implements RateLimitService.
func (s *Service) ShouldRateLimit(_ context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	t0 := time.Now()
	resp, outcome, err := s.decide(req, s.set.Load())
	s.m.requests.WithLabelValues(outcome).Inc()
	s.m.latency.Observe(time.Since(t0).Seconds())
	return resp, err
}

// check refuses a malformed request before anything is looked up.
func check(req *pb.RateLimitRequest) error {
	switch {
	case req.GetDomain() == "":
		return errors.New("domain is empty")
	case len(req.Domain) > maxValue:
		return fmt.Errorf("domain is longer than %d bytes", maxValue)
	case len(req.Descriptors) == 0:
		return errors.New("no descriptors")
	case len(req.Descriptors) > maxDescriptors:
		return fmt.Errorf("%d descriptors, more than %d", len(req.Descriptors), maxDescriptors)
	}
	for i, d := range req.Descriptors {
		switch {
		case d == nil || len(d.Entries) == 0:
			return fmt.Errorf("descriptor %d has no entries", i)
		case len(d.Entries) > maxDepth:
			return fmt.Errorf("descriptor %d: %d entries, more than %d", i, len(d.Entries), maxDepth)
		}
		for j, e := range d.Entries {
			switch {
			case e == nil || e.Key == "":
				return fmt.Errorf("descriptor %d entry %d: empty key", i, j)
			case len(e.Key) > maxValue || len(e.Value) > maxValue:
				return fmt.Errorf("descriptor %d entry %d: key or value longer than %d bytes", i, j, maxValue)
			}
		}
		if l := d.Limit; l != nil && (units[unitName(pb.RateLimitResponse_RateLimit_Unit(l.Unit))].d == 0 || l.RequestsPerUnit > MaxLimit) {
			return fmt.Errorf("descriptor %d: limit override needs a unit from SECOND to YEAR and requests_per_unit <= %d", i, MaxLimit)
		}
	}
	return nil
}

func unitName(u pb.RateLimitResponse_RateLimit_Unit) string {
	for n, x := range units {
		if x.unit == u {
			return n
		}
	}
	return ""
}

// weightOf is a descriptor's hits: its own hits_addend, else the
// request's, else 1; capped past MaxLimit (any weight above a limit is
// refused the same).
func weightOf(req *pb.RateLimitRequest, d *rlc.RateLimitDescriptor) int {
	w := uint64(req.HitsAddend)
	if d.HitsAddend != nil {
		w = d.HitsAddend.Value
	} else if w == 0 {
		w = 1
	}
	return int(min(w, MaxLimit+1))
}

func (s *Service) decide(req *pb.RateLimitRequest, st *Settings) (*pb.RateLimitResponse, string, error) {
	if err := check(req); err != nil {
		return nil, "invalid", status.Error(codes.InvalidArgument, err.Error())
	}
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK,
		Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	}
	top := s.cfg.Load().domains[req.Domain]
	if top == nil {
		s.m.unmatchedDomain.Inc()
		return resp, "ok", nil
	}
	items := make([]item, 0, len(req.Descriptors))
	var replaced map[string]bool
	for i, d := range req.Descriptors {
		var f found
		lim := top.lookup(d.Entries, &f)
		lbl := ""
		if d.Limit != nil { // Envoy's per-route override wins, as there
			u := units[unitName(pb.RateLimitResponse_RateLimit_Unit(d.Limit.Unit))]
			lim = &Limit{Requests: int(d.Limit.RequestsPerUnit), Length: u.d, Unit: u.unit,
				current: &pb.RateLimitResponse_RateLimit{RequestsPerUnit: d.Limit.RequestsPerUnit, Unit: u.unit}}
			f.lim, f.wild = lim, 0
			lbl = overrideLabel(req.Domain, d.Entries)
		}
		if lim == nil {
			s.m.unmatchedDescriptor.Inc()
			continue
		}
		for _, r := range lim.Replaces {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			replaced[r] = true
		}
		if lbl == "" {
			lbl = label(req.Domain, d.Entries, &f)
		}
		it := item{i: i, lim: lim, weight: weightOf(req, d), label: lbl, domain: req.Domain, st: resp.Statuses[i]}
		if lim.Unlimited {
			it.st.LimitRemaining = math.MaxUint32
			s.outcome(&it, "unlimited")
			continue
		}
		it.key = appendKey(nil, s.o.KeyPrefix, req.Domain, d.Entries, &f)
		it.st.CurrentLimit = lim.current
		items = append(items, it)
	}
	if replaced != nil {
		kept := items[:0]
		for _, it := range items {
			if it.lim.Name != "" && replaced[it.lim.Name] {
				it.st.CurrentLimit = nil
				s.outcome(&it, "replaced")
				continue
			}
			kept = append(kept, it)
		}
		items = kept
	}

	// Enforced windows first, group by group until one refuses; then,
	// for an admitted request, the shadow ones (advisory: they count only
	// admitted requests, as the HTTP edge's shadow rules).
	over, err := s.pass(items, false, st)
	if err != nil {
		return nil, "unavailable", status.Error(codes.Unavailable, err.Error())
	}
	if !over {
		if _, err := s.pass(items, true, st); err != nil {
			s.o.Log.Debug("rls shadow windows not decided", "err", err)
		}
	}
	outcome := "ok"
	if over {
		resp.OverallCode, outcome = pb.RateLimitResponse_OVER_LIMIT, "over_limit"
		if st.Shadow {
			resp.OverallCode, outcome = pb.RateLimitResponse_OK, "shadow"
		}
	}
	for k := range items {
		it := &items[k]
		switch {
		case it.degraded:
			s.outcome(it, "degraded")
		case !it.asked:
		case it.over && it.lim.Shadow:
			s.outcome(it, "shadow_over")
		case it.over:
			s.outcome(it, "over")
		default:
			s.outcome(it, "within")
		}
	}
	if st.Headers {
		resp.ResponseHeadersToAdd = headers(items)
	}
	return resp, outcome, nil
}

func (s *Service) outcome(it *item, o string) {
	s.m.descriptors.WithLabelValues(it.domain, it.label, o).Inc()
}

// pass decides the enforced (or shadow) items: those of equal weight
// together, all or nothing (one store call); groups of other weights, or
// repeating a key, one after another (the store takes one weight per
// decision). Enforced groups stop at the first refusal. over: an item
// refused.
func (s *Service) pass(items []item, shadow bool, st *Settings) (over bool, err error) {
	var group []*item
	for {
		group = group[:0]
		weight := -1
		for k := range items {
			it := &items[k]
			if it.lim.Shadow != shadow || it.tried {
				continue
			}
			if weight == -1 {
				weight = it.weight
			}
			if it.weight != weight || hasKey(group, it.key) {
				continue
			}
			group = append(group, it)
		}
		if len(group) == 0 {
			return over, nil
		}
		refused, err := s.group(group, weight, st)
		if err != nil {
			return over, err
		}
		if refused {
			over = true
			if !shadow {
				return true, nil
			}
		}
	}
}

func hasKey(g []*item, key []byte) bool {
	for _, it := range g {
		if string(it.key) == string(key) {
			return true
		}
	}
	return false
}

// group decides one group of items of one weight at one moment.
func (s *Service) group(g []*item, weight int, st *Settings) (refused bool, err error) {
	m, neg := mono(), s.denied.Load()
	// Known full (or a limit of 0): refused without asking the store.
	var cached bool
	for _, it := range g {
		it.tried = true
		if it.lim.Requests == 0 {
			s.refuse(it, it.lim.Length)
			refused = true
			continue
		}
		if u := neg.Until(it.key); u > m {
			s.refuse(it, time.Duration(u-m))
			refused, cached = true, true
		}
	}
	if cached {
		s.m.cached.Inc()
	}
	// hits_addend 0 is a look without a hit; the store has no read-only
	// call, so only the negative cache answers it (docs/envoy.md). A
	// refused group leaves its other windows unasked.
	if weight == 0 || refused {
		return refused, nil
	}
	wants := make([]limiter.Want, len(g))
	gots := make([]limiter.Got, len(g))
	for k, it := range g {
		wants[k] = limiter.Want{Key: string(it.key), Limit: it.lim.Requests, Length: it.lim.Length}
	}
	s.o.Decided()
	ok, err := s.o.Store.Take(wants, weight, gots)
	switch {
	case errors.Is(err, limiter.ErrShed):
		return false, fmt.Errorf("rate-limit decision shed (overloaded): %w", err)
	case err != nil:
		return s.fallback(g, wants, weight, err, st.Mode)
	}
	for k, it := range g {
		got := gots[k]
		if got.Remaining == 0 && got.Reset > 0 && (!got.Full || weight == 1) {
			// Full until its oldest hit slides out, from before the call.
			neg.Set(it.key, m+int64(got.Reset), m, s.o.MaxCached, nil)
		}
		if got.Remaining < 0 { // a cluster's later tag, not looked at
			continue
		}
		it.asked = true
		it.st.LimitRemaining = uint32(got.Remaining)
		it.st.DurationUntilReset = durationpb.New(got.Reset)
		if got.Full {
			s.refuse(it, got.Reset)
		}
		if ok {
			s.nearLimit(it, got.Remaining, weight, st.NearLimit)
			if s.o.Trace != nil {
				s.o.Trace(string(it.key), weight, got.At)
			}
		}
	}
	return !ok, nil
}

// nearLimit counts the hits of an admitted decision that took its window
// past ratio × its limit, as the reference server's near_limit: with a
// limit of 10 and 0.8, the 9th and 10th hits count. remaining is the
// window's room after the hits.
func (s *Service) nearLimit(it *item, remaining, weight int, ratio float64) {
	used := it.lim.Requests - remaining
	near := int(math.Floor(float64(it.lim.Requests) * ratio))
	if used > near {
		s.m.nearLimit.WithLabelValues(it.domain, it.label).Add(float64(min(used-near, weight)))
	}
}

// refuse marks it over the limit for reset.
func (s *Service) refuse(it *item, reset time.Duration) {
	it.over, it.asked = true, true
	it.st.LimitRemaining = 0
	it.st.DurationUntilReset = durationpb.New(reset)
	if !it.lim.Shadow {
		it.st.Code = pb.RateLimitResponse_OVER_LIMIT
	}
}

// fallback decides g without the store, as rls_on_redis_error says.
func (s *Service) fallback(g []*item, wants []limiter.Want, weight int, err error, mode Mode) (bool, error) {
	s.m.fallbacks.WithLabelValues(mode.String()).Inc()
	s.o.Log.Debug("rls decision fell back to rls_on_redis_error", "mode", mode.String(), "err", err)
	for _, it := range g {
		it.degraded = true
	}
	switch mode {
	case ModeEnvoy:
		return false, fmt.Errorf("rate-limit store failed (Envoy's failure_mode_deny decides): %w", err)
	case ModeOpen:
		return false, nil
	case ModeClosed:
		for _, it := range g {
			s.refuse(it, time.Second)
		}
		return true, nil
	}
	live := s.o.Live()
	for k := range wants {
		wants[k].Limit = max(1, wants[k].Limit/live)
	}
	gots := make([]limiter.Got, len(wants))
	ok, _ := s.local.Take(wants, weight, gots)
	for k, it := range g {
		it.asked = true
		it.st.LimitRemaining = uint32(max(0, gots[k].Remaining))
		it.st.DurationUntilReset = durationpb.New(gots[k].Reset)
		if gots[k].Full {
			s.refuse(it, gots[k].Reset)
		}
	}
	return !ok, nil
}

// headers are the IETF RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers, as the HTTP edge sends them) of
// the enforced windows asked.
func headers(items []item) []*core.HeaderValue {
	var pol, rl []byte
	for k := range items {
		it := &items[k]
		if !it.asked || it.lim.Shadow {
			continue
		}
		name := it.lim.Name
		if name == "" {
			name = it.label
		}
		if len(pol) > 0 {
			pol, rl = append(pol, ", "...), append(rl, ", "...)
		}
		pol = appendSFString(pol, name)
		pol = append(pol, ";q="...)
		pol = strconv.AppendInt(pol, int64(it.lim.Requests), 10)
		pol = append(pol, ";w="...)
		pol = strconv.AppendInt(pol, ceilSeconds(it.lim.Length), 10)
		rl = appendSFString(rl, name)
		rl = append(rl, ";r="...)
		rl = strconv.AppendInt(rl, int64(it.st.LimitRemaining), 10)
		rl = append(rl, ";t="...)
		rl = strconv.AppendInt(rl, ceilSeconds(it.st.DurationUntilReset.AsDuration()), 10)
	}
	if len(pol) == 0 {
		return nil
	}
	return []*core.HeaderValue{{Key: "RateLimit-Policy", Value: string(pol)}, {Key: "RateLimit", Value: string(rl)}}
}

// ceilSeconds is d in whole seconds, rounded up, at least 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// appendSFString appends s as a structured-field string (RFC 8941): printable
// ASCII, '"' and '\\' escaped; any other byte becomes '?'.
func appendSFString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e:
			dst = append(dst, '?')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// mono is now in the negative cache's clock.
func mono() int64 { return limiter.Mono(time.Now()) }
