package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/bench/internal/ceiling"
	"github.com/seckill/seckill/bench/internal/proccpu"
)

// withCPU adds to the sample report (100 accepted of 3000 answers) a window
// of 2 s where the backend spent 500 ms, two workers 100 + 300 ms, a proxy
// that exited, and the box 3 s; and ceilings of 1000 calls/s and 400 orders/s.
func withCPU(t *testing.T) *Report {
	t.Helper()
	r := sample(t, true)
	groups := []proccpu.Group{{Name: "backend", PIDs: []int{10}}, {Name: "worker", PIDs: []int{11, 12}}, {Name: "proxy", PIDs: []int{13}}}
	t0 := time.Now()
	a := proccpu.Sample{At: t0, Procs: [][]time.Duration{{time.Second}, {time.Second, time.Second}, {time.Second}},
		Errs: make([]error, 3), Busy: 10 * time.Second, Cores: 2, Load: [3]float64{1.5, 1, 0.5}}
	b := proccpu.Sample{At: t0.Add(2 * time.Second), Procs: [][]time.Duration{{1500 * time.Millisecond}, {1100 * time.Millisecond, 1300 * time.Millisecond}, {-1}},
		Errs: []error{nil, nil, errors.New("gone")}, Busy: 13 * time.Second, Cores: 2, Load: [3]float64{2.25, 1, 0.5}}
	r.CPU = NewCPU(groups, a, b, r.Summary.Accepted, r.Summary.Purchases)
	r.Compare(ceiling.Results{{Name: ceiling.Reserve, Unit: "calls/s", PerSecond: 1000, Detail: "d1"},
		{Name: ceiling.Transaction, Unit: "orders/s", PerSecond: 400, Detail: "d2"}})
	return r
}

func TestCPUPerOrder(t *testing.T) {
	r := withCPU(t)
	c := r.CPU
	if c.Accepted != 100 || c.Answers != 3000 || c.Seconds != 2 || len(c.Procs) != 4 {
		t.Fatalf("cpu %+v", c)
	}
	want := []struct {
		name           string
		perAcc, perAns float64
		cores          float64
		err            bool
	}{
		{"backend", 5000, 500.0 / 3, 0.25, false},
		{"worker", 4000, 400.0 / 3, 0.2, false},
		{"proxy", 0, 0, 0, true},
		{"box", 30000, 1000, 1.5, false},
	}
	for i, w := range want {
		p := c.Procs[i]
		if p.Name != w.name || (p.Err != "") != w.err || !near(p.PerAccepted, w.perAcc) || !near(p.PerAnswer, w.perAns) || !near(p.Cores, w.cores) {
			t.Errorf("%s: %+v, want %+v", w.name, p, w)
		}
	}
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"backend             0.50    0.25        5000.0       166.7",
		"worker              0.40    0.20        4000.0       133.3",
		"proxy          process 13 could not be read at both ends: gone",
		"box                 3.00    1.50       30000.0      1000.0",
		"load average 1.50 1.00 0.50 at the start, 2.25 1.00 0.50 at the end",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, b.String())
		}
	}
	// The verdict stays the last line.
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); !strings.HasPrefix(lines[len(lines)-1], "verdict: ok") {
		t.Errorf("last line %q", lines[len(lines)-1])
	}
}

func TestCeilingRatios(t *testing.T) {
	r := withCPU(t)
	// Accepted/s of the rush beside the script; confirmed/s end to end and
	// the drain beside the transaction; no publish ceiling was given.
	if len(r.Ceilings) != 3 {
		t.Fatalf("ceilings %+v", r.Ceilings)
	}
	acc := r.Summary.AcceptedPerSec
	for i, w := range []struct {
		name, figure string
		value, ratio float64
	}{
		{ceiling.Reserve, "accepted/s (rush)", acc, acc / 1000},
		{ceiling.Transaction, "confirmed/s (end to end)", r.Summary.ConfirmedPerSec, r.Summary.ConfirmedPerSec / 400},
		{ceiling.Transaction, "drain orders/s", 200, 0.5},
	} {
		c := r.Ceilings[i]
		if c.Name != w.name || c.Figure != w.figure || !near(c.Value, w.value) || !near(c.Ratio, w.ratio) {
			t.Errorf("ceiling %d: %+v, want %+v", i, c, w)
		}
	}
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "transaction           400 orders/s   drain orders/s                    200  0.500×") {
		t.Errorf("table lacks the drain ratio:\n%s", b.String())
	}
}

func TestCPUInJSONAndHTML(t *testing.T) {
	r := withCPU(t)
	var j bytes.Buffer
	if err := r.WriteJSON(&j); err != nil {
		t.Fatal(err)
	}
	var back struct {
		CPU struct {
			Procs []struct {
				Name        string  `json:"name"`
				PerAccepted float64 `json:"us_per_accepted_order"`
			} `json:"processes"`
		} `json:"cpu"`
		Ceilings []struct {
			Ratio float64 `json:"ratio"`
		} `json:"ceilings"`
	}
	if err := json.Unmarshal(j.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.CPU.Procs) != 4 || back.CPU.Procs[0].Name != "backend" || back.CPU.Procs[0].PerAccepted != 5000 || len(back.Ceilings) != 3 || back.Ceilings[2].Ratio != 0.5 {
		t.Errorf("JSON cpu/ceilings: %+v", back)
	}
	var h bytes.Buffer
	if err := r.WriteHTML(&h); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<h2 id="cpu">`, "<td>backend</td><td>10</td><td>0.50</td><td>0.25</td><td>5000.0</td>",
		"<td>worker</td><td>11 12</td>", "could not be read at both ends", `<h2 id="ceilings">`, "<td>0.500×</td>"} {
		if !strings.Contains(h.String(), want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	// Without -cpu and -ceilings the sections are absent.
	var plain bytes.Buffer
	if err := sample(t, true).WriteHTML(&plain); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain.String(), `id="cpu"`) || strings.Contains(plain.String(), `id="ceilings"`) {
		t.Error("HTML has CPU or ceiling sections without data")
	}
}

func near(a, b float64) bool { d := a - b; return d < 1e-6 && d > -1e-6 }
