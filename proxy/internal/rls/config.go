// Package rls offers the proxy's limiter as Envoy's external rate-limit
// service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit),
// configured in envoyproxy/ratelimit's YAML format. Each descriptor a
// configured limit matches is one exact sliding window in the limiter's
// store, in a key namespace of its own. docs/envoy.md says how every option
// of the reference server maps.
package rls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"sigs.k8s.io/yaml"
)

// Bounds of a configuration and of a request.
const (
	// MaxLimit is the largest requests_per_unit: a sliding log keeps one
	// store entry per admitted hit, so a window holds at most this many (the
	// HTTP rules' bound too). The reference server's uint32 goes further.
	MaxLimit = 10_000_000
	// MaxWindow bounds a window: the reference server's longest unit.
	MaxWindow = 365 * 24 * time.Hour
	// maxDepth bounds descriptor nesting in a file and entries in a
	// request's descriptor.
	maxDepth = 32
	// maxDomain bounds a domain's length (it is part of every key).
	maxDomain = 128
	// maxFileBytes bounds one configuration file.
	maxFileBytes = 4 << 20
)

// units are the reference server's named units (utils.UnitToDivider):
// a month is 30 days, a year 365.
var units = map[string]struct {
	d    time.Duration
	unit pb.RateLimitResponse_RateLimit_Unit
}{
	"second": {time.Second, pb.RateLimitResponse_RateLimit_SECOND},
	"minute": {time.Minute, pb.RateLimitResponse_RateLimit_MINUTE},
	"hour":   {time.Hour, pb.RateLimitResponse_RateLimit_HOUR},
	"day":    {24 * time.Hour, pb.RateLimitResponse_RateLimit_DAY},
	"week":   {7 * 24 * time.Hour, pb.RateLimitResponse_RateLimit_WEEK},
	"month":  {30 * 24 * time.Hour, pb.RateLimitResponse_RateLimit_MONTH},
	"year":   {365 * 24 * time.Hour, pb.RateLimitResponse_RateLimit_YEAR},
}

// The YAML schema: envoyproxy/ratelimit's (src/config/config_impl.go).
// Unknown keys are refused, as there.
type yamlRoot struct {
	Domain      string           `json:"domain"`
	Descriptors []yamlDescriptor `json:"descriptors"`
}

type yamlDescriptor struct {
	Key            string           `json:"key"`
	Value          string           `json:"value"`
	RateLimit      *yamlRateLimit   `json:"rate_limit"`
	Descriptors    []yamlDescriptor `json:"descriptors"`
	ShadowMode     bool             `json:"shadow_mode"`
	QuotaMode      bool             `json:"quota_mode"`
	DetailedMetric bool             `json:"detailed_metric"`
	ValueToMetric  bool             `json:"value_to_metric"`
	ShareThreshold bool             `json:"share_threshold"`
	// Metadata is accepted and not used (docs/envoy.md).
	Metadata map[string]any `json:"metadata"`
}

type yamlRateLimit struct {
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	Unlimited       bool   `json:"unlimited"`
	Name            string `json:"name"`
	Replaces        []struct {
		Name string `json:"name"`
	} `json:"replaces"`
}

// Config is a compiled, immutable set of domains; a reload builds another.
type Config struct {
	domains map[string]*node
	files   []string
	// origin is the file each domain came from (a duplicate's error names
	// both); "" for Parse.
	origin map[string]string
}

// Domains is the number of domains loaded.
func (c *Config) Domains() int { return len(c.domains) }

// node is one level of a domain's descriptor tree.
type node struct {
	children map[string]*node // by "key_value", or "key" (any value)
	wild     []wildcard       // children whose "key_value" holds a '*'
	limit    *Limit
	// share: matched through a wildcard, the window is the pattern's, not
	// the value's (share_threshold).
	share bool
	// valueToMetric: the metric label names the request's value here.
	valueToMetric bool
	// name is this level's part of a metric label ("key_value" or "key").
	name string
}

type wildcard struct {
	key   string   // the child's "key_value" pattern
	parts []string // split on '*'
}

// Limit is a compiled rate_limit.
type Limit struct {
	Name     string // rate_limit.name ("" if none)
	Requests int    // requests_per_unit; 0: always over the limit
	Length   time.Duration
	// Unit is what Envoy is told in current_limit: the named unit, or
	// UNKNOWN for a window in the project's own durations ("30s").
	Unit      pb.RateLimitResponse_RateLimit_Unit
	Unlimited bool
	Shadow    bool
	Detailed  bool
	Replaces  []string
	// path is the descriptor path in the file, "domain.key_value.key": the
	// metric label, and the policy name when the limit has no name.
	path string
	// current is the current_limit sent back (shared, read-only).
	current *pb.RateLimitResponse_RateLimit
}

// Load reads a YAML file, or every *.yaml and *.yml file of a directory
// (not its subdirectories, nor names starting with '.', such as a
// Kubernetes ConfigMap's ..data), one domain per file.
func Load(path string) (*Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("rls config: %w", err)
	}
	files := []string{path}
	if st.IsDir() {
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("rls config: %w", err)
		}
		files = files[:0]
		for _, e := range ents {
			n := e.Name()
			if strings.HasPrefix(n, ".") || (!strings.HasSuffix(n, ".yaml") && !strings.HasSuffix(n, ".yml")) {
				continue
			}
			if e.IsDir() {
				continue
			}
			files = append(files, filepath.Join(path, n))
		}
		sort.Strings(files)
	}
	c := &Config{domains: map[string]*node{}, files: files, origin: map[string]string{}}
	for _, f := range files {
		b, err := readFile(f)
		if err != nil {
			return nil, fmt.Errorf("rls config: %w", err)
		}
		if err := c.add(b, f); err != nil {
			return nil, fmt.Errorf("rls config %s: %w", f, err)
		}
	}
	return c, nil
}

func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxFileBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", name, st.Size(), maxFileBytes)
	}
	b := make([]byte, st.Size())
	_, err = f.ReadAt(b, 0)
	if err != nil && st.Size() > 0 {
		return nil, err
	}
	return b, nil
}

// Parse compiles one YAML document (one domain).
func Parse(doc []byte) (*Config, error) {
	c := &Config{domains: map[string]*node{}, origin: map[string]string{}}
	if err := c.add(doc, ""); err != nil {
		return nil, err
	}
	return c, nil
}

// add compiles one file's domain into c; file names it in errors.
func (c *Config) add(doc []byte, file string) error {
	var root yamlRoot
	if err := yaml.UnmarshalStrict(doc, &root); err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	d := root.Domain
	switch {
	case d == "":
		return errors.New("domain is empty")
	case len(d) > maxDomain:
		return fmt.Errorf("domain %.32q...: longer than %d bytes", d, maxDomain)
	case strings.ContainsAny(d, "{}") || strings.ContainsFunc(d, isControl):
		// The domain is part of the windows' Redis keys and their hash tag.
		return fmt.Errorf("domain %q: braces and control characters are not allowed", d)
	case c.domains[d] != nil:
		// As the reference server without MERGE_DOMAIN_CONFIG: a domain's
		// rules sit in one file, so no file's limits silently join or
		// shadow another's.
		return fmt.Errorf("domain %q: duplicate: already loaded from %s; a domain's descriptors must sit in one file", d, c.origin[d])
	}
	top := &node{children: map[string]*node{}}
	if err := top.load(d, d, root.Descriptors, 1); err != nil {
		return fmt.Errorf("domain %q: %w", d, err)
	}
	c.domains[d] = top
	c.origin[d] = file
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// load compiles the descriptors under n; path names n ("domain.k_v...").
func (n *node) load(domain, path string, ds []yamlDescriptor, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("descriptor %s: nested deeper than %d", path, maxDepth)
	}
	for i, yd := range ds {
		if yd.Key == "" {
			return fmt.Errorf("descriptor %s.descriptors[%d]: empty key", path, i)
		}
		name := yd.Key
		if yd.Value != "" {
			name += "_" + yd.Value
		}
		at := path + "." + name
		if n.children[name] != nil {
			return fmt.Errorf("descriptor %s: duplicate descriptor composite key", at)
		}
		child := &node{children: map[string]*node{}, name: name, valueToMetric: yd.ValueToMetric}
		if yd.QuotaMode {
			return fmt.Errorf("descriptor %s: quota_mode is not supported (docs/envoy.md)", at)
		}
		wild := strings.Contains(name, "*")
		if yd.ShareThreshold {
			if !wild {
				return fmt.Errorf("descriptor %s: share_threshold needs a wildcard value (containing '*')", at)
			}
			child.share = true
		}
		if wild {
			n.wild = append(n.wild, wildcard{key: name, parts: strings.Split(name, "*")})
		}
		if yd.RateLimit != nil {
			l, err := compileLimit(yd.RateLimit, at)
			if err != nil {
				return fmt.Errorf("descriptor %s: %w", at, err)
			}
			l.Shadow, l.Detailed = yd.ShadowMode, yd.DetailedMetric
			child.limit = l
		}
		if err := child.load(domain, at, yd.Descriptors, depth+1); err != nil {
			return err
		}
		n.children[name] = child
	}
	return nil
}

// compileLimit maps a rate_limit: requests_per_unit 0..MaxLimit as is (0:
// always over the limit), a named unit to its length, or a Go duration
// between 1ms and MaxWindow (the project's extension).
func compileLimit(y *yamlRateLimit, path string) (*Limit, error) {
	l := &Limit{Name: y.Name, Requests: int(y.RequestsPerUnit), Unlimited: y.Unlimited, path: path}
	for _, r := range y.Replaces {
		if r.Name == "" {
			return nil, errors.New("replaces: an entry has an empty name")
		}
		if r.Name == y.Name {
			return nil, fmt.Errorf("replaces: names its own limit %q", r.Name)
		}
		l.Replaces = append(l.Replaces, r.Name)
	}
	if y.Unlimited {
		if y.Unit != "" {
			return nil, errors.New("rate_limit: unlimited takes no unit")
		}
		return l, nil
	}
	length, unit, err := parseUnit(y.Unit)
	if err != nil {
		return nil, err
	}
	if y.RequestsPerUnit > MaxLimit {
		return nil, fmt.Errorf("requests_per_unit %d: more than %d, the most one sliding window holds (use unlimited: true, or a shorter unit)",
			y.RequestsPerUnit, MaxLimit)
	}
	l.Length, l.Unit = length, unit
	l.current = &pb.RateLimitResponse_RateLimit{Name: y.Name, RequestsPerUnit: y.RequestsPerUnit, Unit: unit}
	return l, nil
}

// parseUnit reads a unit: second ... year (any case, as the reference
// server), or a Go duration such as "30s" (then Envoy is told UNKNOWN,
// unless the duration is exactly a named unit).
func parseUnit(s string) (time.Duration, pb.RateLimitResponse_RateLimit_Unit, error) {
	if u, ok := units[strings.ToLower(s)]; ok {
		return u.d, u.unit, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Millisecond || d > MaxWindow {
		return 0, 0, fmt.Errorf("rate_limit: invalid unit %q: want second, minute, hour, day, week, month, year, or a duration from 1ms to %s such as \"30s\"",
			s, MaxWindow)
	}
	for _, u := range units {
		if u.d == d {
			return d, u.unit, nil
		}
	}
	return d, pb.RateLimitResponse_RateLimit_UNKNOWN, nil
}

// match reports whether value ("key_value") fits a wildcard pattern split
// on '*': each '*' stands for any run of bytes, as in the reference server.
func match(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
