package conf

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"
)

// This file holds the edge-security keys: the proxy's deny list and JWT
// identity, a rule's access keys, and the backend's admin token policy.

// DefaultDenyPrefixes are the paths the proxy never forwards by default: the
// backend's admin API and the operational endpoints every seckill binary
// serves (readiness names failing dependencies, metrics and pprof reveal
// internals).
func DefaultDenyPrefixes() []string {
	return []string{"/admin/", "/metrics", "/readyz", "/healthz", "/debug/"}
}

// RuleAccess are the keys of a [[proxy.rules]] entry that decide who may
// pass, apart from its limits.
type RuleAccess struct {
	// AllowFrom lets clients inside these CIDRs through to a path of
	// [proxy] deny_prefixes that this rule matches.
	AllowFrom []string `toml:"allow_from"`
	// RequireJWT answers 401 to a request this rule matches unless it carries
	// a token that [proxy.identity] jwt verifies.
	RequireJWT bool `toml:"require_jwt"`
}

func (a *RuleAccess) validate(p *problems, key string, jwt *JWT) {
	for i, c := range a.AllowFrom {
		if _, err := netip.ParsePrefix(c); err != nil {
			p.add(keyIndex(key+".allow_from", i), "must be a CIDR such as 10.0.0.0/8, got %q", c)
		}
	}
	if a.RequireJWT && jwt == nil {
		p.add(key+".require_jwt", "needs [proxy.identity] jwt to verify tokens with")
	}
}

// Identity is the [proxy.identity] section: how the proxy establishes the
// user a request acts for.
type Identity struct {
	// JWT, when set, verifies a bearer token and sets X-User-ID to its claim.
	JWT *JWT `toml:"jwt"`
}

// JWT is [proxy.identity] jwt: where the token is, how it is verified, and
// which claim names the user.
type JWT struct {
	// Header carries the token ("Authorization": "Bearer <token>"; another
	// header: the token, with or without "Bearer "). Exclusive with Cookie.
	Header string `toml:"header"`
	// Cookie carries the token instead of a header.
	Cookie string `toml:"cookie"`
	// Alg is the one accepted algorithm: HS256, RS256 or ES256.
	Alg string `toml:"alg"`
	// KeyFile holds the HMAC secret (HS256) or the PEM public key (RS256,
	// ES256).
	KeyFile string `toml:"key_file"`
	// Claim becomes X-User-ID.
	Claim string `toml:"claim"`
	// Issuer and Audience, when set, must match iss and aud.
	Issuer   string   `toml:"issuer"`
	Audience string   `toml:"audience"`
	Leeway   Duration `toml:"leeway"`
}

// JWTAlgs are the algorithms [proxy.identity] jwt accepts.
var JWTAlgs = []string{"HS256", "RS256", "ES256"}

func (j *JWT) validate(p *problems) {
	const key = "proxy.identity.jwt"
	switch {
	case j.Header != "" && j.Cookie != "":
		p.add(key, "header and cookie are mutually exclusive")
	case j.Header == "" && j.Cookie == "":
		j.Header = "Authorization"
	}
	if j.Header != "" && !isToken(j.Header) {
		p.add(key+".header", "must be an HTTP header name, got %q", j.Header)
	}
	if j.Cookie != "" && !isToken(j.Cookie) {
		p.add(key+".cookie", "must be a cookie name, got %q", j.Cookie)
	}
	if !contains(JWTAlgs, j.Alg) {
		p.add(key+".alg", "must be one of %s, got %q", strings.Join(JWTAlgs, ", "), j.Alg)
	}
	if j.KeyFile == "" {
		p.add(key+".key_file", "is required (HS256: the secret; RS256/ES256: the PEM public key)")
	}
	if j.Claim == "" {
		j.Claim = "sub"
	}
	if j.Leeway.Duration < 0 || j.Leeway.Duration > 10*time.Minute {
		p.add(key+".leeway", "must be between 0s and 10m, got %q", j.Leeway.String())
	}
}

// isToken reports whether s is an RFC 9110 token (header and cookie names).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// MinAdminTokenBytes is the shortest admin token accepted outside dev mode:
// 32 random bytes cannot be guessed, whatever the request rate.
const MinAdminTokenBytes = 32

// defaultAdminTokens are tokens published with this repository (its sample
// configuration, compose file and earlier releases): refused outside dev
// mode whatever their length.
var defaultAdminTokens = []string{
	"dev-admin-token-change-me",
	"change-me",
	"changeme",
	"e2e-admin-token-Zq8",
}

// AdminTokenKey names where the admin token comes from, for messages.
func (b *Backend) AdminTokenKey() string {
	if b.AdminTokenFile != "" {
		return "backend.admin_token_file"
	}
	return "backend.admin_token"
}

// ReadAdminToken returns the admin token as configured: admin_token, or the
// content of admin_token_file without surrounding white space; "" when
// neither is set (admin API off). It applies no policy (see LoadAdminToken).
func (b *Backend) ReadAdminToken() (string, error) {
	if b.AdminTokenFile == "" {
		return b.AdminToken, nil
	}
	data, err := os.ReadFile(b.AdminTokenFile)
	if err != nil {
		return "", fmt.Errorf("config: backend.admin_token_file: %w", err)
	}
	tok := string(bytes.TrimSpace(data))
	if tok == "" {
		return "", fmt.Errorf("config: backend.admin_token_file: %s holds no token", b.AdminTokenFile)
	}
	return tok, nil
}

// LoadAdminToken reads the admin token and refuses, outside dev_mode, a
// token published with the project or shorter than MinAdminTokenBytes. The
// error names the key and never contains the token.
func (b *Backend) LoadAdminToken() (string, error) {
	tok, err := b.ReadAdminToken()
	if err != nil || tok == "" || b.DevMode {
		return tok, err
	}
	if err := CheckAdminToken(tok); err != nil {
		return "", fmt.Errorf("config: %s: %w (or set backend.dev_mode = true for local development)", b.AdminTokenKey(), err)
	}
	return tok, nil
}

// CheckAdminToken is the production policy for an admin token.
func CheckAdminToken(tok string) error {
	for _, d := range defaultAdminTokens {
		if tok == d {
			return fmt.Errorf("is a default token published with seckill; generate your own, e.g. openssl rand -hex 32")
		}
	}
	if len(tok) < MinAdminTokenBytes {
		return fmt.Errorf("is %d bytes, needs at least %d; generate one, e.g. openssl rand -hex 32", len(tok), MinAdminTokenBytes)
	}
	return nil
}

func (b *Backend) validateAdmin(p *problems) {
	if b.AdminToken != "" && b.AdminTokenFile != "" {
		p.add("backend.admin_token_file", "is mutually exclusive with backend.admin_token (%s); set one", EnvAdminToken)
	}
	b.AdminFailures.validate(p, "backend.admin_failure_limit")
}
