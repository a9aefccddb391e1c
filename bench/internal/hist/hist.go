// Package hist is a log-linear (HDR-style) latency histogram: values below
// 2^bits are counted exactly, larger ones in buckets whose width is a fixed
// fraction of their value, so every quantile is exact to within 2^-(bits-1)
// relative error while memory stays small and recording is O(1).
package hist

import (
	"math"
	"math/bits"
	"time"
)

// maxExp bounds the range: values up to 2^(maxExp+subBits) units.
const maxExp = 40

// Histogram counts non-negative int64 values (the bench records microseconds).
// It is not safe for concurrent use; callers lock or shard.
type Histogram struct {
	subBits uint
	counts  []uint64
	total   uint64
	min     int64
	max     int64
	sum     float64
}

// New returns a histogram with 2^subBits linear sub-buckets per power of two:
// subBits 11 keeps three significant digits, 7 about two.
func New(subBits uint) *Histogram {
	if subBits < 1 {
		subBits = 1
	}
	if subBits > 16 {
		subBits = 16
	}
	sub := 1 << subBits
	half := sub / 2
	return &Histogram{subBits: subBits, counts: make([]uint64, sub+maxExp*half), min: math.MaxInt64}
}

func (h *Histogram) index(v int64) int {
	sub := int64(1) << h.subBits
	if v < sub {
		return int(v)
	}
	// v>>e lies in [sub/2, sub).
	e := uint(bits.Len64(uint64(v))) - h.subBits
	half := int(sub / 2)
	i := int(sub) + int(e-1)*half + int(v>>e) - half
	if i >= len(h.counts) {
		return len(h.counts) - 1
	}
	return i
}

// lowest value counted in bucket i.
func (h *Histogram) lowest(i int) int64 {
	sub := 1 << h.subBits
	if i < sub {
		return int64(i)
	}
	half := sub / 2
	e := uint((i-sub)/half + 1)
	m := int64((i-sub)%half + half)
	return m << e
}

// highest value counted in bucket i.
func (h *Histogram) highest(i int) int64 {
	sub := 1 << h.subBits
	if i < sub {
		return int64(i)
	}
	half := sub / 2
	e := uint((i-sub)/half + 1)
	return h.lowest(i) + (int64(1) << e) - 1
}

// Record counts v once; negative values count as 0.
func (h *Histogram) Record(v int64) {
	if v < 0 {
		v = 0
	}
	h.counts[h.index(v)]++
	h.total++
	h.sum += float64(v)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

// RecordDuration records d in microseconds.
func (h *Histogram) RecordDuration(d time.Duration) { h.Record(d.Microseconds()) }

// Merge adds the counts of o, which must have the same precision.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.total == 0 {
		return
	}
	if o.subBits != h.subBits {
		// Different precision: re-record each bucket at its middle.
		for i, c := range o.counts {
			if c == 0 {
				continue
			}
			v := (o.lowest(i) + o.highest(i)) / 2
			h.counts[h.index(v)] += c
		}
	} else {
		for i, c := range o.counts {
			h.counts[i] += c
		}
	}
	h.total += o.total
	h.sum += o.sum
	if o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.total }

// Min and Max are the exact extremes (0 when empty).
func (h *Histogram) Min() int64 {
	if h.total == 0 {
		return 0
	}
	return h.min
}

// Max is the largest recorded value.
func (h *Histogram) Max() int64 { return h.max }

// Mean is the exact mean.
func (h *Histogram) Mean() float64 {
	if h.total == 0 {
		return 0
	}
	return h.sum / float64(h.total)
}

// Quantile returns the value at quantile q (0..1): the highest value of the
// bucket holding the ceil(q*count)-th value, clamped to the exact max, as
// HdrHistogram reports it (never below the true quantile).
func (h *Histogram) Quantile(q float64) int64 {
	if h.total == 0 {
		return 0
	}
	if q <= 0 {
		return h.Min()
	}
	if q >= 1 {
		return h.max
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	if rank == 0 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			v := h.highest(i)
			if v > h.max {
				v = h.max
			}
			if v < h.min {
				v = h.min
			}
			return v
		}
	}
	return h.max
}

// Summary is a histogram reduced to the numbers a report shows, in
// milliseconds.
type Summary struct {
	Count  uint64  `json:"count"`
	Min    float64 `json:"min_ms"`
	Mean   float64 `json:"mean_ms"`
	P50    float64 `json:"p50_ms"`
	P90    float64 `json:"p90_ms"`
	P99    float64 `json:"p99_ms"`
	P999   float64 `json:"p99_9_ms"`
	Max    float64 `json:"max_ms"`
	Stddev float64 `json:"-"`
}

// Summarize reads a histogram of microseconds.
func (h *Histogram) Summarize() Summary {
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return Summary{
		Count: h.total,
		Min:   ms(h.Min()),
		Mean:  h.Mean() / 1000,
		P50:   ms(h.Quantile(0.50)),
		P90:   ms(h.Quantile(0.90)),
		P99:   ms(h.Quantile(0.99)),
		P999:  ms(h.Quantile(0.999)),
		Max:   ms(h.Max()),
	}
}
