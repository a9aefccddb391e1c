// Package report turns a run into what people read: a table on stdout, a
// JSON document and a self-contained HTML page with charts (no network).
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/seckill/seckill/bench/internal/hist"
	"github.com/seckill/seckill/bench/internal/load"
	"github.com/seckill/seckill/internal/redisnodes"
	"github.com/seckill/seckill/internal/verify"
)

// Run describes the scenario that was run.
type Run struct {
	StartedAt    time.Time `json:"started_at"`
	Targets      []string  `json:"targets"`
	AdminURL     string    `json:"admin_url"`
	ActivityID   int64     `json:"activity_id"`
	Stock        int       `json:"stock"`
	PerUserLimit int       `json:"per_user_limit"`
	Users        int       `json:"users"`
	Model        string    `json:"model"` // "open" or "closed"
	Rate         int       `json:"rate,omitempty"`
	Connections  int       `json:"connections,omitempty"`
	Warmup       float64   `json:"warmup_seconds"`
	Rush         float64   `json:"rush_seconds"`
	Tail         float64   `json:"tail_seconds"`
	SourceIPs    int       `json:"source_ips"`
	HotShare     float64   `json:"hot_share"`
	UnkeyedShare float64   `json:"unkeyed_share,omitempty"`
	ReplayShare  float64   `json:"replay_share,omitempty"`
	ForwardedFor bool      `json:"forwarded_for"`
	Retries      int       `json:"max_retries"`
	Redis        string    `json:"redis,omitempty"` // conf.RedisKind: node, cluster, sentinel
}

// Phase is one phase's figures.
type Phase struct {
	Name       string           `json:"name"`
	Requests   int64            `json:"requests"`
	Seconds    float64          `json:"seconds"`
	Throughput float64          `json:"requests_per_second"`
	Classes    map[string]int64 `json:"outcomes"`
	Latency    hist.Summary     `json:"latency"`
}

// ClassLatency is the latency of one outcome class (purchases of rush + tail).
type ClassLatency struct {
	Class string `json:"outcome"`
	hist.Summary
}

// Point is one bucket of the timeline.
type Point struct {
	T       float64   `json:"t"`      // seconds since the start, bucket start
	PerSec  []float64 `json:"per_s"`  // answers/s per class, in Classes order
	P50     float64   `json:"p50_ms"` // latency of purchases finishing in the bucket
	P99     float64   `json:"p99_ms"`
	Max     float64   `json:"max_ms"`
	Answers int64     `json:"answers"`
}

// Timeline is the run over time.
type Timeline struct {
	BucketSeconds float64  `json:"bucket_seconds"`
	RushStart     float64  `json:"rush_start"`
	TailStart     float64  `json:"tail_start"`
	End           float64  `json:"end"`
	Classes       []string `json:"classes"`
	Points        []Point  `json:"points"`
}

// Summary gathers the headline numbers.
type Summary struct {
	Purchases      int64   `json:"purchases"`
	Seconds        float64 `json:"seconds"`
	Throughput     float64 `json:"requests_per_second"`
	Accepted       int64   `json:"accepted"`
	AcceptedPerSec float64 `json:"accepted_per_second_rush"`
	SoldOutPerSec  float64 `json:"sold_out_per_second_tail"`
	Retries        int64   `json:"retries"`
	DistinctUsers  int64   `json:"distinct_users"`
	DistinctIPs    int64   `json:"distinct_source_ips"`
	// SoldOutAfter is seconds from the rush start to the first sold-out
	// answer; -1 when none came.
	SoldOutAfter float64 `json:"sold_out_after_seconds"`
	// Confirmed per second end to end: confirmed units over rush + tail +
	// drain time.
	ConfirmedPerSec float64 `json:"confirmed_per_second_end_to_end"`
}

// Report is the whole result of a run; it is also the JSON document.
type Report struct {
	Tool     string          `json:"tool"`
	Run      Run             `json:"run"`
	Summary  Summary         `json:"summary"`
	Phases   []Phase         `json:"phases"`
	Latency  []ClassLatency  `json:"latency"`
	Mix      []load.MixEntry `json:"answers"`
	ReadMix  []load.MixEntry `json:"warmup_answers"`
	RetryMix []load.MixEntry `json:"retried_answers"`
	// ReplayMix: the answers to the tail's replays of keys answered 202.
	ReplayMix []load.MixEntry    `json:"replay_answers,omitempty"`
	Timeline  Timeline           `json:"timeline"`
	Drain     verify.DrainResult `json:"drain"`
	// Reads are the read mix (sale-state polls, order waits); nil when the
	// run had none.
	Reads    *load.ReadsSnapshot `json:"reads,omitempty"`
	API      *verify.APIState    `json:"api_state,omitempty"`
	Verdict  verify.Verdict      `json:"verdict"`
	Line     string              `json:"verdict_line"`
	Problems []string            `json:"problems,omitempty"`
	// CPU per process over the scenario (-cpu); nil when not asked for.
	CPU *CPU `json:"cpu,omitempty"`
	// Ceilings are the raw ceilings of the same run beside this run's
	// figures (-ceilings); empty when not given.
	Ceilings []Ceiling `json:"ceilings,omitempty"`
	// RedisCalls: each Redis master's commands over the load (warm-up,
	// rush and tail; not the drain), from INFO commandstats before and
	// after; nil when they could not be read.
	RedisCalls []NodeCalls `json:"redis_calls,omitempty"`
}

// NodeCalls is one Redis master's commands over the load. The bench's own
// INFO calls are left out; every other client of the node counts. Redis
// counts the commands a script runs as well: Calls is work done, Scripts
// (EVALSHA and EVAL, also the _RO forms) are calls sent.
type NodeCalls struct {
	Node     string           `json:"node"`
	Calls    int64            `json:"calls"`
	Scripts  int64            `json:"script_calls"`
	Commands map[string]int64 `json:"commands"`
}

// RedisCallsOver is the per-master delta between two INFO commandstats
// readings (redisnodes.CommandCalls), by node address; a master that
// appeared in between (a failover) counts from zero.
func RedisCallsOver(before, after map[string]redisnodes.Calls) []NodeCalls {
	out := make([]NodeCalls, 0, len(after))
	for node, a := range after {
		d := a.Since(before[node])
		delete(d, "info")
		n := NodeCalls{Node: node, Commands: d}
		for cmd, c := range d {
			n.Calls += c
			switch cmd {
			case "evalsha", "eval", "evalsha_ro", "eval_ro":
				n.Scripts += c
			}
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// Build assembles a report.
func Build(run Run, snap load.Snapshot, tl load.Timeline, drain verify.DrainResult, api *verify.APIState, v verify.Verdict) *Report {
	r := &Report{Tool: "seckill-bench", Run: run, Drain: drain, API: api, Verdict: v, Line: v.Line(), Mix: snap.Mix, ReadMix: snap.ReadMix, RetryMix: snap.RetryMix, ReplayMix: snap.ReplayMix}
	if r.Mix == nil {
		r.Mix = []load.MixEntry{}
	}
	for _, p := range load.Phases {
		ps := snap.Phases[p]
		ph := Phase{Name: p.String(), Requests: ps.Requests, Classes: map[string]int64{}}
		if ps.Hist != nil {
			ph.Latency = ps.Hist.Summarize()
		}
		if ps.Requests > 0 && ps.Last.After(ps.First) {
			ph.Seconds = ps.Last.Sub(ps.First).Seconds()
			ph.Throughput = float64(ps.Requests) / ph.Seconds
		}
		for _, c := range load.Classes {
			if n := ps.Classes[c]; n > 0 {
				ph.Classes[c.String()] = n
			}
		}
		r.Phases = append(r.Phases, ph)
	}
	for _, c := range load.Classes {
		if h := snap.Classes[c]; h != nil && h.Count() > 0 {
			r.Latency = append(r.Latency, ClassLatency{Class: c.String(), Summary: h.Summarize()})
		}
	}
	if snap.All != nil {
		r.Latency = append(r.Latency, ClassLatency{Class: "all", Summary: snap.All.Summarize()})
	}

	s := &r.Summary
	rush, tail := snap.Phases[load.Rush], snap.Phases[load.Tail]
	s.Purchases = rush.Requests + tail.Requests
	first, last := rush.First, tail.Last
	if first.IsZero() {
		first = tail.First
	}
	if last.IsZero() {
		last = rush.Last
	}
	if s.Purchases > 0 && last.After(first) {
		s.Seconds = last.Sub(first).Seconds()
		s.Throughput = float64(s.Purchases) / s.Seconds
	}
	s.Accepted = rush.Classes[load.Accepted] + tail.Classes[load.Accepted]
	if run.Rush > 0 {
		s.AcceptedPerSec = float64(rush.Classes[load.Accepted]) / run.Rush
	}
	if run.Tail > 0 {
		s.SoldOutPerSec = float64(tail.Classes[load.SoldOut]) / run.Tail
	}
	s.Retries, s.DistinctUsers, s.DistinctIPs = snap.Retries, snap.DistinctUser, snap.DistinctIPs
	if t := s.Seconds + drain.Seconds; t > 0 {
		s.ConfirmedPerSec = float64(v.Sold) / t
	}

	b := snap.Bucket.Seconds()
	r.Timeline = Timeline{BucketSeconds: b, RushStart: tl.RushStart.Sub(tl.Start).Seconds(),
		TailStart: tl.TailStart.Sub(tl.Start).Seconds(), End: tl.End.Sub(tl.Start).Seconds(), Points: []Point{}}
	for _, c := range load.Classes {
		r.Timeline.Classes = append(r.Timeline.Classes, c.String())
	}
	s.SoldOutAfter = -1
	for i, p := range snap.Series {
		pt := Point{T: float64(i) * b, PerSec: make([]float64, len(load.Classes))}
		for j, c := range load.Classes {
			pt.PerSec[j] = float64(p.Classes[c]) / b
			pt.Answers += p.Classes[c]
		}
		if p.Hist != nil && p.Hist.Count() > 0 {
			pt.P50 = float64(p.Hist.Quantile(0.5)) / 1000
			pt.P99 = float64(p.Hist.Quantile(0.99)) / 1000
			pt.Max = float64(p.Hist.Max()) / 1000
		}
		if s.SoldOutAfter < 0 && p.Classes[load.SoldOut] > 0 {
			s.SoldOutAfter = max(0, pt.T-r.Timeline.RushStart)
		}
		r.Timeline.Points = append(r.Timeline.Points, pt)
	}
	return r
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteFile writes with fn into path (created or truncated).
func WriteFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// WriteTable writes the human-readable report; its last line is the verdict.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	run := r.Run
	model := fmt.Sprintf("closed loop, %d connections", run.Connections)
	if run.Model == "open" {
		model = fmt.Sprintf("open loop, %d req/s", run.Rate)
	}
	fmt.Fprintf(&b, "\nseckill bench: activity %d, %d units, limit %d per user, %d users, %s\n",
		run.ActivityID, run.Stock, run.PerUserLimit, run.Users, model)
	src := fmt.Sprintf("%d source addresses", run.SourceIPs)
	if run.ForwardedFor {
		src += " (X-Forwarded-For)"
	}
	keys := ""
	if run.UnkeyedShare > 0 {
		keys = fmt.Sprintf("; %.0f%% of purchases without an Idempotency-Key", run.UnkeyedShare*100)
	}
	fmt.Fprintf(&b, "targets: %s; %s, %.0f%% of users behind shared ones%s\n\n",
		strings.Join(run.Targets, " "), src, run.HotShare*100, keys)

	fmt.Fprintf(&b, "%-8s %9s %8s %9s", "phase", "requests", "seconds", "req/s")
	for _, c := range load.Classes {
		fmt.Fprintf(&b, " %12s", c)
	}
	b.WriteString("\n")
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "%-8s %9d %8.2f %9.0f", p.Name, p.Requests, p.Seconds, p.Throughput)
		for _, c := range load.Classes {
			fmt.Fprintf(&b, " %12d", p.Classes[c.String()])
		}
		b.WriteString("\n")
	}
	b.WriteString("(warm-up: reads of the sale's state")
	for _, m := range r.ReadMix {
		fmt.Fprintf(&b, "; %s: %d", m.Key, m.Count)
	}
	b.WriteString("; rush and tail: purchases)\n\n")

	fmt.Fprintf(&b, "%-14s %9s %9s %9s %9s %9s %9s\n", "latency (ms)", "count", "p50", "p90", "p99", "p99.9", "max")
	for _, l := range r.Latency {
		fmt.Fprintf(&b, "%-14s %9d %9.2f %9.2f %9.2f %9.2f %9.2f\n", l.Class, l.Count, l.P50, l.P90, l.P99, l.P999, l.Max)
	}
	b.WriteString("(purchases of rush and tail, from the intended send time, retries included)\n\n")

	total := int64(0)
	for _, m := range r.Mix {
		total += m.Count
	}
	fmt.Fprintf(&b, "%-34s %9s %7s\n", "answers (status code)", "count", "share")
	for _, m := range r.Mix {
		share := 0.0
		if total > 0 {
			share = 100 * float64(m.Count) / float64(total)
		}
		fmt.Fprintf(&b, "%-34s %9d %6.1f%%\n", m.Key, m.Count, share)
	}
	if rd := r.Reads; rd != nil && (rd.StatePolls.Requests > 0 || rd.OrderWaits.Latency.Count > 0) {
		b.WriteString("\n")
		writeReads(&b, rd)
	}
	s := r.Summary
	fmt.Fprintf(&b, "\nthroughput: %.0f purchases/s over %.2f s; %.0f accepted/s in the rush; %.0f sold-out answers/s in the tail\n",
		s.Throughput, s.Seconds, s.AcceptedPerSec, s.SoldOutPerSec)
	soldOut := "never"
	if s.SoldOutAfter >= 0 {
		soldOut = fmt.Sprintf("%.2f s into the rush", s.SoldOutAfter)
	}
	fmt.Fprintf(&b, "clients: %d distinct users, %d source addresses, %d retries; first sold-out answer %s\n",
		s.DistinctUsers, s.DistinctIPs, s.Retries, soldOut)
	if len(r.ReplayMix) > 0 {
		// The contract: a replay of an accepted order gets that order
		// (or 503 while unknown), never sold_out.
		var n, soldOut int64
		b.WriteString("tail replays of keys answered 202:")
		for _, m := range r.ReplayMix {
			fmt.Fprintf(&b, " %s ×%d;", m.Key, m.Count)
			n += m.Count
			if strings.HasPrefix(m.Key, "409") {
				soldOut += m.Count
			}
		}
		var tail int64
		for _, p := range r.Phases {
			if p.Name == load.Tail.String() {
				tail = p.Requests
			}
		}
		fmt.Fprintf(&b, " %d of %d tail purchases", n, tail)
		if soldOut > 0 {
			fmt.Fprintf(&b, "; CONTRACT BROKEN: %d replays answered 409", soldOut)
		}
		b.WriteString("\n")
	}
	if len(r.RetryMix) > 0 {
		b.WriteString("retried (same Idempotency-Key) after:")
		for _, m := range r.RetryMix {
			fmt.Fprintf(&b, " %s ×%d;", m.Key, m.Count)
		}
		b.WriteString("\n")
	}
	d := r.Drain
	unacked := "unknown"
	if d.Final.UnackedKnown {
		unacked = fmt.Sprint(d.Final.Unacked)
	}
	state := "drained"
	if !d.Drained {
		state = "NOT drained"
	}
	fmt.Fprintf(&b, "drain: %s in %.2f s, %d orders written (%.0f orders/s); queue %d ready, %s unacked, %d dead-lettered; Redis pending %d\n",
		state, d.Seconds, d.Orders, d.Rate, d.Final.Ready, unacked, d.Final.Dead, d.Final.Pending)
	if r.Run.Redis == "cluster" && len(r.RedisCalls) > 0 {
		writeRedisCalls(&b, r)
	}
	v := r.Verdict
	fmt.Fprintf(&b, "orders: %d accepted (202), MySQL %d confirmed + %d failed", v.AcceptedOrders, v.ConfirmedOrders, v.FailedOrders)
	for _, k := range sortedKeys(v.FailReasons) {
		fmt.Fprintf(&b, " [%s %d]", k, v.FailReasons[k])
	}
	fmt.Fprintf(&b, "; %.0f confirmed units/s end to end\n", s.ConfirmedPerSec)
	if r.API != nil {
		fmt.Fprintf(&b, "sale state (API): %s, sold %d, pending %d, available %d\n", r.API.State, r.API.Sold, r.API.Pending, r.API.Available)
	}
	r.writeCPU(&b)
	for _, n := range v.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	for _, reason := range v.Reasons {
		fmt.Fprintf(&b, "FAIL: %s\n", reason)
	}
	b.WriteString(r.Line + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// writeRedisCalls is the per-master part of the table: each master's share
// of the calls (a hot slot shows as one master far above 1/N) and calls per
// request sent (warm-up reads, state polls, purchases, order waits).
func writeRedisCalls(b *strings.Builder, r *Report) {
	var total, scripts int64
	for _, n := range r.RedisCalls {
		total += n.Calls
		scripts += n.Scripts
	}
	var requests int64
	for _, p := range r.Phases {
		requests += p.Requests
	}
	if rd := r.Reads; rd != nil {
		requests += rd.StatePolls.Requests + rd.OrderWaits.Requests
	}
	per := func(n int64) float64 {
		if requests == 0 {
			return 0
		}
		return float64(n) / float64(requests)
	}
	share := func(n int64) float64 {
		if total == 0 {
			return 0
		}
		return 100 * float64(n) / float64(total)
	}
	fmt.Fprintf(b, "%-22s %9s %7s %9s %9s %9s  %s\n", "redis master", "commands", "share", "per req", "scripts", "per req", "top commands")
	for _, n := range r.RedisCalls {
		cmds := sortedKeys(n.Commands)
		sort.SliceStable(cmds, func(i, j int) bool { return n.Commands[cmds[i]] > n.Commands[cmds[j]] })
		var top []string
		for _, c := range cmds[:min(4, len(cmds))] {
			top = append(top, fmt.Sprintf("%s %d", c, n.Commands[c]))
		}
		fmt.Fprintf(b, "%-22s %9d %6.1f%% %9.2f %9d %9.2f  %s\n", n.Node, n.Calls, share(n.Calls), per(n.Calls), n.Scripts, per(n.Scripts), strings.Join(top, ", "))
	}
	fmt.Fprintf(b, "%-22s %9d %6.1f%% %9.2f %9d %9.2f\n", "all masters", total, 100.0, per(total), scripts, per(scripts))
	fmt.Fprintf(b, "(INFO commandstats of each master, before and after the load: every client of the cluster counts, the drain does not;\n"+
		" commands include those run inside scripts, scripts are EVALSHA/EVAL calls; per %d requests sent)\n", requests)
}

// writeReads is the read-mix part of the table.
func writeReads(b *strings.Builder, rd *load.ReadsSnapshot) {
	fmt.Fprintf(b, "%-14s %9s %9s %9s %9s %9s %9s  %s\n", "reads (ms)", "count", "p50", "p90", "p99", "p99.9", "max", "answers")
	line := func(name string, k load.ReadKind) {
		l := k.Latency
		fmt.Fprintf(b, "%-14s %9d %9.2f %9.2f %9.2f %9.2f %9.2f ", name, l.Count, l.P50, l.P90, l.P99, l.P999, l.Max)
		for _, m := range sortedKeys(k.Mix) {
			fmt.Fprintf(b, " %s: %d;", m, k.Mix[m])
		}
		b.WriteString("\n")
	}
	line("state polls", rd.StatePolls)
	line("order waits", rd.OrderWaits)
	fmt.Fprintf(b, "(state polls: %d/s through the warm-up, per request; order waits: from the 202 to the final answer, %d long-polls of ?wait=%gs in all",
		rd.StatePollRate, rd.OrderWaits.Requests, rd.OrderWait)
	if rd.Skipped > 0 {
		fmt.Fprintf(b, ", %d accepted orders not waited for", rd.Skipped)
	}
	b.WriteString(")\n")
}

func sortedKeys(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
