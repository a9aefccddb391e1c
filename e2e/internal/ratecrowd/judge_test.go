package ratecrowd

import (
	"math/rand/v2"
	"testing"
	"time"
)

const ms = time.Millisecond

// bruteWorst is WorstInterval by its definition: every span's From as a
// candidate start, every span tested.
func bruteWorst(spans []Span, w time.Duration) int {
	best := 0
	for _, a := range spans {
		n := 0
		for _, s := range spans {
			if s.From >= a.From && s.To < a.From+w {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

// The checker catches excess: L+1 admissions certainly inside one window
// read as L+1, so a claimed limit of L fails; and a sliding pattern that
// keeps every interval at exactly L reads as L, so the same spans judged
// against L-1 fail.
func TestWorstIntervalCatchesExcess(t *testing.T) {
	const L, w = 3, time.Second
	var spans []Span
	for i := range L + 1 {
		at := time.Duration(i) * 200 * ms
		spans = append(spans, Span{From: at, To: at + 5*ms})
	}
	if got := WorstInterval(spans, w); got.N != L+1 || got.From != 0 {
		t.Fatalf("%d spans inside [0, 1s): worst %+v, want %d from 0", L+1, got, L+1)
	}
	// Exactly L per sliding second: admissions at 0, 1/3 s, 2/3 s, 1 s, ...
	// (each W after the one L earlier).
	spans = spans[:0]
	for i := range 30 {
		at := time.Duration(i) * w / L
		spans = append(spans, Span{From: at, To: at + ms})
	}
	got := WorstInterval(spans, w)
	if got.N != L {
		t.Fatalf("L per sliding window: worst %d, want %d", got.N, L)
	}
	if ok := got.N <= L-1; ok {
		t.Fatalf("judged against a claimed limit of %d the pattern passed", L-1)
	}
	// One more admission just inside a window breaks it.
	spans = append(spans, Span{From: 5*w + 500*ms, To: 5*w + 501*ms})
	if got := WorstInterval(spans, w); got.N != L+1 {
		t.Fatalf("an extra admission mid-run: worst %d, want %d", got.N, L+1)
	}
}

// A span reaching past the interval does not count: a burst that queued at
// the proxy and reached the upstream together (an arrival log would read it
// as all inside one instant) counts only the requests whose whole span
// fits, and two admissions exactly W apart are in no one interval.
func TestWorstIntervalCountsOnlyWholeSpans(t *testing.T) {
	const w = time.Second
	var spans []Span
	for i := range 10 { // sent over 1.8 s, all reached the upstream at 2.1 s
		spans = append(spans, Span{From: time.Duration(i) * 200 * ms, To: 2100 * ms})
	}
	if got := WorstInterval(spans, w); got.N != 4 { // sent at 1.2..1.8 s, reached at 2.1 < 1.2+1
		t.Fatalf("queued burst: worst %d, want 4", got.N)
	}
	if got := WorstInterval([]Span{{0, 0}, {w, w}}, w); got.N != 1 {
		t.Fatalf("admissions exactly W apart: worst %d, want 1", got.N)
	}
	if got := WorstInterval(nil, w); got.N != 0 {
		t.Fatalf("no spans: %+v", got)
	}
}

func TestWorstIntervalMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		n := 1 + r.IntN(60)
		spans := make([]Span, n)
		for i := range spans {
			from := time.Duration(r.IntN(3000)) * ms
			if r.IntN(4) == 0 && i > 0 { // ties
				from = spans[r.IntN(i)].From
			}
			spans[i] = Span{From: from, To: from + time.Duration(r.IntN(900))*ms}
		}
		w := time.Duration(100+r.IntN(1500)) * ms
		if got, want := WorstInterval(spans, w).N, bruteWorst(spans, w); got != want {
			t.Fatalf("round %d (w %v): WorstInterval %d, brute force %d: %v", round, w, got, want, spans)
		}
	}
}

// The ideal limiter admits exactly L of a burst, L per window of a steady
// stream, and under a binding global window its total; the refusals are
// told apart by window.
func TestIdeal(t *testing.T) {
	const w = time.Second
	// A burst of 10 from one client, limit 3.
	cl := make([]int, 10)
	sent := make([]time.Duration, 10)
	if a, byC, byG := Ideal(cl, sent, 3, 0, w); a != 3 || byC != 7 || byG != 0 {
		t.Fatalf("burst of 10, limit 3: admitted %d, refused %d/%d", a, byC, byG)
	}
	// One client at 10/s for 3 s (sends at 0..2.9 s), limit 3/1s: 3 in each
	// of [0,1), [1,2), [2,3).
	cl, sent = cl[:0], sent[:0]
	for i := range 30 {
		cl = append(cl, 0)
		sent = append(sent, time.Duration(i)*100*ms)
	}
	if a, _, _ := Ideal(cl, sent, 3, 0, w); a != 9 {
		t.Fatalf("10/s for 3 s, limit 3/1s: admitted %d, want 9", a)
	}
	// 100 clients, 2 requests each at once, per-IP 3, global 50: the global
	// window refuses 150.
	cl, sent = cl[:0], sent[:0]
	for c := range 100 {
		cl = append(cl, c, c)
		sent = append(sent, 0, 0)
	}
	if a, byC, byG := Ideal(cl, sent, 3, 50, w); a != 50 || byC != 0 || byG != 150 {
		t.Fatalf("global 50: admitted %d, refused %d by client, %d globally", a, byC, byG)
	}
}
