package fair

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/internal/servicetest"
)

func TestSummarize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	r := Result{Clients: []Client{
		{Arrival: at(0), Won: true, WonAt: at(100), Requests: 2},
		{Arrival: at(10), Won: true, WonAt: at(200), Requests: 2},
		{Bot: true, Arrival: at(20), Won: true, WonAt: at(300), Requests: 9},
		{Arrival: at(30), Told: true, ToldAt: at(400), Requests: 3},
		{Bot: true, Arrival: at(40), Told: true, ToldAt: at(1300), Requests: 20},
		{Arrival: at(50), Requests: 5}, // gave up
	}}
	s := Summarize(r)
	if s.Polite.N != 4 || s.Polite.Won != 2 || s.Bots.N != 2 || s.Bots.Won != 1 || s.Requests != 41 {
		t.Fatalf("groups %+v %+v requests %d", s.Polite, s.Bots, s.Requests)
	}
	if s.Ratio != 1 || s.OrderRho != 1 {
		t.Errorf("ratio %v rho %v, want 1, 1", s.Ratio, s.OrderRho)
	}
	if s.Losers != 3 || s.NeverTold != 1 || s.LearnMax != time.Second || s.LearnP50 != time.Second {
		t.Errorf("losers %d never %d learnt p50 %v max %v", s.Losers, s.NeverTold, s.LearnP50, s.LearnMax)
	}
	if u := KatzUpper(10, 40, 50, 200); u < 1.5 || u > 1.8 {
		t.Errorf("KatzUpper(10/40 vs 50/200) = %.2f, want about 1.64", u)
	}
	if !math.IsInf(KatzUpper(1, 0, 1, 1), 1) {
		t.Error("no bots: want +Inf")
	}
	var b strings.Builder
	s.Write(&b, "room on")
	if !strings.Contains(b.String(), "bots/polite  1.00×") {
		t.Errorf("report:\n%s", b.String())
	}
}

// Run against a shop without a room that answers every third request 429
// (Retry-After: 1) while units last: every unit is won once, every loser
// learns sold out, bots try far more often than polite clients.
func TestRun(t *testing.T) {
	t.Parallel()
	var stock, n atomic.Int64
	stock.Store(10)
	addr := servicetest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if len(ctx.Request.Header.Peek("X-Forwarded-For")) == 0 || len(ctx.Request.Header.Peek("X-User-ID")) == 0 {
			ctx.SetStatusCode(400)
			return
		}
		if n.Add(1)%3 == 0 && stock.Load() > 0 {
			ctx.Response.Header.Set("Retry-After", "1")
			ctx.SetStatusCode(429)
			return
		}
		if stock.Add(-1) >= 0 {
			ctx.SetStatusCode(202)
			return
		}
		ctx.SetStatusCode(409)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"code":"sold_out"}`)
	}})
	res, err := Run(context.Background(), Config{Targets: []string{"http://" + addr}, ActivityID: 1, Polite: 40, Bots: 10,
		Spread: 100 * time.Millisecond, BotEvery: 10 * time.Millisecond, Timeout: 10 * time.Second, Tag: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(res)
	if s.Polite.Won+s.Bots.Won != 10 || s.NeverTold != 0 || s.Losers != 40 || s.Bots.N != 10 {
		t.Errorf("summary %+v", s)
	}
}
