package report

import (
	"fmt"
	"strings"

	"github.com/seckill/seckill/bench/internal/ceiling"
	"github.com/seckill/seckill/bench/internal/proccpu"
)

// CPU is what each process spent over the scenario, from the rush's start
// until the queue was drained (-cpu), per accepted order and per answer.
type CPU struct {
	Seconds   float64    `json:"window_seconds"`
	Accepted  int64      `json:"accepted"`
	Answers   int64      `json:"answers"`
	Cores     int        `json:"cores"`
	LoadStart [3]float64 `json:"load_average_start"`
	LoadEnd   [3]float64 `json:"load_average_end"`
	// Procs are the groups given, then "box": the whole machine (every
	// process, the kernel's own work too).
	Procs []ProcCPU `json:"processes"`
}

// ProcCPU is one group's CPU.
type ProcCPU struct {
	proccpu.Usage
	PerAccepted float64 `json:"us_per_accepted_order"` // 0 when none was accepted
	PerAnswer   float64 `json:"us_per_answer"`
}

// NewCPU turns two samples into the CPU part of a report.
func NewCPU(groups []proccpu.Group, a, b proccpu.Sample, accepted, answers int64) *CPU {
	c := &CPU{Seconds: b.At.Sub(a.At).Seconds(), Accepted: accepted, Answers: answers, Cores: b.Cores,
		LoadStart: a.Load, LoadEnd: b.Load}
	for _, u := range proccpu.Diff(groups, a, b) {
		p := ProcCPU{Usage: u}
		us := float64(u.CPU.Microseconds())
		if accepted > 0 {
			p.PerAccepted = us / float64(accepted)
		}
		if answers > 0 {
			p.PerAnswer = us / float64(answers)
		}
		c.Procs = append(c.Procs, p)
	}
	return c
}

// Ceiling is a raw ceiling measured in the same run (bench ceilings) and
// this run's figure beside it.
type Ceiling struct {
	ceiling.Result
	Figure string  `json:"figure"` // which of this run's figures it is compared with
	Value  float64 `json:"value"`
	Ratio  float64 `json:"ratio"` // Value / PerSecond
}

// Compare puts the run's figures beside the ceilings: accepted orders/s of
// the rush beside the reserve script and the confirm publisher (each
// accepted order is one call and one confirmed message), confirmed orders/s
// end to end and the drain's orders/s beside the transaction.
func (r *Report) Compare(cs ceiling.Results) {
	r.Ceilings = nil
	add := func(name, figure string, v float64) {
		c, ok := cs.Get(name)
		if !ok {
			return
		}
		e := Ceiling{Result: c, Figure: figure, Value: v}
		if c.PerSecond > 0 {
			e.Ratio = v / c.PerSecond
		}
		r.Ceilings = append(r.Ceilings, e)
	}
	s := r.Summary
	add(ceiling.Reserve, "accepted/s (rush)", s.AcceptedPerSec)
	add(ceiling.Publish, "accepted/s (rush)", s.AcceptedPerSec)
	add(ceiling.Transaction, "confirmed/s (end to end)", s.ConfirmedPerSec)
	if r.Drain.Orders > 0 {
		add(ceiling.Transaction, "drain orders/s", r.Drain.Rate)
	}
}

// writeCPU is the CPU and ceilings part of the table.
func (r *Report) writeCPU(b *strings.Builder) {
	if c := r.CPU; c != nil {
		fmt.Fprintf(b, "\n%-14s %9s %7s %13s %11s  (rush start to drained, %.2f s; %d accepted, %d answers)\n",
			"CPU", "seconds", "cores", "µs/accepted", "µs/answer", c.Seconds, c.Accepted, c.Answers)
		for _, p := range c.Procs {
			if p.Err != "" {
				fmt.Fprintf(b, "%-14s %s\n", p.Name, p.Err)
				continue
			}
			fmt.Fprintf(b, "%-14s %9.2f %7.2f %13.1f %11.1f\n", p.Name, p.Seconds, p.Cores, p.PerAccepted, p.PerAnswer)
		}
		fmt.Fprintf(b, "(box: all of the machine's %d cores, other processes included; load average %s at the start, %s at the end)\n",
			c.Cores, loadString(c.LoadStart), loadString(c.LoadEnd))
	}
	if len(r.Ceilings) > 0 {
		fmt.Fprintf(b, "\n%-12s %12s %-10s %-26s %10s %7s\n", "ceiling", "raw", "", "this run", "", "ratio")
		for _, c := range r.Ceilings {
			fmt.Fprintf(b, "%-12s %12.0f %-10s %-26s %10.0f %6.3f×\n", c.Name, c.PerSecond, c.Unit, c.Figure, c.Value, c.Ratio)
		}
		b.WriteString("(raw ceilings from `bench ceilings` in the same run, on the same services)\n")
	}
}

func loadString(l [3]float64) string { return fmt.Sprintf("%.2f %.2f %.2f", l[0], l[1], l[2]) }
