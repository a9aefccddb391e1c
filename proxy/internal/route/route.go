// Package route holds which requests a [[proxy.rules]] entry applies to: a
// path prefix and, when the rule names any, its methods. The limiter and the
// access policy both select rules with it, so one rule means the same
// requests to both.
package route

import "bytes"

// Match is a compiled rule's method and path-prefix match.
type Match struct {
	methods [][]byte // empty: any
	prefix  []byte
}

// New compiles a rule's methods and path_prefix.
func New(methods []string, pathPrefix string) Match {
	m := Match{prefix: []byte(pathPrefix)}
	for _, meth := range methods {
		m.methods = append(m.methods, []byte(meth))
	}
	return m
}

// Applies reports whether the rule applies to method and path: the path
// starts with the prefix (case-sensitive, as the upstream routes), and the
// method is one of the rule's when it names any (exact, as HTTP methods are).
func (m *Match) Applies(method, path []byte) bool {
	if !bytes.HasPrefix(path, m.prefix) {
		return false
	}
	if len(m.methods) == 0 {
		return true
	}
	for _, meth := range m.methods {
		if bytes.Equal(meth, method) {
			return true
		}
	}
	return false
}
