// Package metrics is a small Prometheus text-format registry: counters,
// gauges computed at scrape time and histograms, all lock-free on the hot
// path. Callers resolve a labelled series once (With) and keep the pointer.
package metrics

import (
	"bytes"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Registry holds metric families in registration order.
type Registry struct {
	mu   sync.Mutex
	fams []family
}

type family interface {
	write(b *bytes.Buffer)
}

// WriteTo writes every family in the Prometheus text format (version 0.0.4).
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	fams := append([]family(nil), r.fams...)
	r.mu.Unlock()
	var b bytes.Buffer
	for _, f := range fams {
		f.write(&b)
	}
	n, err := w.Write(b.Bytes())
	return int64(n), err
}

func (r *Registry) add(f family) {
	r.mu.Lock()
	r.fams = append(r.fams, f)
	r.mu.Unlock()
}

func header(b *bytes.Buffer, name, help, typ string) {
	b.WriteString("# HELP ")
	b.WriteString(name)
	b.WriteByte(' ')
	b.WriteString(help)
	b.WriteString("\n# TYPE ")
	b.WriteString(name)
	b.WriteByte(' ')
	b.WriteString(typ)
	b.WriteByte('\n')
}

// labelString renders {a="x",b="y"} with values escaped.
func labelString(names, values []string, extra ...string) string {
	if len(names) == 0 && len(extra) == 0 {
		return ""
	}
	var sb strings.Builder
	sb.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(n)
		sb.WriteString(`="`)
		sb.WriteString(escape(values[i]))
		sb.WriteByte('"')
	}
	for i := 0; i+1 < len(extra); i += 2 {
		if sb.Len() > 1 {
			sb.WriteByte(',')
		}
		sb.WriteString(extra[i])
		sb.WriteString(`="`)
		sb.WriteString(extra[i+1])
		sb.WriteByte('"')
	}
	sb.WriteByte('}')
	return sb.String()
}

func escape(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `"`, `\"`)
	return strings.ReplaceAll(s, "\n", `\n`)
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Counter is a monotonically increasing value.
type Counter struct{ v atomic.Uint64 }

// Inc adds one.
func (c *Counter) Inc() { c.v.Add(1) }

// Add adds n.
func (c *Counter) Add(n uint64) { c.v.Add(n) }

// Value returns the current count.
func (c *Counter) Value() uint64 { return c.v.Load() }

// CounterVec is a family of counters told apart by label values.
type CounterVec struct {
	name, help string
	labels     []string
	mu         sync.RWMutex
	series     map[string]*series
}

type series struct {
	values []string
	c      Counter
}

// NewCounterVec registers a counter family.
func (r *Registry) NewCounterVec(name, help string, labels ...string) *CounterVec {
	v := &CounterVec{name: name, help: help, labels: labels, series: map[string]*series{}}
	r.add(v)
	return v
}

// With returns the counter for the label values (created at zero if new).
func (v *CounterVec) With(values ...string) *Counter {
	k := strings.Join(values, "\xff")
	v.mu.RLock()
	s := v.series[k]
	v.mu.RUnlock()
	if s != nil {
		return &s.c
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if s = v.series[k]; s == nil {
		s = &series{values: append([]string(nil), values...)}
		v.series[k] = s
	}
	return &s.c
}

func (v *CounterVec) write(b *bytes.Buffer) {
	header(b, v.name, v.help, "counter")
	v.mu.RLock()
	keys := make([]string, 0, len(v.series))
	for k := range v.series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s := v.series[k]
		b.WriteString(v.name)
		b.WriteString(labelString(v.labels, s.values))
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(s.c.Value(), 10))
		b.WriteByte('\n')
	}
	v.mu.RUnlock()
}

// GaugeFunc is a gauge computed at scrape time; it may return several
// labelled samples.
type GaugeFunc struct {
	name, help string
	labels     []string
	fn         func(emit func(value float64, labelValues ...string))
}

// NewGaugeFunc registers a gauge whose samples fn emits at each scrape.
func (r *Registry) NewGaugeFunc(name, help string, labels []string, fn func(emit func(value float64, labelValues ...string))) {
	r.add(&GaugeFunc{name: name, help: help, labels: labels, fn: fn})
}

func (g *GaugeFunc) write(b *bytes.Buffer) {
	header(b, g.name, g.help, "gauge")
	g.fn(func(v float64, lv ...string) {
		b.WriteString(g.name)
		b.WriteString(labelString(g.labels, lv))
		b.WriteByte(' ')
		b.WriteString(formatFloat(v))
		b.WriteByte('\n')
	})
}

// Histogram counts observations in cumulative buckets (upper bounds).
type Histogram struct {
	labels  []string
	values  []string
	bounds  []float64
	counts  []atomic.Uint64 // one per bound, plus +Inf
	sumBits atomic.Uint64
	count   atomic.Uint64
}

// HistogramVec is a family of histograms with the same buckets.
type HistogramVec struct {
	name, help string
	labels     []string
	bounds     []float64
	mu         sync.RWMutex
	series     map[string]*Histogram
}

// LatencyBuckets suit request latencies in seconds, 100µs to 10s.
var LatencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// NewHistogramVec registers a histogram family.
func (r *Registry) NewHistogramVec(name, help string, bounds []float64, labels ...string) *HistogramVec {
	v := &HistogramVec{name: name, help: help, labels: labels, bounds: bounds, series: map[string]*Histogram{}}
	r.add(v)
	return v
}

// With returns the histogram for the label values.
func (v *HistogramVec) With(values ...string) *Histogram {
	k := strings.Join(values, "\xff")
	v.mu.RLock()
	h := v.series[k]
	v.mu.RUnlock()
	if h != nil {
		return h
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if h = v.series[k]; h == nil {
		h = &Histogram{labels: v.labels, values: append([]string(nil), values...),
			bounds: v.bounds, counts: make([]atomic.Uint64, len(v.bounds)+1)}
		v.series[k] = h
	}
	return h
}

// Observe records one value.
func (h *Histogram) Observe(x float64) {
	// A linear scan: few bounds, and most observations land in the first ones.
	i := 0
	for i < len(h.bounds) && h.bounds[i] < x {
		i++
	}
	h.counts[i].Add(1)
	h.count.Add(1)
	for {
		old := h.sumBits.Load()
		if h.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+x)) {
			return
		}
	}
}

// Since records the seconds elapsed since start.
func (h *Histogram) Since(start time.Time) { h.Observe(time.Since(start).Seconds()) }

// Count returns the number of observations.
func (h *Histogram) Count() uint64 { return h.count.Load() }

func (v *HistogramVec) write(b *bytes.Buffer) {
	header(b, v.name, v.help, "histogram")
	v.mu.RLock()
	keys := make([]string, 0, len(v.series))
	for k := range v.series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		h := v.series[k]
		var cum uint64
		for i, ub := range h.bounds {
			cum += h.counts[i].Load()
			b.WriteString(v.name + "_bucket" + labelString(v.labels, h.values, "le", formatFloat(ub)) + " " + strconv.FormatUint(cum, 10) + "\n")
		}
		cum += h.counts[len(h.bounds)].Load()
		b.WriteString(v.name + "_bucket" + labelString(v.labels, h.values, "le", "+Inf") + " " + strconv.FormatUint(cum, 10) + "\n")
		b.WriteString(v.name + "_sum" + labelString(v.labels, h.values) + " " + formatFloat(math.Float64frombits(h.sumBits.Load())) + "\n")
		b.WriteString(v.name + "_count" + labelString(v.labels, h.values) + " " + strconv.FormatUint(cum, 10) + "\n")
	}
	v.mu.RUnlock()
}
