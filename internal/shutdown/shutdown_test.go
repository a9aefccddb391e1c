package shutdown

import (
	"log/slog"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func serve(h fasthttp.RequestHandler, path string) (int, string) {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(path)
	h(&ctx)
	return ctx.Response.StatusCode(), string(ctx.Response.Body())
}

func TestGateFailsReadinessOnlyWhileDraining(t *testing.T) {
	var g Gate
	next := func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("next") }
	h := g.Readyz(next)
	if code, body := serve(h, "/readyz"); code != 200 || body != "next" {
		t.Errorf("before the drain: %d %q", code, body)
	}
	start := time.Now()
	g.Drain(slog.New(slog.DiscardHandler), 50*time.Millisecond)
	if time.Since(start) < 50*time.Millisecond {
		t.Error("Drain returned before its delay")
	}
	if code, _ := serve(h, "/readyz"); code != 503 {
		t.Errorf("while draining: /readyz %d", code)
	}
	if code, body := serve(h, "/api/v1/orders/x"); code != 200 || body != "next" {
		t.Errorf("while draining, other paths are still served: %d %q", code, body)
	}
}
