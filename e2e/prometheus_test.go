package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
)

var metricName = regexp.MustCompile(`seckill_[a-z_]+|process_[a-z_]+|go_[a-z_]+`)

// startPrometheus runs bin with args and --web.listen-address on a port
// of the stack's (claimed for the test), until its log says it is ready; a
// start that lost the port before binding it is tried on another. The
// server is stopped when the test ends; exited is closed if it exits.
func startPrometheus(t *testing.T, bin, dir string, args ...string) (addr string, exited <-chan struct{}) {
	t.Helper()
	for try := 1; ; try++ {
		addr = stack.FreeAddr(t)
		logPath := filepath.Join(dir, fmt.Sprintf("prometheus-%d.log", try))
		cmd := servicetest.Command(t, bin, append(args, "--web.listen-address="+addr, "--log.level=info")...)
		logf, err := os.Create(logPath)
		servicetest.Must(t, err, "log")
		cmd.Stdout, cmd.Stderr = logf, logf
		servicetest.Must(t, cmd.Start(), "start prometheus")
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); _ = logf.Close(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			if t.Failed() {
				b, _ := os.ReadFile(logPath)
				t.Logf("prometheus log:\n%s", b)
			}
		})
		// Its own "ready" record, not an answer from whoever took the port.
		var log []byte
		stack.WaitFor(t, "prometheus ready", 2*time.Minute, func() bool {
			select {
			case <-done:
				return true
			default:
			}
			log, _ = os.ReadFile(logPath)
			return strings.Contains(string(log), "Server is ready to receive web requests")
		})
		select {
		case <-done:
			log, _ = os.ReadFile(logPath)
			if strings.Contains(string(log), "address already in use") && try < 5 {
				continue
			}
			t.Fatalf("prometheus exited at start:\n%s", log)
		default:
		}
		return addr, done
	}
}

type promAnswer struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
		Groups     []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"data"`
}

func promGet(t *testing.T, base, path string, q url.Values) promAnswer {
	t.Helper()
	u := base + path
	if q != nil {
		u += "?" + q.Encode()
	}
	resp, err := http.Get(u)
	servicetest.Must(t, err, "GET %s", u)
	defer resp.Body.Close()
	var a promAnswer
	servicetest.Must(t, json.NewDecoder(resp.Body).Decode(&a), "decode %s", u)
	return a
}

func query(t *testing.T, base, expr string) promAnswer {
	t.Helper()
	return promGet(t, base, "/api/v1/query", url.Values{"query": {expr}})
}

// A real Prometheus (Debian's package) scrapes a short demo stack with
// deploy/prometheus's scrape config and alert rules; every alert rule
// evaluates without error, and every dashboard query returns series.
func TestPrometheusScrapesTheStackAndEveryQueryAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries and Prometheus")
	}
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("prometheus not installed (make deploy-deps installs it)")
		}
		t.Skip("prometheus not installed (make deploy-deps installs it)")
	}
	t.Parallel()
	root := filepath.Join("..", "deploy")

	// The demo stack: a proxy in front of a backend, a worker; the
	// reconciler runs every second so its series exist.
	s := stack.New(t, stack.Options{Backends: 1, Workers: 1, Config: "[worker]\nreconcile_interval = \"1s\"\n"})
	backend, worker := s.Backends[0], s.Workers[0]
	// The crowd stands in for an authenticating layer on loopback: the proxy
	// keeps the X-User-ID of trusted peers only.
	proxy := s.StartProxy(t, "proxy", "[proxy]\ntrusted_proxies = [\"127.0.0.0/8\"]\n")
	admin := proxy.AdminAddr
	sale := s.CreateSale(t, 77, 50, 1)
	c := stack.NewCrowd(sale, 80, 1, "prom")
	c.Run(s, []*stack.Proc{proxy})
	if len(c.Accepted()) == 0 {
		t.Fatalf("no purchase accepted through the proxy: %s", c.Summary())
	}
	s.Drain(t, sale, c.Accepted())

	// deploy/prometheus, pointed at this stack, scraping every second.
	dir := t.TempDir()
	cfg, err := os.ReadFile(filepath.Join(root, "prometheus", "prometheus.yml"))
	servicetest.Must(t, err, "read prometheus.yml")
	text := string(cfg)
	for from, to := range map[string]string{
		`"127.0.0.1:8081"`:         `"` + admin + `"`,
		`"127.0.0.1:8090"`:         `"` + strings.TrimPrefix(backend.URL(), "http://") + `"`,
		`"127.0.0.1:8091"`:         `"` + strings.TrimPrefix(worker.URL(), "http://") + `"`,
		"scrape_interval: 15s":     "scrape_interval: 1s",
		"evaluation_interval: 15s": "evaluation_interval: 1s",
	} {
		if !strings.Contains(text, from) {
			t.Fatalf("deploy/prometheus/prometheus.yml no longer has %s", from)
		}
		text = strings.ReplaceAll(text, from, to)
	}
	servicetest.Must(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(text), 0o644), "write config")
	rules, err := os.ReadFile(filepath.Join(root, "prometheus", "alerts.yml"))
	servicetest.Must(t, err, "read alerts.yml")
	servicetest.Must(t, os.WriteFile(filepath.Join(dir, "alerts.yml"), rules, 0o644), "write rules")

	addr, exited := startPrometheus(t, bin, dir, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"))
	base := "http://" + addr

	// Two scrapes of every job, so that rate() has two samples.
	stack.WaitFor(t, "two scrapes of the three jobs", 2*time.Minute, func() bool {
		select {
		case <-exited:
			t.Fatal("prometheus exited")
		default:
		}
		r, err := http.Get(base + "/api/v1/query?" + url.Values{"query": {
			`count(min_over_time(up{job=~"seckill-.*"}[1m]) == 1 and count_over_time(up{job=~"seckill-.*"}[1m]) >= 2)`}}.Encode())
		if err != nil {
			return false
		}
		defer r.Body.Close()
		var a struct {
			Data struct {
				Result []struct {
					Value [2]any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if json.NewDecoder(r.Body).Decode(&a) != nil || len(a.Data.Result) != 1 {
			return false
		}
		return a.Data.Result[0].Value[1] == "3"
	})
	// One more rule evaluation after that, for /api/v1/rules.
	time.Sleep(2 * time.Second)

	// Every alert rule: its expression evaluates without error, and the
	// rule manager evaluated it healthily.
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	servicetest.Must(t, yaml.Unmarshal(rules, &doc), "parse alerts.yml")
	n := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			n++
			if a := query(t, base, r.Expr); a.Status != "success" {
				t.Errorf("alert %s: %s %s", r.Alert, a.ErrorType, a.Error)
			}
		}
	}
	ra := promGet(t, base, "/api/v1/rules", nil)
	evaluated := 0
	for _, g := range ra.Data.Groups {
		for _, r := range g.Rules {
			evaluated++
			if r.Health != "ok" {
				t.Errorf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if evaluated != n {
		t.Errorf("prometheus loaded %d rules, alerts.yml has %d", evaluated, n)
	}

	// Every dashboard query returns series.
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile(filepath.Join(root, "grafana", "seckill.json"))
	servicetest.Must(t, err, "read dashboard")
	servicetest.Must(t, json.Unmarshal(b, &dash), "parse dashboard")
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			a := query(t, base, tg.Expr)
			switch {
			case a.Status != "success":
				t.Errorf("panel %q: %s %s", p.Title, a.ErrorType, a.Error)
			case len(a.Data.Result) == 0:
				raw := ""
				if m := metricName.FindString(tg.Expr); m != "" {
					raw = fmt.Sprintf("; %s has %d series", m, len(query(t, base, m).Data.Result))
				}
				t.Errorf("panel %q: no series for %s%s", p.Title, tg.Expr, raw)
			}
		}
	}
	if os.Getenv("SECKILL_PROM_DEBUG") != "" {
		for _, r := range query(t, base, `count by (__name__) ({job="seckill-proxy"})`).Data.Result {
			t.Logf("proxy series: %s", r)
		}
	}
	t.Logf("%d alert rules and %d dashboard panels evaluated against Prometheus at %s", n, len(dash.Panels), addr)
}
