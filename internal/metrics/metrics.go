// Package metrics serves a Prometheus registry as text on a fasthttp handler.
// Each component builds its own metrics struct on its own registry (never the
// global one) and is handed it by its main.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/version"
)

// NewRegistry returns the registry of one binary (component: proxy,
// backend, worker): the Go runtime (go_*) and process (process_*) collectors
// and seckill_build_info{component,version,goversion} = 1, which dashboards
// join on to tell builds apart during a rollout.
func NewRegistry(component string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "seckill_build_info",
		Help: "Always 1; the labels name the component and its build.",
	}, []string{"component", "version", "goversion"})
	info.WithLabelValues(component, version.Get(), version.GoVersion()).Set(1)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), info)
	return reg
}

// Handler writes every metric of g in the Prometheus text format.
func Handler(g prometheus.Gatherer) fasthttp.RequestHandler {
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	return func(ctx *fasthttp.RequestCtx) {
		mfs, err := g.Gather()
		if err != nil && len(mfs) == 0 {
			ctx.Error("gather metrics: "+err.Error(), fasthttp.StatusInternalServerError)
			return
		}
		ctx.SetContentType(string(format))
		enc := expfmt.NewEncoder(ctx, format)
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				return
			}
		}
	}
}

// LatencyBuckets suit calls that take from tens of microseconds to seconds.
var LatencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
