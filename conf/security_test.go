package conf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSecurityKeys(t *testing.T) {
	c, err := Parse(`
[proxy]
deny_prefixes = ["/internal/"]
[proxy.identity]
jwt = { cookie = "session", alg = "RS256", key_file = "/etc/seckill/jwt.pem", issuer = "shop", audience = "seckill", leeway = "5s" }
[[proxy.rules]]
name = "admin"
path_prefix = "/internal/"
allow_from = ["10.0.0.0/8", "fd00::/8"]
per_ip = { limit = 5, window = "1s" }
[[proxy.rules]]
name = "purchase"
path_prefix = "/api/"
require_jwt = true
per_ip = { limit = 5, window = "1s" }
`, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	j := c.Proxy.Identity.JWT
	if j == nil || j.Cookie != "session" || j.Header != "" || j.Alg != "RS256" || j.Claim != "sub" || j.Leeway.Duration != 5*time.Second {
		t.Errorf("jwt = %+v", j)
	}
	if strings.Join(c.Proxy.DenyPrefixes, ",") != "/internal/" {
		t.Errorf("deny_prefixes = %v", c.Proxy.DenyPrefixes)
	}
	if r := c.Proxy.Rules[0]; len(r.AllowFrom) != 2 || r.RequireJWT {
		t.Errorf("rule 0 = %+v", r)
	}
	if r := c.Proxy.Rules[1]; !r.RequireJWT {
		t.Errorf("rule 1 = %+v", r)
	}

	def, err := Parse("[proxy.identity]\njwt = { alg = \"HS256\", key_file = \"/k\" }", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if j := def.Proxy.Identity.JWT; j.Header != "Authorization" || j.Claim != "sub" {
		t.Errorf("jwt defaults = %+v", j)
	}
	if got := strings.Join(def.Proxy.DenyPrefixes, ","); got != "/admin/,/metrics,/readyz,/healthz,/debug/" {
		t.Errorf("default deny_prefixes = %s", got)
	}
	if def.Backend.AdminFailures.Limit != 10 || def.Backend.AdminFailures.Window.Duration != time.Minute {
		t.Errorf("default admin_failure_limit = %+v", def.Backend.AdminFailures)
	}
}

func TestAdminTokenPolicy(t *testing.T) {
	strong := strings.Repeat("k", MinAdminTokenBytes)
	for _, tc := range []struct {
		name  string
		token string
		dev   bool
		err   string // "" accepted
	}{
		{"shipped sample", "dev-admin-token-change-me", false, "backend.admin_token: is a default token"},
		{"compose default", "change-me", false, "backend.admin_token: is a default token"},
		{"old e2e token", "e2e-admin-token-Zq8", false, "is a default token"},
		{"short", strings.Repeat("k", MinAdminTokenBytes-1), false, "is 31 bytes, needs at least 32"},
		{"strong", strong, false, ""},
		{"shipped sample in dev mode", "dev-admin-token-change-me", true, ""},
		{"short in dev mode", "abc", true, ""},
		{"none: admin API off", "", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Default().Backend
			b.AdminToken, b.DevMode = tc.token, tc.dev
			got, err := b.LoadAdminToken()
			if tc.err == "" {
				if err != nil || got != tc.token {
					t.Fatalf("LoadAdminToken = %q, %v; want %q", got, err, tc.token)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "dev_mode") {
				t.Fatalf("LoadAdminToken error %v; want it to contain %q and mention dev_mode", err, tc.err)
			}
			if tc.token != "" && strings.Contains(err.Error(), tc.token) {
				t.Errorf("the error shows the token: %v", err)
			}
		})
	}
}

func TestAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	strong := strings.Repeat("s", 40)
	if err := os.WriteFile(path, []byte("  "+strong+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse("[backend]\nadmin_token_file = \""+path+"\"", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Backend.LoadAdminToken(); err != nil || got != strong {
		t.Fatalf("LoadAdminToken = %q, %v", got, err)
	}
	// The file is read on every call (SIGHUP reload).
	if err := os.WriteFile(path, []byte("change-me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Backend.LoadAdminToken(); err == nil || !strings.Contains(err.Error(), "backend.admin_token_file: is a default token") {
		t.Fatalf("default token in the file: %v", err)
	}
	if err := os.WriteFile(path, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Backend.LoadAdminToken(); err == nil || !strings.Contains(err.Error(), "holds no token") {
		t.Fatalf("empty file: %v", err)
	}
	c.Backend.AdminTokenFile = filepath.Join(dir, "missing")
	if _, err := c.Backend.LoadAdminToken(); err == nil || !strings.Contains(err.Error(), "backend.admin_token_file") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestAdminTokenEnv(t *testing.T) {
	file := "[backend]\nadmin_token = \"from-the-file\""
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	c, err := Parse(file, env(map[string]string{EnvAdminTokenFile: "/run/secrets/admin"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Backend.AdminToken != "" || c.Backend.AdminTokenFile != "/run/secrets/admin" {
		t.Errorf("SECKILL_ADMIN_TOKEN_FILE did not replace the token source: %+v", c.Backend)
	}
	c, err = Parse("[backend]\nadmin_token_file = \"/x\"", env(map[string]string{EnvAdminToken: "tok"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Backend.AdminToken != "tok" || c.Backend.AdminTokenFile != "" {
		t.Errorf("SECKILL_ADMIN_TOKEN did not replace the token source: %+v", c.Backend)
	}
	_, err = Parse("", env(map[string]string{EnvAdminToken: "a", EnvAdminTokenFile: "/b"}))
	if err == nil || !strings.Contains(err.Error(), EnvAdminTokenFile) {
		t.Errorf("both variables: %v", err)
	}
}
