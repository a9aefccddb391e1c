package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/backend/internal/api"
)

// /readyz gates on the required checks only: an optional one (MySQL) that
// fails is reported in the body and the backend stays in rotation.
func TestReadyzGatesOnRequiredChecksOnly(t *testing.T) {
	down := errors.New("connection refused")
	ok := func(context.Context) error { return nil }
	fail := func(context.Context) error { return down }
	for _, c := range []struct {
		name   string
		checks []api.Check
		status int
	}{
		{"all up", []api.Check{{Name: "redis", Fn: ok}, {Name: "rabbitmq", Fn: ok}, {Name: "mysql", Fn: ok, Optional: true}}, 200},
		{"mysql down", []api.Check{{Name: "redis", Fn: ok}, {Name: "rabbitmq", Fn: ok}, {Name: "mysql", Fn: fail, Optional: true}}, 200},
		{"redis down", []api.Check{{Name: "redis", Fn: fail}, {Name: "rabbitmq", Fn: ok}, {Name: "mysql", Fn: ok, Optional: true}}, 503},
		{"rabbitmq down", []api.Check{{Name: "redis", Fn: ok}, {Name: "rabbitmq", Fn: fail}, {Name: "mysql", Fn: fail, Optional: true}}, 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			a := api.New(nil, api.Config{CheckTimeout: 1e9}, c.checks, reg, slog.New(slog.DiscardHandler), api.NewMetrics(reg))
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod("GET")
			ctx.Request.SetRequestURI("/readyz")
			a.Handler()(&ctx)
			if got := ctx.Response.StatusCode(); got != c.status {
				t.Errorf("status %d, want %d: %s", got, c.status, ctx.Response.Body())
			}
			var body struct{ Checks map[string]string }
			if err := json.Unmarshal(ctx.Response.Body(), &body); err != nil {
				t.Fatal(err)
			}
			for _, ch := range c.checks {
				want := "ok"
				if ch.Fn(context.Background()) != nil {
					want = down.Error()
				}
				if body.Checks[ch.Name] != want {
					t.Errorf("check %s reported %q, want %q", ch.Name, body.Checks[ch.Name], want)
				}
			}
		})
	}
}
