package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "seckill.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Flags override [bench]; keys the flags leave alone keep the file's values;
// the admin token and the verifier's stores come from the SECKILL_* variables.
func TestFlagsOverrideConfig(t *testing.T) {
	p := writeConfig(t, `
[bench]
targets = ["http://127.0.0.1:1"]
stock = 77
users = 500
rate = 100
[redis]
key_prefix = "file:"
`)
	t.Setenv("SECKILL_ADMIN_TOKEN", "env-token-123")
	t.Setenv("SECKILL_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/from_env")
	cfg, o, err := parseFlags([]string{"-config", p, "-targets", "http://127.0.0.1:2, http://127.0.0.1:3",
		"-users", "900", "-rate", "0", "-redis-prefix", "flag:", "-activity", "0", "-warmup", "0s",
		"-json", "r.json", "-html", "r.html", "-quiet"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Bench
	if len(b.Targets) != 2 || b.Targets[1] != "http://127.0.0.1:3" {
		t.Errorf("targets %v", b.Targets)
	}
	if b.Stock != 77 || b.Users != 900 || b.Rate != 0 || b.ActivityID != 0 || b.Warmup.Duration != 0 {
		t.Errorf("stock %d users %d rate %d activity %d warmup %s", b.Stock, b.Users, b.Rate, b.ActivityID, b.Warmup)
	}
	if cfg.Redis.KeyPrefix != "flag:" || !strings.HasSuffix(cfg.MySQL.DSN, "/from_env") {
		t.Errorf("prefix %q dsn %q", cfg.Redis.KeyPrefix, cfg.MySQL.DSN)
	}
	// The options beyond the configuration reach the caller (they were
	// parsed into a copy, and bench.sh found no report to read).
	if o.jsonPath != "r.json" || o.htmlPath != "r.html" || !o.quiet {
		t.Errorf("json %q html %q quiet %v", o.jsonPath, o.htmlPath, o.quiet)
	}
	if o.adminToken != "env-token-123" {
		t.Errorf("admin token %q", o.adminToken)
	}
}

// A bad value is refused naming the key and the reason.
func TestFlagsValidate(t *testing.T) {
	p := writeConfig(t, "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-source-net", "10.0.0.0/8"}, "bench.source_net: must lie inside 127.0.0.0/8"},
		{[]string{"-users", "0"}, "bench.users: must be between 1 and"},
		{[]string{"-hot-share", "2"}, "bench.hot_share: must be between 0 and 1"},
		{[]string{"-targets", "ftp://x"}, "bench.targets[0]: must be an http://host:port URL"},
	} {
		_, _, err := parseFlags(append([]string{"-config", p, "-admin-token", "x"}, c.args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.args, err, c.want)
		}
	}
	if _, _, err := parseFlags([]string{"-config", filepath.Join(t.TempDir(), "missing.toml")}, io.Discard, io.Discard); err == nil {
		t.Error("an explicit missing config file must be an error")
	}
}

func TestBucketFor(t *testing.T) {
	for _, c := range []struct{ total, want time.Duration }{
		{time.Second, 100 * time.Millisecond},
		{15 * time.Second, 100 * time.Millisecond},
		{60 * time.Second, 400 * time.Millisecond},
		{time.Hour, 5 * time.Second},
	} {
		if got := bucketFor(c.total); got != c.want {
			t.Errorf("bucketFor(%s) = %s, want %s", c.total, got, c.want)
		}
	}
}

// -cpu and -ceilings are parsed at the command line: a bad group or a file
// without rates is refused naming the flag.
func TestCPUAndCeilingFlags(t *testing.T) {
	p := writeConfig(t, "")
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, []byte(`[{"name":"reserve","unit":"calls/s","per_second":1234}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, o, err := parseFlags([]string{"-config", p, "-admin-token", "x", "-cpu", "proxy=1,worker=2+3", "-ceilings", good}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.cpu) != 2 || o.cpu[1].Name != "worker" || len(o.cpu[1].PIDs) != 2 {
		t.Errorf("cpu groups %+v", o.cpu)
	}
	if c, ok := o.ceilings.Get("reserve"); !ok || c.PerSecond != 1234 {
		t.Errorf("ceilings %+v", o.ceilings)
	}
	norate := filepath.Join(dir, "norate.json")
	if err := os.WriteFile(norate, []byte(`[{"name":"reserve"}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-cpu", "proxy=x"}, `-cpu: process group "proxy=x"`},
		{[]string{"-ceilings", filepath.Join(dir, "missing.json")}, "-ceilings: open"},
		{[]string{"-ceilings", norate}, `ceiling "reserve" has no rate`},
	} {
		_, _, err := parseFlags(append([]string{"-config", p, "-admin-token", "x"}, c.args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.args, err, c.want)
		}
	}
	if err := run(t.Context(), []string{"ceilings", "-duration", "0s", "-config", p}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Errorf("ceilings -duration 0s: %v", err)
	}
}

// A -before-drain command that does not end is killed at its bound, with an
// error naming the command and the bound, not waited for.
func TestBeforeDrainHookIsBounded(t *testing.T) {
	var out strings.Builder
	t0 := time.Now()
	err := runHook(t.Context(), "exec sleep 300", &out, time.Second)
	if err == nil || !strings.Contains(err.Error(), `-before-drain "exec sleep 300": not done within 1s`) {
		t.Fatalf("error %v, want the bound named", err)
	}
	t.Logf("returned after %v: %v", time.Since(t0), err)
	if err := runHook(t.Context(), "echo resumed", &out, time.Second); err != nil || out.String() != "resumed\n" {
		t.Fatalf("a quick hook: %v, output %q", err, out.String())
	}
}
