package api

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/backend/internal/sale"
)

// Every purchase outcome and every service error, translated to HTTP: the
// status, the exact body docs/contract.md promises and Retry-After.
func TestAnswers(t *testing.T) {
	a := New(nil, Config{RetryAfter: 1500 * time.Millisecond}, nil, nil, slog.New(slog.DiscardHandler), nil)
	type want struct {
		status     int
		body       string
		retryAfter string
	}
	outcomes := []struct {
		res  sale.PurchaseResult
		want want
	}{
		{sale.PurchaseResult{Outcome: sale.Accepted, OrderID: "7-abc", Status: "pending"},
			want{202, `{"order_id":"7-abc","status":"pending"}`, ""}},
		{sale.PurchaseResult{Outcome: sale.Accepted, OrderID: "7-abc", Status: "failed", Replay: true},
			want{202, `{"order_id":"7-abc","status":"failed"}`, ""}},
		{sale.PurchaseResult{Outcome: sale.SoldOut},
			want{409, `{"code":"sold_out","message":"sold out"}`, ""}},
		{sale.PurchaseResult{Outcome: sale.Insufficient, Available: 2},
			want{409, `{"available":2,"code":"insufficient_stock","message":"only 2 units left"}`, ""}},
		{sale.PurchaseResult{Outcome: sale.LimitExceeded, Held: 2, Limit: 3},
			want{409, `{"code":"limit_exceeded","held":2,"limit":3,"message":"holding 2 of 3 allowed"}`, ""}},
		{sale.PurchaseResult{Outcome: sale.NotStarted},
			want{409, `{"code":"not_started","message":"the sale has not started"}`, ""}},
		{sale.PurchaseResult{Outcome: sale.Ended},
			want{409, `{"code":"ended","message":"the sale has ended"}`, ""}},
		{sale.PurchaseResult{Outcome: sale.BadQuantity, Limit: 3},
			want{400, `{"code":"bad_request","limit":3,"message":"quantity must be between 1 and 3"}`, ""}},
		{sale.PurchaseResult{Outcome: "replay"},
			want{500, `{"code":"internal","message":"unexpected outcome"}`, ""}},
	}
	check := func(t *testing.T, ctx *fasthttp.RequestCtx, w want) {
		t.Helper()
		if got := ctx.Response.StatusCode(); got != w.status {
			t.Errorf("status %d, want %d", got, w.status)
		}
		if got := string(ctx.Response.Body()); got != w.body {
			t.Errorf("body %s\nwant %s", got, w.body)
		}
		if got := string(ctx.Response.Header.ContentType()); got != "application/json" {
			t.Errorf("content type %q", got)
		}
		if got := string(ctx.Response.Header.Peek("Retry-After")); got != w.retryAfter {
			t.Errorf("Retry-After %q, want %q", got, w.retryAfter)
		}
	}
	covered := map[sale.Outcome]bool{}
	for _, c := range outcomes {
		t.Run(fmt.Sprintf("%s/%v", c.res.Outcome, c.res.Replay), func(t *testing.T) {
			var ctx fasthttp.RequestCtx
			a.writeOutcome(&ctx, c.res)
			check(t, &ctx, c.want)
		})
		covered[c.res.Outcome] = true
	}
	for _, o := range sale.Outcomes {
		if !covered[o] {
			t.Errorf("outcome %q has no case here", o)
		}
		if _, ok := outcomeAnswers[o]; !ok {
			t.Errorf("outcome %q has no answer", o)
		}
	}
	if len(outcomeAnswers) != len(sale.Outcomes) {
		t.Errorf("%d answers for %d outcomes", len(outcomeAnswers), len(sale.Outcomes))
	}

	unavailable := want{503, `{"code":"unavailable","message":"temporarily unavailable; retry later"}`, "2"}
	errs := []struct {
		err  error
		want want
	}{
		{sale.ErrActivityNotFound, want{404, `{"code":"activity_not_found","message":"activity not found"}`, ""}},
		{fmt.Errorf("read: %w", sale.ErrOrderNotFound), want{404, `{"code":"order_not_found","message":"order not found"}`, ""}},
		{fmt.Errorf("%w: stock 3 below sold 5", sale.ErrConflict),
			want{409, `{"code":"stock_conflict","message":"` + sale.ErrConflict.Error() + `: stock 3 below sold 5"}`, ""}},
		{fmt.Errorf("%w: publish timed out", sale.ErrUnavailable), unavailable},
		{errors.New("something sale did not expect"), unavailable},
	}
	for _, c := range errs {
		t.Run(c.err.Error(), func(t *testing.T) {
			var ctx fasthttp.RequestCtx
			a.serviceError(&ctx, c.err)
			check(t, &ctx, c.want)
		})
	}
}
