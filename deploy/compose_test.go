package deploy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/seckill/seckill/conf"
)

const composeToken = "compose-test-token-0123456789abcdef0123456789abcdef"

func loadCompose(t *testing.T, env []string) (*types.Project, error) {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{filepath.Join("..", "docker-compose.yml")},
		cli.WithName("seckill"), cli.WithEnv(env), cli.WithProfiles([]string{"bench"}), cli.WithWorkingDirectory(".."))
	if err != nil {
		t.Fatal(err)
	}
	return opts.LoadProject(context.Background())
}

// loadComposeCluster is the project as `docker compose --env-file
// deploy/redis-cluster.env run bench` sees it: the env file's variables
// (COMPOSE_PROFILES among them) over env, then the bench service enabled.
func loadComposeCluster(t *testing.T, env []string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{filepath.Join("..", "docker-compose.yml")},
		cli.WithName("seckill"), cli.WithEnv(env), cli.WithWorkingDirectory(".."),
		cli.WithEnvFiles(filepath.Join("..", "deploy", "redis-cluster.env")), cli.WithDotEnv, cli.WithDefaultProfiles())
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Profiles, []string{"cluster"}) {
		t.Errorf("deploy/redis-cluster.env activates profiles %v, want [cluster]", p.Profiles)
	}
	p, err = p.WithServicesEnabled("bench")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// docker-compose.yml, loaded and validated by compose-go (no Docker engine
// runs here): only the proxy is published beyond loopback, every
// application service has a -healthcheck of its own binary, one admin token
// everywhere, the bench service runs the demo sale inside the network.
func TestCompose(t *testing.T) {
	if _, err := loadCompose(t, nil); err == nil || !strings.Contains(err.Error(), "SECKILL_ADMIN_TOKEN") {
		t.Errorf("without SECKILL_ADMIN_TOKEN the file must refuse to load, got %v", err)
	}
	p, err := loadCompose(t, []string{"SECKILL_ADMIN_TOKEN=" + composeToken})
	if err != nil {
		t.Fatal(err)
	}
	apps := checkApps(t, p)
	// The cluster profile is opt-in: by default none of it runs, and every
	// service uses the one redis.
	for name := range p.Services {
		if strings.HasPrefix(name, "redis-node-") || name == "redis-cluster-init" {
			t.Errorf("%s runs without the cluster profile", name)
		}
	}
	for name := range apps {
		if u := p.Services[name].Environment["SECKILL_REDIS_URL"]; u == nil || *u != "redis://redis:6379/0" {
			t.Errorf("%s: SECKILL_REDIS_URL %v without the cluster profile, want redis://redis:6379/0", name, u)
		}
		if d, ok := p.Services[name].DependsOn["redis-cluster-init"]; ok && d.Required {
			t.Errorf("%s requires redis-cluster-init, which only the cluster profile has", name)
		}
	}
	for _, name := range []string{"proxy", "backend", "worker-1", "worker-2", "bench"} {
		if _, ok := apps[name]; !ok {
			t.Errorf("no application service %s", name)
		}
	}
	b := p.Services["bench"]
	args := strings.Join(b.Command, " ")
	for _, want := range []string{"-targets http://proxy:8080", "-admin-url http://backend:8090"} {
		if !strings.Contains(args, want) {
			t.Errorf("bench command %q lacks %q", args, want)
		}
	}
	if dep, ok := b.DependsOn["proxy"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Errorf("bench must wait for a healthy proxy: %+v", b.DependsOn)
	}
	if !slices.Contains(b.Profiles, "bench") {
		t.Error("bench runs on demand (profile bench), not with `up`")
	}
	img := p.Services["rabbitmq"].Image
	major, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(img, "rabbitmq:"), ".", 2)[0])
	if major < 4 {
		t.Errorf("RabbitMQ image %s: want a current (4.x) release", img)
	}
}

// checkApps checks every application service of p (published ports, the
// one admin token, the configuration it would run with, its healthcheck)
// and returns them, service -> binary.
func checkApps(t *testing.T, p *types.Project) map[string]string {
	t.Helper()
	apps := map[string]string{} // service -> binary
	for name, s := range p.Services {
		for _, port := range s.Ports {
			public := port.HostIP == "" || port.HostIP == "0.0.0.0" || port.HostIP == "::"
			if public && !(name == "proxy" && port.Target == 8080) {
				t.Errorf("%s publishes %s:%s->%d on every interface; only the proxy's 8080 may", name, port.HostIP, port.Published, port.Target)
			}
			if !public && port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes on %s", name, port.HostIP)
			}
		}
		if s.Image != "seckill:latest" {
			continue
		}
		if len(s.Command) == 0 || !strings.HasPrefix(s.Command[0], "/usr/local/bin/") {
			t.Errorf("%s: command %v", name, s.Command)
			continue
		}
		bin := strings.TrimPrefix(s.Command[0], "/usr/local/bin/")
		apps[name] = bin
		if tok := s.Environment["SECKILL_ADMIN_TOKEN"]; tok == nil || *tok != composeToken {
			t.Errorf("%s: SECKILL_ADMIN_TOKEN is not the one token given", name)
		}
		// The service's environment over the image's seckill.toml must load.
		env := func(k string) string {
			if v := s.Environment[k]; v != nil {
				return *v
			}
			return ""
		}
		doc, err := os.ReadFile(filepath.Join("..", "conf", "seckill.toml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range s.Configs {
			if c.Target == s.Command[2] {
				doc = []byte(p.Configs[c.Source].Content)
			}
		}
		cfg, err := conf.Parse(string(doc), env)
		if err != nil {
			t.Errorf("%s: the configuration it would run with: %v", name, err)
			continue
		}
		if name == "proxy" {
			// Trusted: the bench container's address only.
			bench := p.Services["bench"].Networks["default"]
			if bench == nil || !slices.Equal(cfg.Proxy.TrustedProxies, []string{bench.Ipv4Address + "/32"}) {
				t.Errorf("proxy trusts %v; want only the bench container (%v)", cfg.Proxy.TrustedProxies, bench)
			}
		}
		if bin == "bench" {
			continue
		}
		hc := s.HealthCheck
		want := []string{"CMD", s.Command[0], "-healthcheck", "-config", s.Command[2]}
		if hc == nil || !slices.Equal([]string(hc.Test), want) {
			t.Errorf("%s: healthcheck %v, want %v", name, hc, want)
		}
	}
	return apps
}
