package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Attempt is one purchase (with its retries) and what it finally got.
type Attempt struct {
	User, Key string // Key "" sends no Idempotency-Key
	Qty       int64
	Status    int    // final HTTP status; 0: only transport errors
	Code      string // the "code" of an error body
	OrderID   string
	Tries     int
	Started   time.Time     // of the last try
	Elapsed   time.Duration // of the last try
	// Answers lists every answer in order: "202", "409 sold_out", "503
	// unavailable", "error" (transport).
	Answers []string
}

// Crowd is a list of attempts against a sale.
type Crowd struct {
	Sale     Sale
	Attempts []*Attempt
	// Retries of one attempt after a transport error or 503 (same key, next
	// backend), as a real client would.
	Retries int
	// Workers is the number of concurrent clients (64 when 0).
	Workers int
	// Spread, when set, paces the attempts evenly over this long, so that a
	// fault injected meanwhile lands mid-sale.
	Spread time.Duration
	// Prepare, when set, edits each purchase request after its headers are
	// set (e.g. a bearer token for the proxy's JWT identity).
	Prepare func(req *http.Request, a *Attempt)
	// Resend, when n > 0, makes every n-th keyed attempt send its key once
	// more after its final answer (202 or 503), as a client that lost the
	// answer or retries later would: a replay must name the same order (the
	// verifier's ledger checks every 202 of a key). Re-sends are appended
	// to Attempts when Run returns.
	Resend int
	// OnAnswer, when set, is called (concurrently) with every answer as it
	// arrives, in the form of Attempt.Answers: for timelines of a fault.
	OnAnswer func(answer string)

	done atomic.Int64
	mu   sync.Mutex
	// resent holds a run's re-sends until it returns; appended counts those
	// appended to Attempts (mu guards Attempts' length while Run runs).
	resent   []*Attempt
	appended int
}

// NewCrowd makes users × perUser attempts, every fourth user asking for the
// limit at first, some retrying an earlier Idempotency-Key, shuffled; every
// fourth keyed attempt re-sends its key after its answer (Resend).
func NewCrowd(sale Sale, users, perUser int, tag string) *Crowd {
	c := &Crowd{Sale: sale, Retries: 8, Resend: 4}
	for u := range users {
		user := fmt.Sprintf("%s-user-%04d", tag, u)
		for k := range perUser {
			a := &Attempt{User: user, Qty: 1, Key: fmt.Sprintf("%s-k%d", user, k%3)}
			if k == 0 && u%4 == 0 {
				a.Qty = sale.Limit
			}
			c.Attempts = append(c.Attempts, a)
		}
	}
	rand.Shuffle(len(c.Attempts), func(i, j int) { c.Attempts[i], c.Attempts[j] = c.Attempts[j], c.Attempts[i] })
	return c
}

// Done is how many attempts have finished.
func (c *Crowd) Done() int { return int(c.done.Load()) }

// Size is how many attempts Run fires (its re-sends left out). Unlike
// len(Attempts) it may be read while Run runs in another goroutine: Run
// appends the re-sends as it returns.
func (c *Crowd) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.Attempts) - c.appended
}

// Run fires the attempts at the backends (round robin) and returns when all
// are answered.
func (c *Crowd) Run(s *Stack, backends []*Proc) {
	re := c.run(s.HTTP, backends, c.Attempts)
	c.mu.Lock()
	c.Attempts = append(c.Attempts, re...)
	c.appended += len(re)
	c.mu.Unlock()
}

// run answers attempts and returns the re-sends it made (Resend).
func (c *Crowd) run(client *http.Client, backends []*Proc, attempts []*Attempt) []*Attempt {
	workers := c.Workers
	if workers == 0 {
		workers = 64
	}
	var gap time.Duration
	if c.Spread > 0 && len(attempts) > 0 {
		gap = c.Spread / time.Duration(len(attempts))
	}
	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				a := attempts[i]
				c.attempt(client, backends, i, a)
				c.done.Add(1)
				if c.Resend > 0 && i%c.Resend == 0 && a.Key != "" &&
					(a.Status == http.StatusAccepted || a.Status == http.StatusServiceUnavailable) {
					re := &Attempt{User: a.User, Key: a.Key, Qty: a.Qty}
					c.attempt(client, backends, i+1, re)
					c.mu.Lock()
					c.resent = append(c.resent, re)
					c.mu.Unlock()
				}
			}
		}()
	}
	for i := range attempts {
		if gap > 0 {
			if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
				time.Sleep(d)
			}
		}
		work <- i
	}
	close(work)
	wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.resent
	c.resent = nil
	return out
}

func (c *Crowd) attempt(client *http.Client, backends []*Proc, i int, a *Attempt) {
	for try := 0; try <= c.Retries; try++ {
		a.Tries++
		b := backends[(i+try)%len(backends)]
		start := time.Now()
		status, code, id, err := purchase(client, b.URL(), c.Sale.ID, a, c.Prepare)
		a.Status, a.Code, a.OrderID, a.Started, a.Elapsed = status, code, id, start, time.Since(start)
		if err != nil {
			a.Answers = append(a.Answers, "error")
		} else if code != "" {
			a.Answers = append(a.Answers, fmt.Sprintf("%d %s", status, code))
		} else {
			a.Answers = append(a.Answers, fmt.Sprint(status))
		}
		if c.OnAnswer != nil {
			c.OnAnswer(a.Answers[len(a.Answers)-1])
		}
		retry := err != nil || status == http.StatusServiceUnavailable || status == http.StatusBadGateway
		if !retry || a.Key == "" {
			return
		}
		time.Sleep(time.Duration(50+rand.IntN(100)) * time.Millisecond)
	}
}

func purchase(client *http.Client, base string, activity int64, a *Attempt, prepare func(*http.Request, *Attempt)) (int, string, string, error) {
	body, _ := json.Marshal(map[string]int64{"quantity": a.Qty})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/api/v1/activities/%d/purchase", base, activity), bytes.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("X-User-ID", a.User)
	req.Header.Set("Content-Type", "application/json")
	if a.Key != "" {
		req.Header.Set("Idempotency-Key", a.Key)
	}
	if prepare != nil {
		prepare(req, a)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	var out struct {
		OrderID string `json:"order_id"`
		Code    string `json:"code"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return resp.StatusCode, "not_json", "", nil
	}
	if resp.StatusCode == http.StatusAccepted && out.OrderID == "" {
		return resp.StatusCode, "no_order_id", "", nil
	}
	return resp.StatusCode, out.Code, out.OrderID, nil
}

// Once sends attempt a to backend b once, recording its answer like any
// attempt of the crowd (it is not added to Attempts: the caller does).
func (c *Crowd) Once(s *Stack, b *Proc, a *Attempt) {
	one := &Crowd{Sale: c.Sale, Retries: 0, Prepare: c.Prepare}
	one.attempt(s.HTTP, []*Proc{b}, 0, a)
}

// Resolve asks again, with its key, for every keyed attempt whose final
// answer was a transport error (its retries ran out without an answer,
// e.g. its backend died mid-request): its outcome is unknown to the client,
// not "nothing kept", and a real client holding the key would learn it so.
// The answers are appended to Attempts, so that the ledger holds the 202 of
// an order that was confirmed while its client heard nothing. Run it once
// the fault is healed, before the drain.
func (c *Crowd) Resolve(s *Stack) {
	var unknown []*Attempt
	for _, a := range c.Attempts {
		if a.Key != "" && a.Status == 0 {
			unknown = append(unknown, &Attempt{User: a.User, Key: a.Key, Qty: a.Qty})
		}
	}
	if len(unknown) == 0 {
		return
	}
	rc := &Crowd{Sale: c.Sale, Retries: 20, Workers: 16}
	unknown = append(unknown, rc.run(s.HTTP, s.liveBackends(), unknown)...)
	c.Attempts = append(c.Attempts, unknown...)
}

// Accepted returns the attempts answered 202.
func (c *Crowd) Accepted() []*Attempt {
	var out []*Attempt
	for _, a := range c.Attempts {
		if a.Status == http.StatusAccepted {
			out = append(out, a)
		}
	}
	return out
}

// Answers counts every answer given (retries included), e.g. "202": 310.
func (c *Crowd) Answers() map[string]int {
	m := map[string]int{}
	for _, a := range c.Attempts {
		for _, x := range a.Answers {
			m[x]++
		}
	}
	return m
}

// Unexpected lists final answers outside the contract of a sale under
// faults: 202, 409 sold_out / limit_exceeded / insufficient_stock, 503
// unavailable (after the retries ran out), the proxy's 503
// limiter-overloaded (its limiter shed the decision under load; nothing was
// forwarded), and transport errors only when allowErrors.
func (c *Crowd) Unexpected(allowErrors bool) []string {
	var out []string
	for _, a := range c.Attempts {
		for _, x := range a.Answers {
			switch x {
			case "202", "409 sold_out", "409 limit_exceeded", "409 insufficient_stock", "503 unavailable", "503 limiter-overloaded":
				continue
			case "error":
				if allowErrors {
					continue
				}
			}
			out = append(out, fmt.Sprintf("%s key %q: %s", a.User, a.Key, x))
		}
	}
	sort.Strings(out)
	return out
}

// ExpectContract fails t, without stopping it, for final answers outside
// the contract (Unexpected), naming the first five.
func (c *Crowd) ExpectContract(t testing.TB, allowErrors bool) {
	t.Helper()
	if u := c.Unexpected(allowErrors); len(u) > 0 {
		t.Errorf("answers outside the contract: %v", u[:min(len(u), 5)])
	}
}

// Summary is a one-line view of the answers.
func (c *Crowd) Summary() string {
	m := c.Answers()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s×%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
