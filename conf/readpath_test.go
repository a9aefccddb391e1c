package conf

import (
	"strings"
	"testing"
	"time"
)

func TestReadPathKeys(t *testing.T) {
	bad := []struct{ doc, want string }{
		{"[backend]\nstate_cache_ttl = \"-1ms\"", "backend.state_cache_ttl: must be between 0s (no cache) and 1m"},
		{"[backend]\nstate_cache_ttl = \"2m\"", "backend.state_cache_ttl: must be between 0s (no cache) and 1m"},
		{"[backend]\norder_wait_max = \"1h\"", "backend.order_wait_max: must be between 0s (no long-polls) and 5m"},
		{"[backend]\nmax_order_waiters = 0", "backend.max_order_waiters: must be between 1 and 10000000"},
		{"[[proxy.rules]]\nname = \"r\"\npath_prefix = \"/\"\nper_ip = { limit = 1, window = \"1s\" }\nread_cache_ttl = \"2m\"", "proxy.rules[0].read_cache_ttl: must be between 0s (off) and 1m"},
		{"[[proxy.rules]]\nname = \"r\"\nmethods = [\"POST\"]\npath_prefix = \"/\"\nper_ip = { limit = 1, window = \"1s\" }\nread_cache_ttl = \"1s\"", "proxy.rules[0].read_cache_ttl: caches GET answers, but the rule's methods [POST] have no GET"},
	}
	for _, tc := range bad {
		_, err := Parse(tc.doc, noEnv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to mention %q", tc.doc, err, tc.want)
		}
	}
	cfg, err := Parse("[backend]\nstate_cache_ttl = \"0s\"\norder_wait_max = \"0s\"\n[[proxy.rules]]\nname = \"r\"\nmethods = [\"GET\"]\npath_prefix = \"/\"\nper_ip = { limit = 1, window = \"1s\" }\nread_cache_ttl = \"250ms\"", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Backend.StateCacheTTL.Duration != 0 || cfg.Backend.OrderWaitMax.Duration != 0 || cfg.Proxy.Rules[0].ReadCacheTTL.Duration != 250*time.Millisecond {
		t.Errorf("parsed %+v %+v", cfg.Backend, cfg.Proxy.Rules[0])
	}
}

func TestGroupKeys(t *testing.T) {
	bad := []struct{ doc, want string }{
		{"[backend]\ngroup_max = 0", "backend.group_max: must be between 1 and 1024, got 0"},
		{"[backend]\ngroup_max = 1025", "backend.group_max: must be between 1 and 1024, got 1025"},
		{"[backend]\ngroup_linger = \"-1ms\"", "backend.group_linger: must be between 0s (no wait) and 100ms"},
		{"[backend]\ngroup_linger = \"1s\"", "backend.group_linger: must be between 0s (no wait) and 100ms"},
		{"[backend]\ngroup_message = \"all\"", `backend.group_message: must be "batch" or "each", got "all"`},
	}
	for _, tc := range bad {
		_, err := Parse(tc.doc, noEnv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to mention %q", tc.doc, err, tc.want)
		}
	}
	cfg, err := Parse("[backend]\ngroup_max = 1\ngroup_linger = \"0s\"\ngroup_message = \"batch\"", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if b := cfg.Backend; b.GroupMax != 1 || b.GroupLinger.Duration != 0 || b.GroupMessage != GroupBatch {
		t.Errorf("parsed %d %v %q", b.GroupMax, b.GroupLinger, b.GroupMessage)
	}
}
