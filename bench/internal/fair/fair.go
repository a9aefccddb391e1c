// Package fair is bench's fairness mode: a crowd of one sale in which some
// clients are bots (they retry every BotEvery, ignore Retry-After, drop the
// waiting room's ticket on every try and use every target) and the rest
// ask once and then poll as Retry-After tells them, carrying their ticket.
// It reports who won the units, whether purchase order followed arrival
// order, and how long the losers waited to learn that the sale was over.
package fair

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Config is one crowd.
type Config struct {
	// Targets are the proxies' base URLs (http://host:port).
	Targets    []string
	ActivityID int64
	// Polite clients and Bots arrive interleaved, uniformly over Spread.
	Polite, Bots int
	Spread       time.Duration
	// BotEvery is a bot's pace (50 ms: 20 tries/s).
	BotEvery time.Duration
	// Timeout: a client that has neither bought nor learnt "sold out" by
	// then gives up (it counts as never told).
	Timeout time.Duration
	// Tag makes the crowd's users and addresses its own (two crowds of one
	// run do not share identities).
	Tag int
}

// Client is what one client saw.
type Client struct {
	Bot      bool
	Arrival  time.Time // its first request sent
	Won      bool      // a purchase answered 202
	WonAt    time.Time
	Told     bool // a 409 sold_out
	ToldAt   time.Time
	Requests int
}

// Result is a crowd's outcome.
type Result struct {
	Clients []Client
}

// Run sends the crowd and waits for every client to end.
func Run(ctx context.Context, c Config) (Result, error) {
	if len(c.Targets) == 0 || c.Polite+c.Bots == 0 {
		return Result{}, fmt.Errorf("fairness: needs targets and clients")
	}
	hcs := make([]*fasthttp.HostClient, len(c.Targets))
	for i, t := range c.Targets {
		u, err := url.Parse(t)
		if err != nil || u.Host == "" || u.Scheme != "http" {
			return Result{}, fmt.Errorf("fairness: target %q: want http://host:port", t)
		}
		hcs[i] = &fasthttp.HostClient{Addr: u.Host, MaxConns: 4096, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	}
	n := c.Polite + c.Bots
	// One bot every n/Bots arrivals, so each group's arrivals are spread
	// alike over the whole crowd.
	bot := make([]bool, n)
	for k := range c.Bots {
		bot[k*n/c.Bots+(n/c.Bots)/2] = true
	}
	res := Result{Clients: make([]Client, n)}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		at := start.Add(c.Spread * time.Duration(i) / time.Duration(n))
		select {
		case <-ctx.Done():
			wg.Wait()
			return res, ctx.Err()
		case <-time.After(time.Until(at)):
		}
		cl := &res.Clients[i]
		cl.Bot = bot[i]
		wg.Go(func() { c.client(ctx, hcs, i, cl) })
	}
	wg.Wait()
	return res, nil
}

// answer is what a client reads of one reply.
type answer struct {
	status int
	retry  time.Duration
	ticket string
	code   string
}

func (c Config) ask(hc *fasthttp.HostClient, i int, ticket string) (answer, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + hc.Addr + "/api/v1/activities/" + strconv.FormatInt(c.ActivityID, 10) + "/purchase")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.Set("X-User-ID", "fair"+strconv.Itoa(c.Tag)+"-"+strconv.Itoa(i))
	// A distinct address per client (the proxies must trust the bench's
	// own: [proxy] trusted_proxies), as -forwarded-for does.
	req.Header.Set("X-Forwarded-For", "10."+strconv.Itoa(c.Tag&255)+"."+strconv.Itoa(i>>8&255)+"."+strconv.Itoa(i&255))
	if ticket != "" {
		req.Header.Set("Room-Ticket", ticket)
	}
	if err := hc.Do(req, resp); err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode(), ticket: string(resp.Header.Peek("Room-Ticket"))}
	if s, err := strconv.Atoi(string(resp.Header.Peek(fasthttp.HeaderRetryAfter))); err == nil && s > 0 {
		a.retry = time.Duration(s) * time.Second
	}
	if a.status == fasthttp.StatusConflict {
		var b struct {
			Code string `json:"code"`
		}
		_ = json.Unmarshal(resp.Body(), &b)
		a.code = b.Code
	}
	return a, nil
}

func (c Config) client(ctx context.Context, hcs []*fasthttp.HostClient, i int, cl *Client) {
	deadline := time.Now().Add(c.Timeout)
	ticket := ""
	for try := 0; time.Now().Before(deadline) && ctx.Err() == nil; try++ {
		if try == 0 {
			cl.Arrival = time.Now()
		}
		// Polite clients stay with their first target until told to come
		// back; bots spread over every target.
		hc := hcs[i%len(hcs)]
		if cl.Bot {
			hc = hcs[(i+try)%len(hcs)]
		}
		a, err := c.ask(hc, i, ticket)
		cl.Requests++
		wait := c.BotEvery
		switch {
		case err != nil:
			wait = max(wait, time.Second)
		case a.status == fasthttp.StatusAccepted:
			cl.Won, cl.WonAt = true, time.Now()
			return
		case a.status == fasthttp.StatusConflict:
			if a.code == "sold_out" {
				cl.Told, cl.ToldAt = true, time.Now()
			}
			return
		case !cl.Bot:
			if a.ticket != "" {
				ticket = a.ticket
			}
			wait = max(a.retry, time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Group is one kind of client's share.
type Group struct {
	N, Won int
	Rate   float64
}

// Summary is what a crowd showed.
type Summary struct {
	Polite, Bots Group
	// Ratio is the bots' win rate over the polite clients'; RatioUpper its
	// one-sided 95% upper bound (Katz's log method).
	Ratio, RatioUpper float64
	// OrderRho is the rank correlation of purchase order with arrival
	// order among the winners (1: exactly in arrival order).
	OrderRho float64
	// Learnt: how long after the last unit sold (the last 202) the losers
	// learnt "sold out" (p50, p99, max); NeverTold gave up without.
	LearnP50, LearnP99, LearnMax time.Duration
	Losers, NeverTold            int
	Requests                     int
}

// Summarize computes a crowd's summary.
func Summarize(r Result) Summary {
	var s Summary
	var soldOut time.Time
	var winners []Client
	for _, c := range r.Clients {
		g := &s.Polite
		if c.Bot {
			g = &s.Bots
		}
		g.N++
		s.Requests += c.Requests
		if c.Won {
			g.Won++
			winners = append(winners, c)
			if c.WonAt.After(soldOut) {
				soldOut = c.WonAt
			}
		}
	}
	for _, g := range []*Group{&s.Polite, &s.Bots} {
		if g.N > 0 {
			g.Rate = float64(g.Won) / float64(g.N)
		}
	}
	if s.Polite.Rate > 0 {
		s.Ratio = s.Bots.Rate / s.Polite.Rate
	}
	s.RatioUpper = KatzUpper(s.Bots.Won, s.Bots.N, s.Polite.Won, s.Polite.N)
	s.OrderRho = orderRho(winners)
	var learnt []time.Duration
	for _, c := range r.Clients {
		if c.Won {
			continue
		}
		s.Losers++
		if !c.Told {
			s.NeverTold++
			continue
		}
		learnt = append(learnt, max(c.ToldAt.Sub(soldOut), 0))
	}
	slices.Sort(learnt)
	if len(learnt) > 0 {
		s.LearnP50 = learnt[len(learnt)/2]
		s.LearnP99 = learnt[min(len(learnt)-1, len(learnt)*99/100)]
		s.LearnMax = learnt[len(learnt)-1]
	}
	return s
}

// KatzUpper is the one-sided 95% upper bound of the ratio of win rates
// a/n1 over c/n2 (+0.5 to the counts when one is 0; +Inf without data).
func KatzUpper(a, n1, c, n2 int) float64 {
	if n1 == 0 || n2 == 0 {
		return math.Inf(1)
	}
	fa, f1, fc, f2 := float64(a), float64(n1), float64(c), float64(n2)
	if a == 0 || c == 0 {
		fa, f1, fc, f2 = fa+0.5, f1+1, fc+0.5, f2+1
	}
	rr := (fa / f1) / (fc / f2)
	return rr * math.Exp(1.645*math.Sqrt(1/fa-1/f1+1/fc-1/f2))
}

// orderRho is Spearman's rank correlation of arrival and purchase times
// (ties broken at random: they carry no order).
func orderRho(ws []Client) float64 {
	n := len(ws)
	if n < 2 {
		return math.NaN()
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	rank := func(key func(Client) time.Time) []int {
		o := slices.Clone(idx)
		rand.Shuffle(n, func(i, j int) { o[i], o[j] = o[j], o[i] })
		slices.SortStableFunc(o, func(a, b int) int { return key(ws[a]).Compare(key(ws[b])) })
		r := make([]int, n)
		for k, i := range o {
			r[i] = k
		}
		return r
	}
	ra := rank(func(c Client) time.Time { return c.Arrival })
	rw := rank(func(c Client) time.Time { return c.WonAt })
	var d2 float64
	for i := range ra {
		d := float64(ra[i] - rw[i])
		d2 += d * d
	}
	fn := float64(n)
	return 1 - 6*d2/(fn*(fn*fn-1))
}

// Write prints the summary under label.
func (s Summary) Write(w io.Writer, label string) {
	fmt.Fprintf(w, "%s: %d requests\n", label, s.Requests)
	fmt.Fprintf(w, "  units won    polite %d/%d (%.1f%%)  bots %d/%d (%.1f%%)\n",
		s.Polite.Won, s.Polite.N, 100*s.Polite.Rate, s.Bots.Won, s.Bots.N, 100*s.Bots.Rate)
	fmt.Fprintf(w, "  bots/polite  %.2f× (one-sided 95%% upper bound %.2f)\n", s.Ratio, s.RatioUpper)
	fmt.Fprintf(w, "  order        rank correlation of purchase with arrival %.2f (1: arrival order)\n", s.OrderRho)
	fmt.Fprintf(w, "  losers       %d; learnt sold out after the last sale p50 %v p99 %v max %v; never told %d\n",
		s.Losers, s.LearnP50.Round(time.Millisecond), s.LearnP99.Round(time.Millisecond), s.LearnMax.Round(time.Millisecond), s.NeverTold)
}
