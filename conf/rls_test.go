package conf

import (
	"strings"
	"testing"
)

func TestRLSKeys(t *testing.T) {
	c, err := Parse("", noEnv)
	if err != nil || c.Proxy.RLS.Listen != "" || c.Proxy.RLS.OnRedisError != "local" || c.Proxy.RLS.MaxStreams != 1024 || c.Proxy.RLS.NearLimitRatio != 0.8 {
		t.Fatalf("defaults: %+v, %v", c.Proxy.RLS, err)
	}
	c, err = Parse(`[proxy]
rls_listen = "127.0.0.1:8089"
rls_config = "conf/ratelimit"
rls_on_redis_error = "envoy"
rls_response_headers = true
rls_shadow_mode = true
rls_reflection = true
rls_near_limit_ratio = 0.5
rls_max_concurrent_streams = 10
rls_max_message_bytes = 4096
`, noEnv)
	want := RLS{Listen: "127.0.0.1:8089", Config: "conf/ratelimit", OnRedisError: "envoy", ResponseHeaders: true,
		ShadowMode: true, Reflection: true, NearLimitRatio: 0.5, MaxStreams: 10, MaxMessageBytes: 4096}
	if err != nil || c.Proxy.RLS != want {
		t.Fatalf("got %+v, %v; want %+v", c.Proxy.RLS, err, want)
	}
	bad := []struct{ doc, want string }{
		{`rls_listen = "127.0.0.1:8089"`, "proxy.rls_config: is required"},
		{"rls_listen = \"127.0.0.1:8080\"\nrls_config = \"x\"", "proxy.rls_listen: must differ"},
		{"rls_listen = \"nohost\"\nrls_config = \"x\"", "proxy.rls_listen: must be host:port"},
		{"rls_listen = \"127.0.0.1:8089\"\nrls_config = \"x\"\nrls_on_redis_error = \"deny\"", "proxy.rls_on_redis_error"},
		{"rls_listen = \"127.0.0.1:8089\"\nrls_config = \"x\"\nrls_max_message_bytes = 10", "proxy.rls_max_message_bytes"},
		{"rls_listen = \"127.0.0.1:8089\"\nrls_config = \"x\"\nrls_max_concurrent_streams = 0", "proxy.rls_max_concurrent_streams"},
		{"rls_listen = \"127.0.0.1:8089\"\nrls_config = \"x\"\nrls_near_limit_ratio = 1.5", "proxy.rls_near_limit_ratio: must be between 0 and 1, got 1.5"},
		{"rls_listen = \"127.0.0.1:8089\"\nrls_config = \"x\"\nrls_near_limit_ratio = nan", "proxy.rls_near_limit_ratio: must be between 0 and 1, got NaN"},
		{`rls_lissen = "x"`, "proxy.rls_lissen: unknown key"},
	}
	for _, tc := range bad {
		_, err := Parse("[proxy]\n"+tc.doc, noEnv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v; want %q", tc.doc, err, tc.want)
		}
	}
}
