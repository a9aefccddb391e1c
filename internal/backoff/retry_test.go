package backoff

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

var errFlaky = errors.New("flaky")

func TestRetryUntilSuccessCountsRetriesBySite(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	if NewMetrics(reg) == nil { // a second component of the binary shares the counter
		t.Fatal("second NewMetrics on one registry")
	}
	calls, seen := 0, 0
	err := Retry(context.Background(), Policy{Site: "s", Min: time.Millisecond, Max: 2 * time.Millisecond, Metrics: m,
		OnRetry: func(err error, wait time.Duration) {
			seen++
			if !errors.Is(err, errFlaky) || wait <= 0 || wait > 2*time.Millisecond {
				t.Errorf("OnRetry(%v, %s)", err, wait)
			}
		}}, func(context.Context) error {
		calls++
		if calls < 4 {
			return errFlaky
		}
		return nil
	})
	if err != nil || calls != 4 || seen != 3 {
		t.Fatalf("err %v, calls %d, retries seen %d; want nil, 4, 3", err, calls, seen)
	}
	var d dto.Metric
	if err := m.retries.WithLabelValues("s").Write(&d); err != nil {
		t.Fatal(err)
	}
	if got := d.GetCounter().GetValue(); got != 3 {
		t.Errorf("seckill_retries_total{site=s} = %v, want 3", got)
	}
}

func TestRetryStopsAtStopTriesUntilAndContext(t *testing.T) {
	fast := Policy{Min: time.Millisecond, Max: time.Millisecond}
	final := errors.New("final")
	calls := 0
	err := Retry(context.Background(), fast, func(context.Context) error { calls++; return Stop(final) })
	if err != final || calls != 1 {
		t.Errorf("Stop: err %v after %d calls, want the unwrapped error after 1", err, calls)
	}

	calls = 0
	p := fast
	p.Tries = 3
	err = Retry(context.Background(), p, func(context.Context) error { calls++; return errFlaky })
	if !errors.Is(err, errFlaky) || calls != 3 {
		t.Errorf("Tries 3: err %v after %d calls", err, calls)
	}

	calls = 0
	p = Policy{Min: time.Hour, Max: time.Hour, Until: time.Now().Add(time.Minute)}
	err = Retry(context.Background(), p, func(context.Context) error { calls++; return errFlaky })
	if !errors.Is(err, errFlaky) || calls != 1 {
		t.Errorf("a wait past Until: err %v after %d calls, want the try's error after 1", err, calls)
	}

	ctx, cancel := context.WithCancel(context.Background())
	err = Retry(ctx, fast, func(context.Context) error { cancel(); return errFlaky })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("ctx ended during a try: %v, want ctx's error", err)
	}
	if err := Retry(ctx, Policy{Min: time.Hour, WaitFirst: true}, func(context.Context) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("ctx ended before the first wait: %v", err)
	}
}

func TestRetryBoundsEachTry(t *testing.T) {
	calls := 0
	err := Retry(context.Background(), Policy{Min: time.Millisecond, TryTimeout: 5 * time.Millisecond}, func(ctx context.Context) error {
		calls++
		if calls == 1 {
			<-ctx.Done() // a hung call: its own deadline ends it, not the loop's
			return ctx.Err()
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Errorf("err %v after %d calls; want the hung try cut and the second to pass", err, calls)
	}
}

// A try that progressed before failing starts the waits from Min again.
func TestRetryProgressedResetsTheWaits(t *testing.T) {
	var waits []time.Duration
	calls := 0
	_ = Retry(context.Background(), Policy{Min: time.Millisecond, Max: 64 * time.Millisecond, Tries: 5,
		OnRetry: func(_ error, w time.Duration) { waits = append(waits, w) }}, func(context.Context) error {
		calls++
		if calls == 3 {
			return Progressed(errFlaky)
		}
		return errFlaky
	})
	if len(waits) != 4 || waits[2] > time.Millisecond {
		t.Errorf("waits %v: the third (after progress) should be back at Min", waits)
	}
}

func TestRetryTryOutlivesCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Retry(ctx, Policy{Min: time.Millisecond, TryTimeout: time.Second, TryOutlivesCtx: true}, func(tctx context.Context) error {
		calls++
		cancel()
		if tctx.Err() != nil {
			return tctx.Err()
		}
		if _, ok := tctx.Deadline(); !ok {
			return errors.New("the try lost its own timeout")
		}
		return errFlaky
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("err %v after %d calls; want the try finished, then ctx's error and no second try", err, calls)
	}
}
