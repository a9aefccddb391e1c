// Package access decides, before anything else the proxy does, whether a
// request may pass at all: paths under [proxy] deny_prefixes are answered
// 404 and never forwarded, unless a rule matching the request allows its
// client address; and which requests must carry a verified JWT.
package access

import (
	"bytes"
	"fmt"
	"net/netip"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/proxy/internal/route"
)

// Policy is an immutable compiled access configuration; a reload builds a
// new one.
type Policy struct {
	deny  [][]byte
	rules []rule // only rules with allow_from or require_jwt
}

type rule struct {
	match      route.Match
	allow      []netip.Prefix
	requireJWT bool
}

// Compile builds a Policy from deny prefixes and the rules' access keys.
func Compile(denyPrefixes []string, rules []conf.Rule) (*Policy, error) {
	p := &Policy{}
	for _, d := range denyPrefixes {
		if len(d) == 0 || d[0] != '/' {
			return nil, fmt.Errorf("deny prefix %q: must start with /", d)
		}
		p.deny = append(p.deny, []byte(d))
	}
	for _, cr := range rules {
		if len(cr.AllowFrom) == 0 && !cr.RequireJWT {
			continue
		}
		r := rule{match: route.New(cr.Methods, cr.PathPrefix), requireJWT: cr.RequireJWT}
		for _, c := range cr.AllowFrom {
			pf, err := netip.ParsePrefix(c)
			if err != nil {
				return nil, fmt.Errorf("rule %s: allow_from %q: %w", cr.Name, c, err)
			}
			r.allow = append(r.allow, pf.Masked())
		}
		p.rules = append(p.rules, r)
	}
	return p, nil
}

// Denied reports whether path falls under a deny prefix. Matching ignores
// ASCII case (an upstream may route case-insensitively), and a prefix
// ending in '/' also covers the path without that slash ("/admin"). A path
// with ';' or '\\' is also matched as servers that take those for path
// parameters (Tomcat: "/admin;x/", "/..;/") or separators (IIS) read it.
func (p *Policy) Denied(path []byte) bool {
	if p.denied(path) {
		return true
	}
	if len(p.deny) > 0 && bytes.ContainsAny(path, ";\\") {
		return p.denied(lenient(path))
	}
	return false
}

// lenient rewrites path the way a lenient server routes it: '\\' as '/',
// each segment's ";parameters" dropped, then empty, "." and ".." segments
// resolved.
func lenient(path []byte) []byte {
	var segs [][]byte
	for _, seg := range bytes.Split(bytes.ReplaceAll(path, []byte{'\\'}, []byte{'/'}), []byte{'/'}) {
		if i := bytes.IndexByte(seg, ';'); i >= 0 {
			seg = seg[:i]
		}
		switch string(seg) {
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			segs = append(segs, seg)
		}
	}
	out := []byte{'/'}
	out = append(out, bytes.Join(segs, []byte{'/'})...)
	if len(segs) > 0 && len(path) > 0 && (path[len(path)-1] == '/' || path[len(path)-1] == '\\') {
		out = append(out, '/')
	}
	return out
}

func (p *Policy) denied(path []byte) bool {
	for _, d := range p.deny {
		if len(path) >= len(d) && bytes.EqualFold(path[:len(d)], d) {
			return true
		}
		if n := len(d) - 1; d[n] == '/' && len(path) == n && bytes.EqualFold(path, d[:n]) {
			return true
		}
	}
	return false
}

// Allowed reports whether a rule matching method and path lets client
// through to a denied path.
func (p *Policy) Allowed(method, path []byte, client netip.Addr) bool {
	client = client.Unmap()
	for i := range p.rules {
		r := &p.rules[i]
		if len(r.allow) == 0 || !r.match.Applies(method, path) {
			continue
		}
		for _, a := range r.allow {
			if a.Contains(client) {
				return true
			}
		}
	}
	return false
}

// RequireJWT reports whether a rule matching method and path requires a
// verified token.
func (p *Policy) RequireJWT(method, path []byte) bool {
	for i := range p.rules {
		if r := &p.rules[i]; r.requireJWT && r.match.Applies(method, path) {
			return true
		}
	}
	return false
}
