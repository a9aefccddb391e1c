// Package shutdown is the stop sequence every seckill server shares. On
// SIGTERM a process first fails /readyz for a drain delay while it keeps
// serving, so that load balancers and orchestrators stop sending it work;
// only then do its listeners close and requests in flight finish.
package shutdown

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Gate is a process's draining state.
type Gate struct{ draining atomic.Bool }

// Draining reports whether Drain began.
func (g *Gate) Draining() bool { return g.draining.Load() }

// Drain fails readiness from now on and waits delay (nothing to wait for
// when 0) before it returns and the caller closes its listeners.
func (g *Gate) Drain(log *slog.Logger, delay time.Duration) {
	g.draining.Store(true)
	if delay <= 0 {
		return
	}
	log.Info("draining: /readyz fails while requests are still served", "drain_delay", delay)
	time.Sleep(delay)
}

var draining = []byte(`{"status":"draining","code":"unavailable","message":"shutting down"}`)

// Readyz answers GET /readyz with 503 while draining and hands every other
// request, and /readyz before the drain, to next.
func (g *Gate) Readyz(next fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if g.draining.Load() && string(ctx.Path()) == "/readyz" {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetContentType("application/json")
			ctx.Response.Header.Set("Retry-After", "1")
			ctx.SetBody(draining)
			return
		}
		next(ctx)
	}
}
