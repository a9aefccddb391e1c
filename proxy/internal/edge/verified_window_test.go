package edge

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
)

// Guards a review finding (s3-revlim): a header:Authorization keyed window is vouched
// for once the request's token verified, but it counts by the raw header
// value, while the verifier accepts many spellings of one token
// (token.Bearer: the scheme in any case, any run of spaces or tabs after
// it). So one user with one valid token gets a fresh window per spelling:
// "Bearer t", "bearer t", "BEARER t", "Bearer  t", ... — it escapes its own
// window (2^6 case variants times any number of blanks: unbounded). The
// limit must count what was verified (the token, or better the user), not
// the bytes around it.
//
// Expected: one token, 8 requests, limit 2 → 2 admitted. The test fails
// while every spelling is a window of its own.
func TestTokenSpellingsShareOneWindow(t *testing.T) {
	t.Parallel()
	const secret = "jwt-secret-for-the-review-spelling-test-01"
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr) // no trusted proxies: the test's peer is not one
	cfg.Proxy.RedisTimeout = conf.D(2 * time.Second)
	cfg.Proxy.Identity.JWT = &conf.JWT{Header: "Authorization", Alg: "HS256", KeyFile: writeSecret(t, secret), Claim: "sub", Issuer: "shop"}
	r := rule("token", 2, 0, 10*time.Second)
	r.PathPrefix, r.PerIP.Key = "/token/", "header:Authorization"
	cfg.Proxy.Rules = []conf.Rule{r}
	px := startProxy(t, cfg)
	c := client(px.addr)
	alice := hsToken(t, secret, "alice", time.Now().Add(time.Hour))
	spellings := []string{"Bearer ", "bearer ", "BEARER ", "bEARER ", "Bearer  ", "Bearer   ", "Bearer \t", "BeArEr "}
	ok := 0
	for _, s := range spellings {
		resp := get(t, c, "GET", "/token/x", "Authorization", s+alice)
		switch resp.StatusCode() {
		case 200:
			ok++
		case 429:
		default:
			t.Fatalf("%q: %d %s", s, resp.StatusCode(), resp.Body())
		}
	}
	if ok != 2 {
		t.Errorf("one valid token in %d spellings of its Authorization header: %d admitted, want 2 (one user, one token, one window of 2)",
			len(spellings), ok)
	}
}

// Guards a review finding (s3-revlim): with the token in a cookie, a cookie:<name>
// keyed window is vouched for once the token verified, but the gate and the
// limiter need not read the same cookie. The gate takes the first Cookie
// line whose <name> is a token68 (token.Extract skips a line whose value is
// not one); the limiter reads fasthttp's first <name> of all lines. A client
// sends "Cookie: session=junk!<n>" before "Cookie: session=<valid token>":
// the token verifies, and the window counts by junk!<n>, new every request.
//
// Expected: one token, 6 requests, limit 2 → 2 admitted.
func TestCookieWindowCountsTheVerifiedCookie(t *testing.T) {
	t.Parallel()
	const secret = "jwt-secret-for-the-review-cookie-test-0123"
	up := startUpstream(t)
	cfg := baseConfig(t, up.addr)
	cfg.Proxy.RedisTimeout = conf.D(2 * time.Second)
	cfg.Proxy.Identity.JWT = &conf.JWT{Cookie: "session", Alg: "HS256", KeyFile: writeSecret(t, secret), Claim: "sub", Issuer: "shop"}
	r := rule("sess", 2, 0, 10*time.Second)
	r.PathPrefix, r.PerIP.Key = "/sess/", "cookie:session"
	cfg.Proxy.Rules = []conf.Rule{r}
	px := startProxy(t, cfg)
	alice := hsToken(t, secret, "alice", time.Now().Add(time.Hour))
	ok := 0
	for i := range 6 {
		out := raw(t, px.addr, "GET /sess/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"+
			"Cookie: session=junk!"+strconv.Itoa(i)+"\r\nCookie: session="+alice+"\r\n\r\n", 5*time.Second)
		switch {
		case strings.HasPrefix(out, "HTTP/1.1 200"):
			ok++
		case strings.HasPrefix(out, "HTTP/1.1 429"):
		default:
			t.Fatalf("request %d: %.200q", i, out)
		}
	}
	if ok != 2 {
		t.Errorf("one valid session token beside a made-up session cookie per request: %d of 6 admitted, want 2 (one verified cookie, one window of 2)", ok)
	}
}
