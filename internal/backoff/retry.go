package backoff

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Policy is how one call site retries, stated where the call is made rather
// than in a private copy of the loop: how often (Min, Max), how long (Until,
// Tries) and how long each try may take (TryTimeout).
type Policy struct {
	// Site names the loop: the label of its retries in the metric.
	Site string
	// Min and Max: the first wait is about Min, each later one doubles up to
	// Max, every one jittered into [d/2, d] (New).
	Min, Max time.Duration
	// TryTimeout, when set, bounds each try: it gets a context of its own
	// that ends after TryTimeout, so one hung call cannot hold the loop.
	TryTimeout time.Duration
	// Until, when set, is the last moment worth waiting for: the loop gives
	// up rather than wait past it (a reservation's deadline, after which the
	// sweeper acts). A zero Until retries until ctx ends.
	Until time.Time
	// TryOutlivesCtx lets a try under way finish (within TryTimeout) when
	// ctx ends, and only the waits and later tries are cut: for a call that
	// is worse cut halfway than finished late (an undo cut at shutdown holds
	// its unit until the sweep).
	TryOutlivesCtx bool
	// Tries, when set, gives up after that many tries.
	Tries int
	// WaitFirst waits once before the first try (a reconnect right after a
	// loss: the broker that just dropped the connection is rarely back at
	// once, and a fleet should not return to it in lockstep).
	WaitFirst bool
	// Metrics counts each retry under Site; nil counts nothing.
	Metrics *Metrics
	// OnRetry, when set, sees each failed try that is retried and the wait
	// before the next one (for the site's own log line or metric).
	OnRetry func(err error, wait time.Duration)
}

// Retry calls try until it returns nil. It stops early and returns
//   - the error a try marked with Stop (unwrapped), at once;
//   - ctx's error when ctx ended (during a try or a wait);
//   - the last try's error when Tries or Until say to give up.
func Retry(ctx context.Context, p Policy, try func(context.Context) error) error {
	bo := New(p.Min, p.Max)
	if p.WaitFirst && !Sleep(ctx, bo.Next()) {
		return ctx.Err()
	}
	for n := 1; ; n++ {
		err := p.once(ctx, try)
		if err == nil {
			return nil
		}
		// A final answer stands even when ctx ended with it.
		var s stopErr
		if errors.As(err, &s) {
			return s.err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var pr progressErr
		if errors.As(err, &pr) {
			// The try got somewhere before it failed: the trouble is new,
			// so the waits start from Min again.
			bo.Reset()
			err = pr.err
		}
		if p.Tries > 0 && n >= p.Tries {
			return err
		}
		wait := bo.Next()
		if !p.Until.IsZero() && !time.Now().Add(wait).Before(p.Until) {
			return err
		}
		p.Metrics.retried(p.Site)
		if p.OnRetry != nil {
			p.OnRetry(err, wait)
		}
		if !Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

func (p Policy) once(ctx context.Context, try func(context.Context) error) error {
	if p.TryOutlivesCtx {
		ctx = context.WithoutCancel(ctx)
	}
	if p.TryTimeout <= 0 {
		return try(ctx)
	}
	tctx, cancel := context.WithTimeout(ctx, p.TryTimeout)
	defer cancel()
	return try(tctx)
}

// Stop marks err as final: Retry returns it (unwrapped) without another
// try. nil stays nil.
func Stop(err error) error {
	if err == nil {
		return nil
	}
	return stopErr{err}
}

type stopErr struct{ err error }

func (s stopErr) Error() string { return s.err.Error() }
func (s stopErr) Unwrap() error { return s.err }

// Progressed marks err as the end of a try that made progress first (a
// session that consumed before its connection was lost): the next wait
// starts from Min again. nil stays nil.
func Progressed(err error) error {
	if err == nil {
		return nil
	}
	return progressErr{err}
}

type progressErr struct{ err error }

func (p progressErr) Error() string { return p.err.Error() }
func (p progressErr) Unwrap() error { return p.err }

// Metrics counts retries by site: seckill_retries_total{site}.
type Metrics struct {
	retries *prometheus.CounterVec
}

// NewMetrics registers the retries counter on reg, or returns the one
// already there: every component of a binary that retries calls it on the
// binary's registry and they share one counter.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "seckill_retries_total",
		Help: "Failed tries that were tried again after a jittered back-off wait, by the loop (site).",
	}, []string{"site"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err) // a clash of names is a programming error, as with MustRegister
		}
		c = are.ExistingCollector.(*prometheus.CounterVec)
	}
	return &Metrics{retries: c}
}

func (m *Metrics) retried(site string) {
	if m != nil {
		m.retries.WithLabelValues(site).Inc()
	}
}
