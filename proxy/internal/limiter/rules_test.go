package limiter

import "testing"

// One parser serves both keys; each error names its own key and exactly
// the values that key takes ("envoy" only for the Envoy service's).
func TestParseModes(t *testing.T) {
	cases := []struct {
		rls     bool
		in      string
		want    Mode
		wantErr string
	}{
		{false, "", ModeLocal, ""},
		{false, "local", ModeLocal, ""},
		{false, "open", ModeOpen, ""},
		{false, "closed", ModeClosed, ""},
		{false, "envoy", 0, `on_redis_error "envoy": want local, open or closed`},
		{false, "Open", 0, `on_redis_error "Open": want local, open or closed`},
		{true, "", ModeLocal, ""},
		{true, "closed", ModeClosed, ""},
		{true, "envoy", ModeEnvoy, ""},
		{true, "deny", 0, `rls_on_redis_error "deny": want local, open, closed or envoy`},
	}
	for _, tc := range cases {
		parse := ParseMode
		if tc.rls {
			parse = ParseRLSMode
		}
		got, err := parse(tc.in)
		switch {
		case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
			t.Errorf("rls=%v %q: error %v, want %q", tc.rls, tc.in, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("rls=%v %q: %v, %v; want %v", tc.rls, tc.in, got, err, tc.want)
		}
	}
	if ModeEnvoy.String() != "envoy" || Mode(9).String() != "Mode(9)" {
		t.Errorf("String: %q %q", ModeEnvoy.String(), Mode(9).String())
	}
}
