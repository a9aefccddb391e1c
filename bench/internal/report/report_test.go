package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/bench/internal/load"
	"github.com/seckill/seckill/internal/redisnodes"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/internal/verify"
)

// sample builds a report from a recorder fed a plausible flash sale: a rush
// where 100 units sell, 429s from the limits, a few 503s, then sold out.
func sample(t testing.TB, ok bool) *Report {
	t.Helper()
	start := time.Now()
	tl := load.Timeline{Start: start, RushStart: start.Add(time.Second), TailStart: start.Add(4 * time.Second), End: start.Add(6 * time.Second)}
	rec := load.NewRecorder(start, 250*time.Millisecond, 1000, 50)
	for i := 0; i < 50; i++ {
		at := start.Add(time.Duration(i) * 20 * time.Millisecond)
		rec.Sent()
		rec.Record(load.Result{Phase: load.Warmup, Status: 200, Latency: time.Millisecond, Done: at, IP: i, User: -1}, at)
	}
	sold := 0
	for i := 0; i < 3000; i++ {
		at := tl.RushStart.Add(time.Duration(i) * 5000 * time.Microsecond / 3)
		res := load.Result{Phase: load.Rush, User: i % 1000, IP: i % 50, Purchase: true, UserID: "u" + string(rune('a'+i%26))}
		if !at.Before(tl.TailStart) {
			res.Phase = load.Tail
		}
		switch {
		case i%7 == 0:
			res.Status, res.Code = 429, "purchase-ip"
		case i%97 == 0:
			res.Status, res.Code = 503, "unavailable"
		case sold < 100:
			res.Status, res.OrderID, res.Key = 202, "o"+strings.Repeat("x", i%5)+string(rune('A'+sold%26)), "k"
			sold++
		default:
			res.Status, res.Code = 409, "sold_out"
		}
		res.Latency = time.Duration(1+i%40) * time.Millisecond
		res.Done = at.Add(res.Latency)
		rec.Sent()
		rec.Record(res, at)
	}
	v := verify.Verdict{OK: ok, Sold: 100, Stock: 100, AcceptedOrders: 100, ConfirmedOrders: 100}
	if !ok {
		v.Oversold, v.Sold = 2, 102
		v.Reasons = []string{"oversold: 102 units confirmed <script>alert(1)</script>"}
	}
	run := Run{StartedAt: start, Targets: []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, ActivityID: 7, Stock: 100,
		PerUserLimit: 1, Users: 1000, Model: "closed", Connections: 16, Warmup: 1, Rush: 3, Tail: 2, SourceIPs: 50, HotShare: 0.1}
	drain := verify.DrainResult{Drained: true, Seconds: 0.5, Orders: 100, Rate: 200}
	return Build(run, rec.Snapshot(), tl, drain, &verify.APIState{State: "sold_out", Sold: 100}, v)
}

func TestBuild(t *testing.T) {
	r := sample(t, true)
	if r.Summary.Accepted != 100 || r.Verdict.Sold != 100 {
		t.Errorf("accepted %d sold %d", r.Summary.Accepted, r.Verdict.Sold)
	}
	if r.Phases[0].Name != "warmup" || r.Phases[0].Requests != 50 {
		t.Errorf("warm-up phase %+v", r.Phases[0])
	}
	if r.Summary.Purchases != 3000 || r.Phases[1].Requests+r.Phases[2].Requests != 3000 {
		t.Errorf("purchases %d", r.Summary.Purchases)
	}
	if r.Summary.SoldOutAfter < 0 || r.Summary.SoldOutAfter > 1 {
		t.Errorf("first sold-out answer %.2f s into the rush", r.Summary.SoldOutAfter)
	}
	var answers int64
	for _, p := range r.Timeline.Points {
		answers += p.Answers
	}
	if answers != 3000 {
		t.Errorf("timeline holds %d answers, want 3000", answers)
	}
	classes := map[string]bool{}
	for _, l := range r.Latency {
		classes[l.Class] = true
	}
	for _, c := range []string{"202", "409 sold_out", "429", "5xx", "all"} {
		if !classes[c] {
			t.Errorf("no latency row for %s", c)
		}
	}
}

func TestTableEndsWithVerdict(t *testing.T) {
	for _, ok := range []bool{true, false} {
		var b bytes.Buffer
		r := sample(t, ok)
		if err := r.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
		last := lines[len(lines)-1]
		re := regexp.MustCompile(`^verdict: (ok|FAIL) sold=\d+/\d+ oversold=\d+ over_limit=\d+ duplicates=\d+ lost=\d+ pending=\d+$`)
		if !re.MatchString(last) || strings.HasPrefix(last, "verdict: ok") != ok {
			t.Errorf("last line %q (ok=%v)", last, ok)
		}
		for _, want := range []string{"latency (ms)", "409 sold_out", "429 purchase-ip", "drain: drained"} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("table lacks %q", want)
			}
		}
		if !ok && !strings.Contains(b.String(), "FAIL: oversold") {
			t.Error("table lacks the failure reason")
		}
	}
}

func TestJSON(t *testing.T) {
	var b bytes.Buffer
	if err := sample(t, true).WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back["verdict_line"] != "verdict: ok sold=100/100 oversold=0 over_limit=0 duplicates=0 lost=0 pending=0" {
		t.Errorf("verdict_line %v", back["verdict_line"])
	}
	for _, k := range []string{"run", "summary", "phases", "latency", "answers", "timeline", "drain", "verdict"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
}

func TestHTMLSelfContained(t *testing.T) {
	var b bytes.Buffer
	if err := sample(t, false).WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, bad := range []string{"http://", "https://"} {
		// The only URLs are the targets named in the text and the SVG namespace.
		for _, line := range strings.Split(html, "\n") {
			if strings.Contains(line, bad) && !strings.Contains(line, "127.0.0.1") && !strings.Contains(line, "www.w3.org/2000/svg") {
				t.Errorf("external reference: %s", strings.TrimSpace(line))
			}
		}
	}
	for _, tag := range []string{"<link", "src="} {
		if strings.Contains(html, tag) {
			t.Errorf("HTML loads something (%s)", tag)
		}
	}
	if strings.Contains(html, "<script>alert(1)") {
		t.Error("a reason was not escaped")
	}
}

// The HTML report renders in headless Chromium, offline, and its script draws
// the three charts: the DOM after scripts ran holds the SVG series.
func TestHTMLRendersInChromium(t *testing.T) {
	chromium := servicetest.NewChromium(t)
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	if err := WriteFile(page, sample(t, true).WriteHTML); err != nil {
		t.Fatal(err)
	}
	out := chromium.Run("--dump-dom", "file://"+page)
	dom := string(out)
	if !strings.Contains(dom, `data-charts="3"`) {
		m := regexp.MustCompile(`data-chart-error="[^"]*"`).FindString(dom)
		t.Fatalf("the script did not draw 3 charts (%s); DOM starts: %.400s", m, dom)
	}
	checks := map[string]*regexp.Regexp{
		"latency lines":    regexp.MustCompile(`<polyline[^>]*class="series series-p99"`),
		"throughput areas": regexp.MustCompile(`<polygon[^>]*class="series series-area"`),
		"mix bars":         regexp.MustCompile(`<rect[^>]*class="bar"`),
		"phase markers":    regexp.MustCompile(`<line[^>]*class="phase"`),
	}
	for what, re := range checks {
		if !re.MatchString(dom) {
			t.Errorf("rendered DOM lacks %s", what)
		}
	}
	for _, id := range []string{"chart-latency", "chart-throughput", "chart-mix"} {
		if !regexp.MustCompile(`<svg id="` + id + `"[^>]*>\s*<text`).MatchString(dom) {
			t.Errorf("chart %s is empty", id)
		}
	}
	// A screenshot proves it paints; keep it when asked (BENCH_SCREENSHOT=path).
	shot := filepath.Join(dir, "report.png")
	if p := os.Getenv("BENCH_SCREENSHOT"); p != "" {
		shot = p
	}
	chromium.Run("--screenshot="+shot, "--window-size=1200,1400", "file://"+page)
	if st, err := os.Stat(shot); err != nil || st.Size() < 20_000 {
		t.Errorf("screenshot missing or blank: %v", err)
	}
}

// Per-master Redis calls: the delta of two readings without the bench's own
// INFO, a master new since the first reading counted from zero; printed
// for a cluster only, with each master's share and calls per request.
func TestRedisCalls(t *testing.T) {
	before := map[string]redisnodes.Calls{"10.0.0.1:7000": {"evalsha": 100, "info": 1, "get": 5}, "10.0.0.2:7000": {"evalsha": 50}}
	after := map[string]redisnodes.Calls{"10.0.0.1:7000": {"evalsha": 700, "info": 2, "get": 5, "hmget": 100},
		"10.0.0.2:7000": {"evalsha": 350, "eval": 10}, "10.0.0.3:7000": {"evalsha": 200}}
	calls := RedisCallsOver(before, after)
	want := []NodeCalls{
		{Node: "10.0.0.1:7000", Calls: 700, Scripts: 600, Commands: map[string]int64{"evalsha": 600, "hmget": 100}},
		{Node: "10.0.0.2:7000", Calls: 310, Scripts: 310, Commands: map[string]int64{"evalsha": 300, "eval": 10}},
		{Node: "10.0.0.3:7000", Calls: 200, Scripts: 200, Commands: map[string]int64{"evalsha": 200}},
	}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("calls\n got %+v\nwant %+v", calls, want)
	}
	for _, kind := range []string{"node", "cluster"} {
		r := sample(t, true)
		r.Run.Redis = kind
		r.RedisCalls = calls
		var b bytes.Buffer
		if err := r.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		// 3,050 requests (50 warm-up reads, 3,000 purchases): 1,210 calls.
		row := regexp.MustCompile(`(?m)^10\.0\.0\.1:7000 +700 +57\.9% +0\.23 +600 +0\.20  evalsha 600, hmget 100$`)
		all := regexp.MustCompile(`(?m)^all masters +1210 +100\.0% +0\.40 +1110 +0\.36$`)
		shown := row.MatchString(b.String()) && all.MatchString(b.String())
		if shown != (kind == "cluster") {
			t.Errorf("redis %s: per-master rows shown %v:\n%s", kind, shown, b.String())
		}
	}
}
