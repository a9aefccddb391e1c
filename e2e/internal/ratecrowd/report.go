package ratecrowd

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Limits are the windows of the crowd's rule: PerIP and Global requests
// per Window (Global 0: none).
type Limits struct {
	PerIP, Global int
	Window        time.Duration
}

// Report is what a crowd run shows about the limiter.
type Report struct {
	Clients, Targets int
	Sent             int
	Answered         int
	Hung             int // no answer within Plan.Hang
	Broken           int // the connection failed before an answer
	OK, Limited      int // 200, 429
	Unavailable      int // 503
	Other            int
	OtherStatus      map[int]int // the Other answers by status
	// Admitted is the requests that reached the upstream (stamped there),
	// answered or not.
	Admitted int
	// AdmittedNot200 reached the upstream but the client did not read a 200.
	AdmittedNot200 int
	// Degraded answers carried the plan's degraded mark; DegradedAdmitted
	// of them reached the upstream. They are not in the worst intervals.
	Degraded, DegradedAdmitted int
	// Run is the time from the first send to the last; Origin is the
	// first send (the worst intervals are printed from it).
	Run, Origin         time.Duration
	P50, P99, P999, Max time.Duration
	// Allowed is what the limits allow for this demand: the lesser of
	// Ideal's replays at the send times (AllowedSent) and at the moments
	// the requests met the limiter (AllowedMet); see Judge.
	Allowed, AllowedSent, AllowedMet int
	IdealByIP, IdealByGlobal         int
	// WorstGlobal is the global window's worst interval; WorstIP the worst
	// of any client's, WorstIPClient that client; IPOver the clients whose
	// worst interval exceeded the per-IP limit.
	WorstGlobal           Worst
	WorstIP               Worst
	WorstIPClient, IPOver int
	Limits                Limits
}

// Judge measures r against l.
//
// What the limits allow is the lesser of two replays of the crowd's
// requests through Ideal: at their send times, and at the moments they met
// the limiter, estimated as the arrival at the upstream for an admitted
// request and the answer for a refused one. Sliding windows make the count
// depend on phase: under demand above a window's limit an exact limiter
// admits its L in a burst and the next L once those slide out, so over a
// run of length T it admits between L·⌊T/W⌋ and L·(⌊T/W⌋+1) depending on
// when its first burst fell. Replayed at send times alone, every delay
// before the limiter (a queue in a starved client, the proxy's accept)
// would count as under-admission — the windows slide by the delay and the
// run's last partial window is cut short (an exact in-process limiter
// with p99 ~0.6 s on a loaded box read as 87% of the send-time replay,
// TestHarnessOnAnExactLimiter); replayed at the estimated meeting times
// alone, a client too starved to read its answers in time bunches them
// and reads low. With answers in milliseconds both agree; when they do not
// the latency checks already fail the run.
func (r *Result) Judge(l Limits) Report {
	rep := Report{Clients: r.Plan.Clients, Targets: r.Targets, Sent: len(r.Requests), Run: r.End - r.Start,
		Origin: r.Start, Limits: l, OtherStatus: map[int]int{}}
	var lat []time.Duration
	var global []Span
	perClient := map[int32][]Span{}
	clients := make([]int, len(r.Requests))
	sent := make([]time.Duration, len(r.Requests))
	met := make([]time.Duration, len(r.Requests))
	for i, q := range r.Requests {
		// When the request met the limiter, as closely as the test can
		// tell: reaching the upstream follows an admission by a forward,
		// an answer follows a refusal by a write; an unanswered request
		// counts from its send.
		clients[i], sent[i], met[i] = int(q.Client), q.Sent, q.Sent
		switch {
		case q.Reached >= 0:
			met[i] = q.Reached
		case q.Answered >= 0:
			met[i] = q.Answered
		}
		switch {
		case q.Hung:
			rep.Hung++
		case q.Answered < 0:
			rep.Broken++
		default:
			rep.Answered++
			lat = append(lat, q.Answered-q.Sent)
			switch q.Status {
			case 200:
				rep.OK++
			case 429:
				rep.Limited++
			case 503:
				rep.Unavailable++
			default:
				rep.Other++
				rep.OtherStatus[int(q.Status)]++
			}
		}
		if q.Degraded {
			rep.Degraded++
		}
		if q.Reached >= 0 {
			rep.Admitted++
			if q.Status != 200 {
				rep.AdmittedNot200++
			}
			if q.Degraded {
				rep.DegradedAdmitted++
				continue
			}
			s := Span{From: q.Sent, To: q.Reached}
			global = append(global, s)
			perClient[q.Client] = append(perClient[q.Client], s)
		}
	}
	slices.Sort(lat)
	pct := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(q*float64(len(lat))))]
	}
	rep.P50, rep.P99, rep.P999 = pct(0.5), pct(0.99), pct(0.999)
	if len(lat) > 0 {
		rep.Max = lat[len(lat)-1]
	}
	rep.AllowedSent, rep.IdealByIP, rep.IdealByGlobal = Ideal(clients, sent, l.PerIP, l.Global, l.Window)
	rep.AllowedMet, _, _ = Ideal(clients, met, l.PerIP, l.Global, l.Window)
	rep.Allowed = min(rep.AllowedSent, rep.AllowedMet)
	if l.Global > 0 {
		rep.WorstGlobal = WorstInterval(global, l.Window)
	}
	rep.WorstIPClient = -1
	for c, spans := range perClient {
		w := WorstInterval(spans, l.Window)
		if w.N > l.PerIP {
			rep.IPOver++
		}
		if w.N > rep.WorstIP.N || (w.N == rep.WorstIP.N && int(c) < rep.WorstIPClient) {
			rep.WorstIP, rep.WorstIPClient = w, int(c)
		}
	}
	return rep
}

// At is where w's interval starts, in seconds from the first send.
func (rep Report) At(w Worst) float64 { return (w.From - rep.Origin).Seconds() }

// AdmittedShare is Admitted / Allowed.
func (rep Report) AdmittedShare() float64 {
	if rep.Allowed == 0 {
		return 1
	}
	return float64(rep.Admitted) / float64(rep.Allowed)
}

func (rep Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d clients x %d proxies, %d requests over %.2fs (%.0f/s): answered %d (200 %d, 429 %d, 503 %d, other %d %v), hung %d, broken %d\n",
		rep.Clients, rep.Targets, rep.Sent, rep.Run.Seconds(), float64(rep.Sent)/max(rep.Run.Seconds(), 1e-9),
		rep.Answered, rep.OK, rep.Limited, rep.Unavailable, rep.Other, rep.OtherStatus, rep.Hung, rep.Broken)
	fmt.Fprintf(&b, "latency p50 %v p99 %v p99.9 %v max %v\n", rep.P50.Round(10*time.Microsecond),
		rep.P99.Round(10*time.Microsecond), rep.P999.Round(10*time.Microsecond), rep.Max.Round(10*time.Microsecond))
	fmt.Fprintf(&b, "admitted %d (reached the upstream; %d of them not answered 200) of %d the limits allow (%.1f%%; ideal exact limiter at send times %d, refusing %d by per-IP, %d by global; at the moments met %d)\n",
		rep.Admitted, rep.AdmittedNot200, rep.Allowed, 100*rep.AdmittedShare(), rep.AllowedSent, rep.IdealByIP, rep.IdealByGlobal, rep.AllowedMet)
	if rep.Degraded > 0 {
		fmt.Fprintf(&b, "answers marked degraded %d (%d admitted), left out of the windows below\n", rep.Degraded, rep.DegradedAdmitted)
	}
	if rep.Limits.Global > 0 {
		fmt.Fprintf(&b, "global %d/%v: worst interval %d from %.3fs\n", rep.Limits.Global, rep.Limits.Window, rep.WorstGlobal.N, rep.At(rep.WorstGlobal))
	}
	fmt.Fprintf(&b, "per-IP %d/%v: worst interval %d (client %d from %.3fs), %d clients over the limit",
		rep.Limits.PerIP, rep.Limits.Window, rep.WorstIP.N, rep.WorstIPClient, rep.At(rep.WorstIP), rep.IPOver)
	return b.String()
}
