package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/seckill/seckill/internal/cli"
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

// -check loads and validates rls_config as the proxy does at start: a bad
// rule is reported with the key, the file, the domain and the descriptor
// path, and run returns cli.ErrCheckFailed (exit status 1); a good one
// passes; with rls_listen off the files are not read, as at start.
func TestCheckValidatesRLSRules(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	servicetest.Must(t, os.WriteFile(good, []byte("domain: shop\ndescriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 2}}]\n"), 0o600), "write")
	servicetest.Must(t, os.WriteFile(bad, []byte("domain: shop\ndescriptors:\n  - key: user\n    descriptors:\n      - key: path\n        rate_limit: {unit: fortnight, requests_per_unit: 2}\n"), 0o600), "write")
	check := func(keys ...string) (string, error) {
		path := filepath.Join(dir, "seckill.toml")
		writeConfig(t, path, "p:", "127.0.0.1:0", "127.0.0.2:0", "127.0.0.1:1", 2, false, keys...)
		var out bytes.Buffer
		err := run(context.Background(), []string{"-check", "-config", path}, func(string) string { return "" }, &out, io.Discard)
		return out.String(), err
	}
	out, err := check(`rls_listen = "127.0.0.3:0"`, `rls_config = "`+bad+`"`)
	if !errors.Is(err, cli.ErrCheckFailed) || cli.ExitCode(err) != 1 {
		t.Fatalf("-check with a bad rule: %v (exit %d), want ErrCheckFailed (exit 1)", err, cli.ExitCode(err))
	}
	for _, want := range []string{"proxy.rls_config", bad, `domain "shop"`, "descriptor shop.user.path", `invalid unit "fortnight"`} {
		if !strings.Contains(out, want) {
			t.Errorf("-check output %q lacks %q", out, want)
		}
	}
	if out, err := check(`rls_listen = "127.0.0.3:0"`, `rls_config = "`+filepath.Join(dir, "missing")+`"`); err == nil || !strings.Contains(out, "missing") {
		t.Errorf("-check with a missing rls_config: %v %q", err, out)
	}
	if out, err := check(`rls_listen = "127.0.0.3:0"`, `rls_config = "`+good+`"`); err != nil || !strings.Contains(out, "configuration ok") {
		t.Errorf("-check with good rules: %v %q", err, out)
	}
	if out, err := check(`rls_config = "` + bad + `"`); err != nil {
		t.Errorf("-check with the service off read rls_config: %v %q", err, out)
	}
}

// SIGHUP reloads the rls_* keys a running service can change: a moved
// rls_config (read, and watched instead of the old path), shadow mode and
// response headers, all or nothing; the start-only keys log a warning and
// keep their running values. Seen by a real gRPC client.
func TestRunRLSReloadsKeysOnSIGHUP(t *testing.T) {
	_, prefix := servicetest.Redis(t)
	up := servicetest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }})
	dir := t.TempDir()
	path := filepath.Join(dir, "seckill.toml")
	first, second, bad := filepath.Join(dir, "first.yaml"), filepath.Join(dir, "second", "rules.yaml"), filepath.Join(dir, "bad.yaml")
	servicetest.Must(t, os.Mkdir(filepath.Dir(second), 0o700), "mkdir")
	writeRules := func(file string, limit int) {
		doc := fmt.Sprintf("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {name: per-user, unit: minute, requests_per_unit: %d}\n", limit)
		servicetest.Must(t, os.WriteFile(file, []byte(doc), 0o600), "write rules")
	}
	writeRules(first, 2)
	writeRules(second, 3)
	servicetest.Must(t, os.WriteFile(bad, []byte("domain: shop\ndescriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 99999999}}]\n"), 0o600), "write")
	config := func(rules string, extra ...string) {
		writeConfig(t, path, prefix, "127.0.0.1:0", "127.0.0.2:0", up, 2, false,
			append([]string{`rls_listen = "127.0.0.3:0"`, `rls_config = "` + rules + `"`}, extra...)...)
	}
	config(first)
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
	conn, err := grpc.NewClient(rec["listen"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	servicetest.Must(t, err, "grpc client")
	defer conn.Close()
	client := pb.NewRateLimitServiceClient(conn)
	user := 0
	// calls makes n calls for a fresh user (a fresh window): the answers.
	calls := func(n int) []*pb.RateLimitResponse {
		user++
		var out []*pb.RateLimitResponse
		for range n {
			resp, err := client.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "shop",
				Descriptors: []*rlc.RateLimitDescriptor{{Entries: []*rlc.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprint("u", user)}}}}})
			servicetest.Must(t, err, "ShouldRateLimit")
			out = append(out, resp)
		}
		return out
	}
	// state is what a fresh window's calls show: the limit, the calls
	// answered OK of limit+2, whether the headers came.
	state := func(limit int) (current uint32, ok int, headers bool) {
		rs := calls(limit + 2)
		for _, r := range rs {
			if r.OverallCode == pb.RateLimitResponse_OK {
				ok++
			}
		}
		return rs[0].Statuses[0].CurrentLimit.GetRequestsPerUnit(), ok, len(rs[0].ResponseHeadersToAdd) > 0
	}
	if cur, ok, h := state(2); cur != 2 || ok != 2 || h {
		t.Fatalf("at start: limit %d, %d of 4 OK, headers %v; want 2, 2, false", cur, ok, h)
	}
	reloads := 0
	hup := func() {
		reloads++
		servicetest.Must(t, syscall.Kill(os.Getpid(), syscall.SIGHUP), "sighup")
		for deadline := time.Now().Add(time.Minute); sighupReloads(logs, true)+
			len(logs.records("rls config reload rejected, running config kept")) < reloads; {
			if time.Now().After(deadline) {
				t.Fatalf("reload %d left no rls record in the log", reloads)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// Moved rules, shadow mode and headers on, a start-only key changed.
	config(second, "rls_shadow_mode = true", "rls_response_headers = true", "rls_max_concurrent_streams = 7")
	hup()
	if cur, ok, h := state(3); cur != 3 || ok != 5 || !h {
		t.Fatalf("after reload: limit %d, %d of 5 OK, headers %v; want 3, 5 (shadow), true", cur, ok, h)
	}
	w := logs.await(t, "rls keys changed that take effect only at a restart; their running values stay", 1)
	if keys, _ := w["keys"].([]any); len(keys) != 1 || keys[0] != "rls_max_concurrent_streams" {
		t.Fatalf("restart warning names %v, want [rls_max_concurrent_streams]", w["keys"])
	}

	// The new path is watched; the old one no longer is.
	writeRules(first, 9)
	writeRules(second, 4)
	for deadline := time.Now().Add(time.Minute); sighupReloads(logs, false) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watch of the moved rls_config did not reload it")
		}
	}
	time.Sleep(500 * time.Millisecond) // past the watch's settling time: a late reload of first would show
	if cur, _, _ := state(4); cur != 4 {
		t.Fatalf("after the moved file changed: limit %d, want 4 (the old path's 9 must not load)", cur)
	}

	// Bad rules with other keys changed: nothing changes.
	config(bad, "rls_shadow_mode = false", "rls_response_headers = false", "rls_max_concurrent_streams = 7")
	hup()
	if len(logs.records("rls config reload rejected, running config kept")) != 1 {
		t.Fatal("the bad rules were not rejected")
	}
	if cur, ok, h := state(4); cur != 4 || ok != 6 || !h {
		t.Fatalf("after a rejected reload: limit %d, %d of 6 OK, headers %v; want 4, 6 (shadow kept), true", cur, ok, h)
	}
	// Back to enforcing, on the same path.
	config(second, "rls_max_concurrent_streams = 7")
	hup()
	if cur, ok, h := state(4); cur != 4 || ok != 4 || h {
		t.Fatalf("after shadow off: limit %d, %d of 6 OK, headers %v; want 4, 4, false", cur, ok, h)
	}
}

// SIGHUP changes rls_on_redis_error: with Redis unreachable, "open"
// admits, then "envoy" answers UNAVAILABLE (Envoy's failure_mode_deny
// decides), then "closed" refuses.
func TestRunRLSReloadsOnRedisError(t *testing.T) {
	up := servicetest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }})
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "listen")
	deadAddr := dead.Addr().String()
	dead.Close() // nothing listens there: every Redis call fails at once
	dir := t.TempDir()
	path, rules := filepath.Join(dir, "seckill.toml"), filepath.Join(dir, "rules.yaml")
	servicetest.Must(t, os.WriteFile(rules, []byte("domain: shop\ndescriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 1}}]\n"), 0o600), "write")
	config := func(mode string) {
		writeConfig(t, path, "p:", "127.0.0.1:0", "127.0.0.2:0", up, 2, false,
			`rls_listen = "127.0.0.3:0"`, `rls_config = "`+rules+`"`, `rls_on_redis_error = "`+mode+`"`)
	}
	config("open")
	env := func(k string) string {
		if k == "SECKILL_REDIS_URL" {
			return "redis://" + deadAddr + "/0"
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
	conn, err := grpc.NewClient(rec["listen"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	servicetest.Must(t, err, "grpc client")
	defer conn.Close()
	client := pb.NewRateLimitServiceClient(conn)
	answer := func() (pb.RateLimitResponse_Code, codes.Code) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "shop",
			Descriptors: []*rlc.RateLimitDescriptor{{Entries: []*rlc.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}}}}})
		return resp.GetOverallCode(), status.Code(err)
	}
	for i := range 3 {
		if c, e := answer(); c != pb.RateLimitResponse_OK || e != codes.OK {
			t.Fatalf("open, call %d: %v %v; want OK", i, c, e)
		}
	}
	for n, tc := range []struct {
		mode string
		code pb.RateLimitResponse_Code
		err  codes.Code
	}{{"envoy", pb.RateLimitResponse_UNKNOWN, codes.Unavailable}, {"closed", pb.RateLimitResponse_OVER_LIMIT, codes.OK}} {
		config(tc.mode)
		servicetest.Must(t, syscall.Kill(os.Getpid(), syscall.SIGHUP), "sighup")
		for deadline := time.Now().Add(time.Minute); sighupReloads(logs, true) < n+1; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("reload to %s left no record", tc.mode)
			}
		}
		if c, e := answer(); c != tc.code || e != tc.err {
			t.Fatalf("%s: %v %v; want %v %v", tc.mode, c, e, tc.code, tc.err)
		}
	}
}

// sighupReloads counts the "rls config reloaded" records of SIGHUP
// (sighup), which name the settings, or of the files' watch (!sighup),
// which changes only the rules.
func sighupReloads(logs *logBuffer, sighup bool) int {
	n := 0
	for _, r := range logs.records("rls config reloaded") {
		if _, ok := r["on_redis_error"]; ok == sighup {
			n++
		}
	}
	return n
}
