package edge

import (
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
)

// Review (s3-revlim), finding: a header:Authorization keyed window is vouched
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
func TestReviewTokenSpellingsShareOneWindow(t *testing.T) {
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
