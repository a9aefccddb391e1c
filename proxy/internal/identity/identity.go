// Package identity derives the client key a request is limited by.
//
// The key is the peer's address, unless the peer is a trusted proxy: then the
// forwarding headers are walked from the right (the hop nearest to us first)
// and the first address that is not itself trusted is the client. A header sent
// by an untrusted peer is never read, so it cannot be spoofed. IPv6 clients
// are keyed by their prefix (default /64), since one host usually owns a /64.
package identity

import (
	"bytes"
	"fmt"
	"net/netip"
)

// Resolver turns a peer address and its forwarding headers into a client key.
// It is safe for concurrent use and never changes after New.
type Resolver struct {
	trusted []netip.Prefix
	v6Bits  int
}

// New builds a Resolver trusting the given CIDRs and keying IPv6 clients by
// their first v6Bits bits.
func New(trustedCIDRs []string, v6Bits int) (*Resolver, error) {
	if v6Bits < 1 || v6Bits > 128 {
		return nil, fmt.Errorf("ipv6 prefix %d: must be 1..128", v6Bits)
	}
	r := &Resolver{v6Bits: v6Bits}
	for _, c := range trustedCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: %w", c, err)
		}
		r.trusted = append(r.trusted, p.Masked())
	}
	return r, nil
}

// Trusted reports whether a is inside one of the trusted CIDRs.
func (r *Resolver) Trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Headers are the forwarding headers of a request, every line of each.
type Headers struct {
	XForwardedFor [][]byte
	Forwarded     [][]byte
}

// Client returns the client address: the peer unless it is trusted, else the
// rightmost untrusted address of X-Forwarded-For (or, when that header is
// absent, of Forwarded). An unparsable hop stops the walk at the last trusted
// hop seen; a chain of trusted hops only yields its leftmost address.
func (r *Resolver) Client(peer netip.Addr, h Headers) netip.Addr {
	peer = peer.Unmap().WithZone("")
	if len(r.trusted) == 0 || !r.Trusted(peer) {
		return peer
	}
	lines, parse := h.XForwardedFor, parseXFF
	if len(lines) == 0 {
		lines, parse = h.Forwarded, parseForwarded
	}
	client := peer
	for li := len(lines) - 1; li >= 0; li-- {
		line := lines[li]
		for len(line) > 0 {
			var elem []byte
			if i := bytes.LastIndexByte(line, ','); i >= 0 {
				elem, line = line[i+1:], line[:i]
			} else {
				elem, line = line, nil
			}
			if len(bytes.TrimSpace(elem)) == 0 {
				continue
			}
			a, ok := parse(elem)
			if !ok {
				return client
			}
			client = a
			if !r.Trusted(a) {
				return a
			}
		}
	}
	return client
}

// AppendKey appends the limiter key of a client address: the IPv4 address, or
// the IPv6 prefix in CIDR form.
func (r *Resolver) AppendKey(dst []byte, a netip.Addr) []byte {
	a = a.Unmap().WithZone("")
	if a.Is4() || !a.IsValid() {
		return a.AppendTo(dst)
	}
	p, err := a.Prefix(r.v6Bits)
	if err != nil {
		return a.AppendTo(dst)
	}
	dst = p.Addr().AppendTo(dst)
	dst = append(dst, '/')
	return appendInt(dst, r.v6Bits)
}

func appendInt(dst []byte, v int) []byte {
	if v >= 100 {
		dst = append(dst, byte('0'+v/100))
		v %= 100
		return append(dst, byte('0'+v/10), byte('0'+v%10))
	}
	if v >= 10 {
		dst = append(dst, byte('0'+v/10))
	}
	return append(dst, byte('0'+v%10))
}

// parseXFF parses one X-Forwarded-For element: an address, optionally with a
// port ("1.2.3.4:80", "[2001:db8::1]:80").
func parseXFF(b []byte) (netip.Addr, bool) {
	return parseNode(bytes.TrimSpace(b))
}

// parseForwarded parses one Forwarded element (RFC 7239) and returns its for=.
func parseForwarded(b []byte) (netip.Addr, bool) {
	for len(b) > 0 {
		var pair []byte
		if i := bytes.IndexByte(b, ';'); i >= 0 {
			pair, b = b[:i], b[i+1:]
		} else {
			pair, b = b, nil
		}
		pair = bytes.TrimSpace(pair)
		eq := bytes.IndexByte(pair, '=')
		if eq < 0 || !bytes.EqualFold(bytes.TrimSpace(pair[:eq]), []byte("for")) {
			continue
		}
		v := bytes.TrimSpace(pair[eq+1:])
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return parseNode(v)
	}
	return netip.Addr{}, false
}

// parseNode parses "addr", "addr:port", "[v6]" or "[v6]:port". Obfuscated
// identifiers ("_hidden", "unknown") are not addresses.
func parseNode(b []byte) (netip.Addr, bool) {
	if len(b) == 0 || len(b) > 64 {
		return netip.Addr{}, false
	}
	if b[0] == '[' {
		end := bytes.IndexByte(b, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		rest := b[end+1:]
		if len(rest) > 0 && (rest[0] != ':' || !digits(rest[1:])) {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(string(b[1:end]))
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return a.Unmap().WithZone(""), true
	}
	if c := bytes.Count(b, []byte{':'}); c == 1 {
		i := bytes.IndexByte(b, ':')
		if !digits(b[i+1:]) {
			return netip.Addr{}, false
		}
		b = b[:i]
	}
	a, err := netip.ParseAddr(string(b))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

func digits(b []byte) bool {
	if len(b) == 0 || len(b) > 5 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
