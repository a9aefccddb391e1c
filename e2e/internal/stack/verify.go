package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/internal/verify"
)

// Drain waits (verify.Drainer, the one drain wait) until the order queue is
// empty, the sale is in Redis with nothing pending and every accepted order
// is decided.
func (s *Stack) Drain(t testing.TB, sale Sale, accepted []*Attempt) {
	t.Helper()
	ids := make([]string, 0, len(accepted))
	for _, a := range accepted {
		ids = append(ids, a.OrderID)
	}
	d := &verify.Drainer{DB: s.DB, Redis: s.Redis, Prefix: s.Prefix, AMQPURL: s.AMQPURL,
		Queue: s.Topo.Queue, Partitions: s.Topo.OrderQueues()[1:], DeadQueue: s.Topo.DeadQueue, Accepted: ids}
	res, err := d.Wait(context.Background(), sale.ID, 2*time.Minute, nil)
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	if !res.Drained {
		t.Fatalf("drain: %s", res.Problem)
	}
}

// Finish ends a crowd test: resolves the keyed attempts left without an
// answer (Crowd.Resolve), drains the accepted orders, sells what is left
// (MopUp) and checks I1–I5 (Check) under the name fault.
func (s *Stack) Finish(t testing.TB, fault string, sale Sale, c *Crowd) Verdict {
	t.Helper()
	c.Resolve(s)
	s.Drain(t, sale, c.Accepted())
	s.MopUp(t, sale, c)
	return s.Check(t, fault, sale, c)
}

// MopUp sells what is left so that the sale ends sold out ("sold out" only
// once nothing is left), draining in between. It returns the extra attempts.
func (s *Stack) MopUp(t testing.TB, sale Sale, crowd *Crowd) {
	t.Helper()
	ctx := context.Background()
	for round := 0; ; round++ {
		var left int64
		servicetest.Must(t, s.DB.QueryRowContext(ctx, "SELECT stock FROM activities WHERE id = ?", sale.ID).Scan(&left), "stock")
		if left == 0 {
			return
		}
		if round == 8 {
			t.Fatalf("%d units still unsold in MySQL after %d mop-up rounds (Redis: %s)", left, round, s.redisView(sale.ID))
		}
		var more []*Attempt
		for i := range left + 5 {
			u := fmt.Sprintf("mopup-%d-%03d", round, i)
			more = append(more, &Attempt{User: u, Key: u, Qty: 1})
		}
		mc := &Crowd{Sale: sale, Retries: crowd.Retries, Workers: 16}
		more = append(more, mc.run(s.HTTP, s.liveBackends(), more)...)
		crowd.Attempts = append(crowd.Attempts, more...)
		s.Drain(t, sale, crowd.Accepted())
	}
}

func (s *Stack) liveBackends() []*Proc {
	var out []*Proc
	for _, b := range s.Backends {
		if b.Running() {
			out = append(out, b)
		}
	}
	return out
}

func (s *Stack) redisView(id int64) string {
	rs, found, err := s.Res.Sale(context.Background(), id)
	return fmt.Sprintf("%+v found=%v err=%v", rs, found, err)
}

// Verdict is the outcome of a fault case, one row of `make chaos`.
type Verdict struct {
	Fault    string
	Attempts int
	verify.Verdict
}

// Check asserts I1–I5 for the sale with the one verifier (internal/verify).
// Convergence (I5) is given up to 20s: the reconciler repairs drift a fault
// left behind (the fault configs run it every second). A purchase after the
// sale must then get 409 sold_out exactly when nothing is left. The verdict
// is returned and, under SECKILL_CHAOS_REPORT, appended to the report file
// as a table row.
func (s *Stack) Check(t testing.TB, fault string, sale Sale, crowd *Crowd) Verdict {
	t.Helper()
	ctx := context.Background()
	checker := &verify.Checker{DB: s.DB, Redis: s.Redis, Prefix: s.Prefix}
	// The crowd records every answer: the ledger check applies.
	in := verify.Input{ActivityID: sale.ID, Stock: sale.Stock, Limit: sale.Limit, RedisLost: s.RedisLost, Ledger: true}
	for _, a := range crowd.Attempts {
		if a.Status == http.StatusAccepted {
			in.Accepted = append(in.Accepted, verify.Accepted{OrderID: a.OrderID, UserID: a.User, Key: a.Key})
		}
	}
	var st verify.State
	var v verify.Verdict
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		st, err = checker.Read(ctx, sale.ID, in.Accepted)
		servicetest.Must(t, err, "read the sale for the verdict")
		in.API = s.apiState(t, sale.ID)
		if v = verify.Evaluate(st, in); v.OK || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	// A 503 means "not known now, retry": the probe retries it (a loaded
	// machine may time out a few Redis calls) and judges its final answer.
	probe := &Attempt{User: "after-the-sale", Key: "after", Qty: 1}
	(&Crowd{Sale: sale, Retries: 20, Workers: 1}).run(s.HTTP, s.liveBackends(), []*Attempt{probe})
	in.AfterSale = &verify.Answer{Status: probe.Status, Code: probe.Code}
	out := Verdict{Fault: fault, Attempts: len(crowd.Attempts), Verdict: verify.Evaluate(st, in)}
	Report(out)
	for _, r := range out.Reasons {
		t.Error(r)
	}
	t.Logf("%s: %s; attempts %d accepted %d confirmed %d failed %d; answers: %s",
		fault, out.Line(), out.Attempts, out.AcceptedOrders, out.ConfirmedOrders, out.FailedOrders, crowd.Summary())
	return out
}

// apiState reads GET /api/v1/activities/{id} from a running backend.
func (s *Stack) apiState(t testing.TB, id int64) *verify.APIState {
	t.Helper()
	for _, b := range s.liveBackends() {
		resp, err := s.HTTP.Get(fmt.Sprintf("%s/api/v1/activities/%d", b.URL(), id))
		if err != nil {
			continue
		}
		var st verify.APIState
		err = json.NewDecoder(resp.Body).Decode(&st)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK && err == nil {
			return &st
		}
	}
	t.Fatalf("no backend answered the sale state of activity %d", id)
	return nil
}

// EnvReport names the file `make chaos` collects verdict rows in.
const EnvReport = "SECKILL_CHAOS_REPORT"

// Report appends v as a tab-separated row (fault, attempts, accepted,
// confirmed, failed, oversold, duplicates, lost, verdict) to the file named
// by SECKILL_CHAOS_REPORT; without it, it does nothing.
func Report(v Verdict) {
	path := os.Getenv(EnvReport)
	if path == "" {
		return
	}
	verdict := "ok"
	if !v.OK {
		verdict = "FAIL"
	}
	line := strings.Join([]string{v.Fault, fmt.Sprint(v.Attempts), fmt.Sprint(v.AcceptedOrders), fmt.Sprint(v.ConfirmedOrders),
		fmt.Sprint(v.FailedOrders), fmt.Sprint(v.Oversold), fmt.Sprint(v.Duplicates), fmt.Sprint(v.Lost), verdict}, "\t") + "\n"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	_, _ = f.WriteString(line)
	_ = f.Close()
}
