package load

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/bench/internal/hist"
)

// The read mix of a flash sale: buyers refresh the sale page before it opens
// (state polls, Config.StatePollRate per second through the warm-up) and,
// after a 202, wait for their order's result (Config.OrderWait: long-polls of
// GET /api/v1/orders/{id}?wait=, repeated until the order is settled). Reads
// are counted apart from the purchases; they never change the verdict.

// maxWaits bounds the order waits in flight; an accepted order beyond it is
// counted as skipped.
const maxWaits = 20_000

// ReadKind is one kind of read.
type ReadKind struct {
	Requests int64            `json:"requests"`
	Mix      map[string]int64 `json:"answers"`
	Latency  hist.Summary     `json:"latency"`
}

// ReadsSnapshot are the reads of a run.
type ReadsSnapshot struct {
	StatePollRate int     `json:"state_poll_rate"`
	OrderWait     float64 `json:"order_wait_seconds"`
	// StatePolls: sale-state GETs of the warm-up; latency per request.
	StatePolls ReadKind `json:"state_polls"`
	// OrderWaits: one per accepted order; latency from the 202 to the final
	// answer; Requests counts the long-polls it took; Mix the final status.
	OrderWaits ReadKind `json:"order_waits"`
	// Skipped accepted orders had no wait (more than maxWaits in flight).
	Skipped int64 `json:"order_waits_skipped"`
}

type readKind struct {
	requests atomic.Int64
	mu       sync.Mutex
	mix      map[string]int64
	hist     *hist.Histogram
}

func newReadKind() *readKind { return &readKind{mix: map[string]int64{}, hist: hist.New(7)} }

func (k *readKind) record(outcome string, d time.Duration) {
	k.mu.Lock()
	k.mix[outcome]++
	k.hist.RecordDuration(d)
	k.mu.Unlock()
}

func (k *readKind) snapshot() ReadKind {
	k.mu.Lock()
	defer k.mu.Unlock()
	mix := make(map[string]int64, len(k.mix))
	for m, n := range k.mix {
		mix[m] = n
	}
	return ReadKind{Requests: k.requests.Load(), Mix: mix, Latency: k.hist.Summarize()}
}

type reads struct {
	state, orders *readKind
	waits         sync.WaitGroup
	inFlight      atomic.Int64
	skipped       atomic.Int64
	ctx           context.Context
}

func newReads() *reads {
	return &reads{state: newReadKind(), orders: newReadKind(), ctx: context.Background()}
}

// pollState reads the sale state at StatePollRate per second until the rush
// starts (open loop: a slow answer does not slow the polls down).
func (r *Runner) pollState(ctx context.Context, tl Timeline) {
	if r.cfg.StatePollRate <= 0 {
		return
	}
	interval := float64(time.Second) / float64(r.cfg.StatePollRate)
	sem := make(chan struct{}, 1024)
	var wg sync.WaitGroup
	for i := 0; ; i++ {
		at := tl.Start.Add(time.Duration(float64(i) * interval))
		if !at.Before(tl.RushStart) || ctx.Err() != nil {
			break
		}
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		select {
		case sem <- struct{}{}:
		default:
			r.reads.state.record("skipped (1024 in flight)", 0)
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			t := r.nextTarget()
			src := r.sourceOf(rand.IntN(r.cfg.Users))
			r.reads.state.requests.Add(1)
			status, code, _, _, err := r.do(t, src, fasthttp.MethodGet, t.stateURL, "", "", nil)
			outcome := MixKey(status, code)
			if err != nil {
				outcome = errKind(err)
			}
			r.reads.state.record(outcome, time.Since(at))
		})
	}
	wg.Wait()
}

// waitOrder starts the wait for an accepted order's result.
func (r *Runner) waitOrder(orderID, userID string, src int, accepted time.Time) {
	if r.cfg.OrderWait <= 0 {
		return
	}
	if r.reads.inFlight.Add(1) > maxWaits {
		r.reads.inFlight.Add(-1)
		r.reads.skipped.Add(1)
		return
	}
	r.reads.waits.Go(func() {
		defer r.reads.inFlight.Add(-1)
		wait := strconv.FormatInt(r.cfg.OrderWait.Milliseconds(), 10) + "ms"
		outcome := "pending (gave up)"
		for round := 0; round < 30 && r.reads.ctx.Err() == nil; round++ {
			t := r.nextTarget()
			r.reads.orders.requests.Add(1)
			status, body, err := r.get(t, src, t.orderURL+orderID+"?wait="+wait, userID)
			if err != nil {
				outcome = errKind(err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			var v struct {
				Status string `json:"status"`
			}
			_ = json.Unmarshal(body, &v)
			if status != 200 {
				outcome = MixKey(status, "")
				if status == 429 || status >= 500 {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				break
			}
			if outcome = v.Status; outcome != "pending" {
				break
			}
		}
		r.reads.orders.record(outcome, time.Since(accepted))
	})
}

// get sends one GET and returns status and body.
func (r *Runner) get(t *target, src int, uri, user string) (int, []byte, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(uri)
	if user != "" {
		req.Header.Set("X-User-ID", user)
	}
	if r.cfg.ForwardedFor && src >= 0 {
		req.Header.Set("X-Forwarded-For", r.cfg.Sources[src].String())
	}
	c := t.waitClients[0]
	if src >= 0 && len(t.waitClients) > 1 {
		c = t.waitClients[src]
	}
	if err := c.DoTimeout(req, resp, r.cfg.RequestTimeout+r.cfg.OrderWait); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

// WaitReads waits for the order waits still in flight (their orders settle
// while the queue drains), or for ctx.
func (r *Runner) WaitReads(ctx context.Context) {
	r.reads.ctx = ctx
	done := make(chan struct{})
	go func() { r.reads.waits.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Reads returns the read mix of the run.
func (r *Runner) Reads() ReadsSnapshot {
	return ReadsSnapshot{
		StatePollRate: r.cfg.StatePollRate, OrderWait: r.cfg.OrderWait.Seconds(),
		StatePolls: r.reads.state.snapshot(), OrderWaits: r.reads.orders.snapshot(), Skipped: r.reads.skipped.Load(),
	}
}
