// Package deploy holds what an operator deploys beside the binaries:
// Prometheus scrape config and alert rules, a Grafana dashboard and plain
// Kubernetes manifests. Its tests check them with the tools and types they
// are written for; e2e/prometheus_test.go evaluates the rules and the
// dashboard against a real Prometheus scraping a running stack.
package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

// tool finds a command; without it the test skips, or fails under CI (make
// test installs promtool first: deploy/deploy.mk).
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not installed (make deploy-deps installs it)", name)
		}
		t.Skipf("%s not installed (make deploy-deps installs it)", name)
	}
	return p
}

func run(t *testing.T, dir, bin string, args ...string) {
	t.Helper()
	// promtool checks take a second; the bound keeps a stuck one from
	// running into the package's -timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := servicetest.CommandContext(ctx, t, bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s (bound 2m): %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	t.Logf("%s %s:\n%s", filepath.Base(bin), strings.Join(args, " "), out)
}

func TestPrometheusRulesAndConfig(t *testing.T) {
	promtool := tool(t, "promtool")
	run(t, "prometheus", promtool, "check", "rules", "alerts.yml")
	run(t, "prometheus", promtool, "test", "rules", "alerts_test.yml")
	run(t, "prometheus", promtool, "check", "config", "prometheus.yml")
}

// Every alert the operations kit promises exists, and each has a summary.
func TestAlertRulesCoverTheKit(t *testing.T) {
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	exprs := map[string]string{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			exprs[r.Alert] = r.Expr
			if r.Annotations["summary"] == "" {
				t.Errorf("%s has no summary", r.Alert)
			}
		}
	}
	for alert, metric := range map[string]string{
		"SeckillLimiterDegraded":       "seckill_proxy_degraded",
		"SeckillLimiterShedding":       "seckill_proxy_limiter_shed_total",
		"SeckillReconcileDrift":        "seckill_reconcile_sold_drift",
		"SeckillReconcileUnsafe":       "seckill_reconcile_unsafe",
		"SeckillDeadLetters":           "seckill_worker_dead_lettered_total",
		"SeckillPublishFailures":       "seckill_backend_publish_total",
		"SeckillSweeperBacklog":        "seckill_reservations_overdue",
		"SeckillQueueBacklog":          "seckill_queue_messages_ready",
		"SeckillPublisherDisconnected": "seckill_backend_publish_connected",
		"SeckillBrokerNackStorm":       "seckill_backend_publish_nack_recoveries_total",
	} {
		if !strings.Contains(exprs[alert], metric) {
			t.Errorf("alert %s missing or not on %s: %q", alert, metric, exprs[alert])
		}
	}
	for _, outcome := range []string{"nacked", "returned", "timeout"} {
		if !strings.Contains(exprs["SeckillPublishFailures"], outcome) {
			t.Errorf("SeckillPublishFailures does not cover %s", outcome)
		}
	}
}

// DashboardExprs returns every panel query of the Grafana dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("grafana/seckill.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

func TestDashboardQueriesParse(t *testing.T) {
	exprs := dashboardExprs(t)
	if len(exprs) < 10 {
		t.Fatalf("only %d panel queries", len(exprs))
	}
	promtool := tool(t, "promtool")
	// promtool checks PromQL through a rule file of recording rules.
	var b bytes.Buffer
	b.WriteString("groups:\n- name: dashboard\n  rules:\n")
	for i, e := range exprs {
		js, _ := json.Marshal(e)
		b.WriteString("  - record: dashboard:q" + strconv.Itoa(i) + "\n    expr: " + string(js) + "\n")
	}
	f := filepath.Join(t.TempDir(), "dashboard.yml")
	if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ".", promtool, "check", "rules", f)
}

// strict decodes one YAML document into v, refusing unknown fields.
func strict(doc []byte, v any) error { return yaml.UnmarshalStrict(doc, v) }

// serviceMonitor is the part of the Prometheus Operator's CRD the manifest
// uses (k8s.io/api does not define it).
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func TestKubernetesManifestsDecodeStrictly(t *testing.T) {
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	deployments := map[string]appsv1.Deployment{}
	services := map[string]corev1.Service{}
	pdbs := map[string]policyv1.PodDisruptionBudget{}
	monitors := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range docSep.Split(string(b), -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			where := f + " " + meta.Kind
			var err error
			switch meta.Kind {
			case "Deployment":
				var d appsv1.Deployment
				err = strict([]byte(doc), &d)
				deployments[d.Name] = d
			case "Service":
				var s corev1.Service
				err = strict([]byte(doc), &s)
				services[s.Name] = s
			case "PodDisruptionBudget":
				var p policyv1.PodDisruptionBudget
				err = strict([]byte(doc), &p)
				pdbs[p.Name] = p
			case "ConfigMap":
				var c corev1.ConfigMap
				if err = strict([]byte(doc), &c); err == nil {
					// The shipped configuration must load.
					if _, cerr := conf.Parse(c.Data["seckill.toml"], nil); cerr != nil {
						t.Errorf("%s: seckill.toml: %v", where, cerr)
					}
				}
			case "ServiceMonitor":
				var m serviceMonitor
				err = strict([]byte(doc), &m)
				monitors++
			default:
				t.Errorf("%s #%d: unexpected kind %q", f, i, meta.Kind)
			}
			if err != nil {
				t.Errorf("%s #%d: %v", where, i, err)
			}
		}
	}
	for _, name := range []string{"seckill-proxy", "seckill-backend", "seckill-worker"} {
		d, ok := deployments[name]
		if !ok {
			t.Errorf("no Deployment %s", name)
			continue
		}
		if _, ok := pdbs[name]; !ok {
			t.Errorf("no PodDisruptionBudget for %s", name)
		}
		if _, ok := services[name]; !ok {
			t.Errorf("no Service %s", name)
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.LivenessProbe == nil || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("%s/%s: liveness and an HTTP /readyz readiness probe are required", name, c.Name)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("%s/%s: CPU request and memory limit are required", name, c.Name)
			}
		}
		if sel := d.Spec.Selector.MatchLabels; sel["app.kubernetes.io/name"] != d.Spec.Template.Labels["app.kubernetes.io/name"] {
			t.Errorf("%s: selector %v does not match the pod labels", name, sel)
		}
	}
	if s := services["seckill-backend"]; s.Spec.Type != "" && s.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("the backend must not be exposed outside the cluster (type %s)", s.Spec.Type)
	}
	if monitors != 1 {
		t.Errorf("%d ServiceMonitors, want 1", monitors)
	}
}
