package metrics

import (
	"bytes"
	"strings"
	"testing"
)

func TestTextFormat(t *testing.T) {
	var r Registry
	c := r.NewCounterVec("x_total", "Things.", "rule", "outcome")
	c.With("a\"b", "admitted").Add(3)
	c.With("a\"b", "admitted").Inc()
	h := r.NewHistogramVec("lat_seconds", "Latency.", []float64{0.1, 1})
	h.With().Observe(0.05)
	h.With().Observe(0.5)
	h.With().Observe(5)
	r.NewGaugeFunc("g", "Gauge.", []string{"k"}, func(emit func(float64, ...string)) { emit(2.5, "v") })
	var b bytes.Buffer
	if _, err := r.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# TYPE x_total counter\n",
		`x_total{rule="a\"b",outcome="admitted"} 4` + "\n",
		`lat_seconds_bucket{le="0.1"} 1` + "\n",
		`lat_seconds_bucket{le="1"} 2` + "\n",
		`lat_seconds_bucket{le="+Inf"} 3` + "\n",
		"lat_seconds_sum 5.55\n",
		"lat_seconds_count 3\n",
		`g{k="v"} 2.5` + "\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
}
