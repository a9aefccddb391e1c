package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlc "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valyala/fasthttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/seckill/seckill/internal/servicetest"
)

// The proxy serves Envoy's rate-limit service on rls_listen beside the
// HTTP edge, counts it on the admin /metrics, reloads its rules on SIGHUP,
// and refuses to start on an invalid rules file.
func TestRunRLS(t *testing.T) {
	_, prefix := servicetest.Redis(t)
	up := servicetest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }})
	dir := t.TempDir()
	path, rules := filepath.Join(dir, "seckill.toml"), filepath.Join(dir, "rules.yaml")
	writeRules := func(limit string) {
		doc := "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: " + limit + "}\n"
		servicetest.Must(t, os.WriteFile(rules, []byte(doc), 0o600), "write rules")
	}
	writeRules("2")
	writeConfig(t, path, prefix, "127.0.0.1:0", "127.0.0.2:0", up, 2, false,
		`rls_listen = "127.0.0.3:0"`, `rls_config = "`+rules+`"`)
	env := func(k string) string {
		if k == "SECKILL_REDIS_URL" {
			return servicetest.RedisURL()
		}
		return ""
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &logBuffer{}
	go func() {
		err := run(ctx, []string{"-config", path}, env, io.Discard, logs)
		logs.end(err)
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	rec := logs.await(t, "envoy rate-limit service serving", 1)
	admin, _ := logs.await(t, "proxy serving", 1)["admin"].(string)
	conn, err := grpc.NewClient(rec["listen"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	servicetest.Must(t, err, "grpc client")
	defer conn.Close()
	client := pb.NewRateLimitServiceClient(conn)
	admitted := func(user string, n int) (ok int) {
		for range n {
			resp, err := client.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "shop",
				Descriptors: []*rlc.RateLimitDescriptor{{Entries: []*rlc.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
			servicetest.Must(t, err, "ShouldRateLimit")
			if resp.OverallCode == pb.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	if ok := admitted("alice", 4); ok != 2 {
		t.Fatalf("limit 2: %d admitted", ok)
	}
	_, body, err := (&fasthttp.Client{}).Get(nil, "http://"+admin+"/metrics")
	servicetest.Must(t, err, "metrics")
	if !strings.Contains(string(body), `seckill_proxy_rls_requests_total{outcome="over_limit"} 2`) {
		t.Fatalf("/metrics lacks the rls requests:\n%s", body)
	}
	writeRules("5")
	servicetest.Must(t, syscall.Kill(os.Getpid(), syscall.SIGHUP), "sighup")
	logs.await(t, "rls config reloaded", 1)
	if ok := admitted("alice", 5); ok != 3 {
		t.Fatalf("after reload to 5: %d admitted, want 3", ok)
	}

	// An invalid rules file: the proxy does not start.
	bad := filepath.Join(dir, "bad.toml")
	servicetest.Must(t, os.WriteFile(rules+".bad", []byte("domain: shop\ndescriptors: [{key: user, rate_limit: {unit: fortnight}}]"), 0o600), "write")
	writeConfig(t, bad, prefix, "127.0.0.1:0", "127.0.0.2:0", up, 2, false, `rls_listen = "127.0.0.3:0"`, `rls_config = "`+rules+`.bad"`)
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	if err := run(sctx, []string{"-config", bad}, env, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "fortnight") {
		t.Fatalf("run with an invalid rules file: %v", err)
	}
}
