package hist

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestExactBelowSubBuckets(t *testing.T) {
	h := New(11)
	for v := int64(1); v <= 1000; v++ {
		h.Record(v)
	}
	for _, c := range []struct {
		q    float64
		want int64
	}{{0.5, 500}, {0.9, 900}, {0.99, 990}, {0.999, 999}, {1, 1000}, {0, 1}} {
		if got := h.Quantile(c.q); got != c.want {
			t.Errorf("Quantile(%v) = %d, want %d", c.q, got, c.want)
		}
	}
	if h.Count() != 1000 || h.Min() != 1 || h.Max() != 1000 {
		t.Errorf("count/min/max = %d/%d/%d", h.Count(), h.Min(), h.Max())
	}
	if m := h.Mean(); m != 500.5 {
		t.Errorf("mean = %v", m)
	}
}

// Every quantile of a wide random sample is within the precision of the true
// value, and never below it.
func TestRelativeError(t *testing.T) {
	for _, sub := range []uint{7, 11} {
		h := New(sub)
		r := rand.New(rand.NewPCG(1, 2))
		vals := make([]int64, 100000)
		for i := range vals {
			vals[i] = int64(r.ExpFloat64() * 5000 * float64(1+r.IntN(1000)))
			h.Record(vals[i])
		}
		slices.Sort(vals)
		tol := 1.0 / float64(int64(1)<<(sub-1))
		for _, q := range []float64{0.1, 0.5, 0.9, 0.99, 0.999, 0.9999} {
			rank := int(float64(len(vals))*q+0.999999) - 1
			want := vals[rank]
			got := h.Quantile(q)
			if got < want || float64(got-want) > tol*float64(want)+1 {
				t.Errorf("sub=%d q=%v: got %d, true %d (tol %.4f)", sub, q, got, want, tol)
			}
		}
		if h.Max() != vals[len(vals)-1] {
			t.Errorf("max %d, want %d", h.Max(), vals[len(vals)-1])
		}
	}
}

func TestBucketBoundsRoundTrip(t *testing.T) {
	h := New(7)
	for v := int64(0); v < 1<<22; v += 37 {
		i := h.index(v)
		if lo, hi := h.lowest(i), h.highest(i); v < lo || v > hi {
			t.Fatalf("v=%d in bucket %d [%d,%d]", v, i, lo, hi)
		}
	}
	// Huge values land in the last bucket rather than out of range.
	h.Record(1 << 62)
	if h.Max() != 1<<62 || h.Quantile(1) != 1<<62 {
		t.Errorf("huge value lost: max %d", h.Max())
	}
}

func TestMerge(t *testing.T) {
	a, b := New(11), New(11)
	for v := int64(1); v <= 100; v++ {
		a.Record(v)
		b.Record(v + 100)
	}
	a.Merge(b)
	if a.Count() != 200 || a.Min() != 1 || a.Max() != 200 || a.Quantile(0.5) != 100 {
		t.Errorf("merged: count %d min %d max %d p50 %d", a.Count(), a.Min(), a.Max(), a.Quantile(0.5))
	}
	c := New(7)
	c.Merge(a)
	if c.Count() != 200 || c.Max() != 200 {
		t.Errorf("cross-precision merge: count %d max %d", c.Count(), c.Max())
	}
}

func TestEmpty(t *testing.T) {
	h := New(11)
	if h.Quantile(0.5) != 0 || h.Min() != 0 || h.Max() != 0 || h.Mean() != 0 {
		t.Error("empty histogram must report zeros")
	}
	if s := h.Summarize(); s.Count != 0 || s.P99 != 0 {
		t.Errorf("summary %+v", s)
	}
}

func BenchmarkRecord(b *testing.B) {
	b.ReportAllocs()
	h := New(11)
	for i := 0; b.Loop(); i++ {
		h.Record(int64(i&0xfffff) * 13)
	}
}
