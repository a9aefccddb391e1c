package rls

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlc "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The example configurations of envoyproxy/ratelimit's README
// (Configuration → Examples), each as a file of its own.
var readmeExamples = map[string]string{
	"example1.yaml": `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`,
	"example2.yaml": `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`,
	"example3.yaml": `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`,
	"example4.yaml": `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`,
	"example5.yaml": `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`,
	"example6.yaml": `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`,
	"example7.yaml": `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`,
	"example8.yaml": `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"example9.yaml": `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"example10.yaml": `
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
`,
	"example10_wildcard.yaml": `
domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
`,
	"example11.yaml": `
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
`,
}

// writeExamples writes the README examples into a fresh directory.
func writeExamples(t testing.TB) string {
	dir := t.TempDir()
	for name, doc := range readmeExamples {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// d builds a descriptor from key, value pairs.
func d(kv ...string) *rlc.RateLimitDescriptor {
	out := &rlc.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &rlc.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// limitOf looks a descriptor up as ShouldRateLimit does.
func limitOf(c *Config, domain string, desc *rlc.RateLimitDescriptor) (*Limit, *found) {
	top := c.domains[domain]
	if top == nil {
		return nil, nil
	}
	f := &found{}
	return top.lookup(desc.Entries, f), f
}

// The README's examples load from one directory and match as the README
// says (the windows' behaviour is in service_test.go).
func TestReadmeExamplesMatchAsDocumented(t *testing.T) {
	c, err := Load(writeExamples(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.Domains() != len(readmeExamples) {
		t.Fatalf("domains = %d, want %d", c.Domains(), len(readmeExamples))
	}
	cases := []struct {
		name, domain string
		desc         *rlc.RateLimitDescriptor
		requests     int           // -1: no limit
		length       time.Duration // of the limit
		path         string        // metric label
	}{
		{"ex1 users", "mongo_cps", d("database", "users"), 500, time.Second, "mongo_cps.database_users"},
		{"ex1 other value: no limit", "mongo_cps", d("database", "other"), -1, 0, ""},
		{"ex2 nested marketing", "messaging", d("message_type", "marketing", "to_number", "2061111111"), 5, 24 * time.Hour, "messaging.message_type_marketing.to_number"},
		{"ex2 any number", "messaging", d("to_number", "2061111111"), 100, 24 * time.Hour, "messaging.to_number"},
		{"ex3 any ip", "edge_proxy_per_ip", d("remote_address", "50.0.0.1"), 10, time.Second, "edge_proxy_per_ip.remote_address"},
		{"ex3 black-listed ip", "edge_proxy_per_ip", d("remote_address", "50.0.0.5"), 0, time.Second, "edge_proxy_per_ip.remote_address_50.0.0.5"},
		{"ex4 depth must match", "example4", d("key", "value"), -1, 0, ""},
		{"ex4 two levels", "example4", d("key", "value", "subkey", "subvalue"), 300, time.Second, "example4.key_value.subkey"},
		{"ex6 shadow user-a", "example6", d("service", "auth-service", "user", "user-a"), 10, time.Second, "example6.service.user_user-a"},
		{"ex8 detailed", "example8", d("key1", "unspecified_value"), 10, time.Minute, "example8.key1_unspecified_value"},
		{"ex8 value", "example8", d("key1", "value1"), 20, time.Minute, "example8.key1_value1"},
		{"ex9 trailing *", "example9", d("key1", "valueXYZ"), 20, time.Minute, "example9.key1_value*"},
		{"ex9 middle *", "example9", d("path", "/api/123/action"), 20, time.Minute, "example9.path_/api/*/action"},
		{"ex9 middle * other suffix", "example9", d("path", "/api/123/other"), -1, 0, ""},
		{"ex9 two *", "example9", d("route", "/api/v1/resource/123/action"), 20, time.Minute, "example9.route_/api/*/resource/*/action"},
		{"ex10 values in metric", "example10", d("route", "api", "http_method", "GET", "subject_id", "123"), 60, time.Minute, "example10.route_api.http_method_GET.subject_id"},
		{"ex10 wildcard value in metric", "example10_wildcard", d("user", "alice", "action", "readfile", "resource", "documents"), 100, time.Minute, "example10_wildcard.user_alice.action_readfile.resource"},
		{"ex11 shared", "example11", d("files", "files/a.pdf"), 10, time.Hour, "example11.files_files/*"},
		{"unknown domain", "nope", d("database", "users"), -1, 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, f := limitOf(c, tc.domain, tc.desc)
			if tc.requests < 0 {
				if l != nil {
					t.Fatalf("limit %+v, want none", l)
				}
				return
			}
			if l == nil {
				t.Fatal("no limit, want one")
			}
			if l.Requests != tc.requests || l.Length != tc.length {
				t.Fatalf("limit %d per %s, want %d per %s", l.Requests, l.Length, tc.requests, tc.length)
			}
			if got := label(tc.domain, tc.desc.Entries, f); got != tc.path {
				t.Fatalf("label %q, want %q", got, tc.path)
			}
		})
	}
	if l, _ := limitOf(c, "internal", d("ldap", "x")); l == nil || !l.Unlimited {
		t.Fatalf("ex5 ldap: %+v, want unlimited", l)
	}
	if l, _ := limitOf(c, "example6", d("service", "s", "user", "user-a")); l == nil || !l.Shadow {
		t.Fatalf("ex6 user-a: %+v, want shadow", l)
	}
	if l, _ := limitOf(c, "example7", d("key_2", "value_2", "user", "bkthomps")); l == nil || len(l.Replaces) != 1 || l.Replaces[0] != "specific_limit" {
		t.Fatalf("ex7 replacing limit: %+v", l)
	}
}

// share_threshold: every value a wildcard matches shares one window;
// without it each value has its own; other domains and entries never meet.
func TestKeys(t *testing.T) {
	c, err := Load(writeExamples(t))
	if err != nil {
		t.Fatal(err)
	}
	key := func(domain string, desc *rlc.RateLimitDescriptor) string {
		_, f := limitOf(c, domain, desc)
		return string(appendKey(nil, "p:", domain, desc.Entries, f))
	}
	if a, b := key("example11", d("files", "files/a.pdf")), key("example11", d("files", "files/b.csv")); a != b {
		t.Errorf("share_threshold: %s != %s", a, b)
	}
	if a, b := key("example11", d("files_no_share", "files_no_share/a.pdf")), key("example11", d("files_no_share", "files_no_share/b.csv")); a == b {
		t.Errorf("no share_threshold: both %s", a)
	}
	k := key("mongo_cps", d("database", "users"))
	if !strings.HasPrefix(k, "p:{rls:mongo_cps:") || !strings.HasSuffix(k, "}") || len(k) != len("p:{rls:mongo_cps:}")+32 {
		t.Errorf("key layout %q", k)
	}
	if key("mongo_cps", d("database", "users")) == key("mongo_cps", d("database", "default")) {
		t.Error("two values, one key")
	}
}

func TestUnitsMap(t *testing.T) {
	cases := []struct {
		unit string
		d    time.Duration
		pb   pb.RateLimitResponse_RateLimit_Unit
	}{
		{"second", time.Second, pb.RateLimitResponse_RateLimit_SECOND},
		{"MINUTE", time.Minute, pb.RateLimitResponse_RateLimit_MINUTE},
		{"hour", time.Hour, pb.RateLimitResponse_RateLimit_HOUR},
		{"day", 24 * time.Hour, pb.RateLimitResponse_RateLimit_DAY},
		{"week", 7 * 24 * time.Hour, pb.RateLimitResponse_RateLimit_WEEK},
		{"month", 30 * 24 * time.Hour, pb.RateLimitResponse_RateLimit_MONTH},
		{"year", 365 * 24 * time.Hour, pb.RateLimitResponse_RateLimit_YEAR},
		{"30s", 30 * time.Second, pb.RateLimitResponse_RateLimit_UNKNOWN},
		{"250ms", 250 * time.Millisecond, pb.RateLimitResponse_RateLimit_UNKNOWN},
		{"60s", time.Minute, pb.RateLimitResponse_RateLimit_MINUTE},
	}
	for _, tc := range cases {
		d, u, err := parseUnit(tc.unit)
		if err != nil || d != tc.d || u != tc.pb {
			t.Errorf("parseUnit(%q) = %s, %s, %v; want %s, %s", tc.unit, d, u, err, tc.d, tc.pb)
		}
	}
}

// Invalid files are refused with the file, the domain and the
// descriptor's path named.
func TestLoadErrors(t *testing.T) {
	cases := []struct{ name, doc, want string }{
		{"empty domain", "descriptors: []", "domain is empty"},
		{"unknown key", "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {}", `unknown field "rate_limt"`},
		{"empty key", "domain: d\ndescriptors:\n  - value: a", `domain "d": descriptor d.descriptors[0]: empty key`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: fortnight, requests_per_unit: 1}",
			`domain "d": descriptor d.a.b: rate_limit: invalid unit "fortnight"`},
		{"no unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}", `descriptor d.a: rate_limit: invalid unit ""`},
		{"unit too long", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: 9000h, requests_per_unit: 1}", "invalid unit"},
		{"over uint32", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}", "yaml"},
		{"over MaxLimit", "domain: d\ndescriptors:\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 10000001}", `descriptor d.a_b: requests_per_unit 10000001: more than 10000000`},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}", "unlimited takes no unit"},
		{"duplicate", "domain: d\ndescriptors:\n  - key: a\n  - key: a", "descriptor d.a: duplicate"},
		{"replaces empty", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}", "empty name"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: x, unit: second, requests_per_unit: 1, replaces: [{name: x}]}", "names its own limit"},
		{"quota mode", "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true", "quota_mode is not supported"},
		{"share without *", "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true", "share_threshold needs a wildcard"},
		{"brace in domain", "domain: 'a{b'\ndescriptors: []", "braces"},
		{"not yaml", "domain: [", "yaml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := filepath.Join(dir, "x.yaml")
			if err := os.WriteFile(f, []byte(tc.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Load(f)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), f) {
				t.Fatalf("Load: %v; want an error naming %s and containing %q", err, f, tc.want)
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors: []")
	write("b.yml", "domain: b\ndescriptors: []")
	write("notes.txt", "not yaml")
	write(".hidden.yaml", "not: [yaml")
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir)
	if err != nil || c.Domains() != 2 {
		t.Fatalf("Load = %v, %v; want 2 domains", c, err)
	}
	write("c.yaml", "domain: a\ndescriptors: []")
	// Refused as the reference server refuses it (no MERGE_DOMAIN_CONFIG),
	// naming both files.
	want := fmt.Sprintf(`rls config %s: domain "a": duplicate: already loaded from %s`, filepath.Join(dir, "c.yaml"), filepath.Join(dir, "a.yaml"))
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("duplicate domain across files: %v; want %q", err, want)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing path loaded")
	}
}

func TestWildcardMatch(t *testing.T) {
	cases := []struct {
		pattern, value string
		want           bool
	}{
		{"a*", "a", true}, {"a*", "abc", true}, {"a*", "ba", false},
		{"a*c", "abc", true}, {"a*c", "ac", true}, {"a*c", "a", false}, {"a*c", "abd", false},
		{"a*b*c", "aXbYc", true}, {"a*b*c", "abc", true}, {"a*b*c", "acb", false},
		{"*", "", true}, {"ab*ba", "aba", false},
	}
	for _, tc := range cases {
		if got := match(strings.Split(tc.pattern, "*"), tc.value); got != tc.want {
			t.Errorf("match(%q, %q) = %v", tc.pattern, tc.value, got)
		}
	}
}

// FuzzParse: any document is loaded or refused with an error, never a
// panic; a loaded one answers lookups.
func FuzzParse(f *testing.F) {
	for _, doc := range readmeExamples {
		f.Add([]byte(doc), "key1", "value1")
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    value: 'x*y*'\n    share_threshold: true\n    rate_limit: {unit: 30s, requests_per_unit: 3}"), "a", "xqyq")
	f.Fuzz(func(t *testing.T, doc []byte, k, v string) {
		c, err := Parse(doc)
		if err != nil {
			if c != nil {
				t.Fatal("a config with an error")
			}
			return
		}
		for domain, top := range c.domains {
			desc := d(k, v)
			var fd found
			if l := top.lookup(desc.Entries, &fd); l != nil {
				if !l.Unlimited && (l.Requests < 0 || l.Requests > MaxLimit || l.Length < time.Millisecond || l.Length > MaxWindow) {
					t.Fatalf("limit out of range: %+v", l)
				}
				_ = label(domain, desc.Entries, &fd)
				key := appendKey(nil, "p:", domain, desc.Entries, &fd)
				if bytes.Count(key, []byte("{")) != 1 || bytes.Count(key, []byte("}")) != 1 {
					t.Fatalf("key %q: not one hash tag", key)
				}
			}
		}
	})
}

// FuzzDescriptorKey: the mapping from descriptor to key is a function of
// the entries alone (no two entry lists share a window, unless a shared
// wildcard says so), keeps its layout whatever the bytes, and never
// carries a value's braces into the hash tag.
func FuzzDescriptorKey(f *testing.F) {
	f.Add("k", "v", "k2", "v2")
	f.Add("a", "b_c", "a_b", "c")
	f.Add("{", "}", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		one := []*rlc.RateLimitDescriptor_Entry{{Key: k1, Value: v1}}
		two := []*rlc.RateLimitDescriptor_Entry{{Key: k1, Value: v1}, {Key: k2, Value: v2}}
		other := []*rlc.RateLimitDescriptor_Entry{{Key: k2, Value: v2}}
		a, b := appendKey(nil, "pre:", "dom", one, nil), appendKey(nil, "pre:", "dom", two, nil)
		if bytes.Equal(a, b) {
			t.Fatalf("one and two entries share %q", a)
		}
		if (k1 != k2 || v1 != v2) && bytes.Equal(a, appendKey(nil, "pre:", "dom", other, nil)) {
			t.Fatalf("(%q,%q) and (%q,%q) share %q", k1, v1, k2, v2, a)
		}
		if !bytes.Equal(a, appendKey(nil, "pre:", "dom", one, nil)) {
			t.Fatal("not deterministic")
		}
		if bytes.Equal(a, appendKey(nil, "pre:", "dom2", one, nil)) {
			t.Fatal("two domains share a key")
		}
		for _, k := range [][]byte{a, b} {
			if len(k) != len("pre:{rls:dom:}")+32 || !bytes.HasPrefix(k, []byte("pre:{rls:dom:")) || k[len(k)-1] != '}' {
				t.Fatalf("key layout %q", k)
			}
		}
	})
}
