package limiter

import (
	"testing"
	"time"
)

// The breaker opens after breakerThreshold failures, lets one probe through
// after the back-off (jittered: half to all of it), and a probe that tells
// nothing (its decision shed) does not keep it open for good: the probe
// slot frees after the back-off. A failed probe doubles the back-off; a
// success closes it.
func TestBreakerProbeThatTellsNothing(t *testing.T) {
	var b breaker
	b.init(0)
	t0 := time.Now()
	for i := range breakerThreshold {
		if opened := b.failure(t0); opened != (i == breakerThreshold-1) {
			t.Fatalf("failure %d: opened %v", i, opened)
		}
	}
	if b.delay < breakerMinBackoff/2 || b.delay > breakerMinBackoff {
		t.Fatalf("first back-off %v, want within [%v, %v]", b.delay, breakerMinBackoff/2, breakerMinBackoff)
	}
	if b.allow(t0.Add(b.delay - time.Millisecond)) {
		t.Fatal("allowed within the back-off")
	}
	at := t0.Add(b.delay)
	if !b.allow(at) || b.allow(at) {
		t.Fatal("want exactly one probe after the back-off")
	}
	// The probe's decision is shed: nothing recorded.
	if b.allow(at.Add(b.delay - time.Millisecond)) {
		t.Fatal("a second probe while the first may still answer")
	}
	if !b.allow(at.Add(b.delay)) {
		t.Fatal("the probe slot never freed: the breaker would stay open for good")
	}
	b.failure(at.Add(b.delay))
	if b.delay < breakerMinBackoff || b.delay > 2*breakerMinBackoff {
		t.Fatalf("back-off after a failed probe %v, want doubled: within [%v, %v]", b.delay, breakerMinBackoff, 2*breakerMinBackoff)
	}
	if b.success(); b.isOpen() || !b.allow(at) {
		t.Fatal("a success did not close it")
	}
}
