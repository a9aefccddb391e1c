package identity

import (
	"net/netip"
	"strings"
	"testing"
)

func lines(s ...string) [][]byte {
	var out [][]byte
	for _, l := range s {
		out = append(out, []byte(l))
	}
	return out
}

func TestClient(t *testing.T) {
	r, err := New([]string{"10.0.0.0/8", "2001:db8:ffff::/48"}, 64)
	if err != nil {
		t.Fatal(err)
	}
	none, _ := New(nil, 64)
	tests := []struct {
		name string
		r    *Resolver
		peer string
		h    Headers
		want string
	}{
		{"no header", r, "203.0.113.9", Headers{}, "203.0.113.9"},
		{"untrusted peer spoofs XFF", r, "203.0.113.9", Headers{XForwardedFor: lines("1.2.3.4")}, "203.0.113.9"},
		{"untrusted peer spoofs Forwarded", r, "203.0.113.9", Headers{Forwarded: lines("for=1.2.3.4")}, "203.0.113.9"},
		{"default trusts nobody", none, "10.0.0.1", Headers{XForwardedFor: lines("1.2.3.4")}, "10.0.0.1"},
		{"trusted peer, one hop", r, "10.0.0.1", Headers{XForwardedFor: lines("198.51.100.7")}, "198.51.100.7"},
		{"walk from the right", r, "10.0.0.1", Headers{XForwardedFor: lines("1.1.1.1, 198.51.100.7, 10.9.9.9")}, "198.51.100.7"},
		{"client-forged left part ignored", r, "10.0.0.1", Headers{XForwardedFor: lines("6.6.6.6", "198.51.100.7, 10.2.2.2")}, "198.51.100.7"},
		{"all trusted: leftmost", r, "10.0.0.1", Headers{XForwardedFor: lines("10.3.3.3, 10.2.2.2")}, "10.3.3.3"},
		{"garbage stops at last trusted", r, "10.0.0.1", Headers{XForwardedFor: lines("1.1.1.1, garbage, 10.2.2.2")}, "10.2.2.2"},
		{"ports", r, "10.0.0.1", Headers{XForwardedFor: lines("198.51.100.7:5555")}, "198.51.100.7"},
		{"v6 with port", r, "10.0.0.1", Headers{XForwardedFor: lines("[2001:db8::1]:443")}, "2001:db8::1"},
		{"mapped v4", r, "::ffff:10.0.0.1", Headers{XForwardedFor: lines("::ffff:198.51.100.7")}, "198.51.100.7"},
		{"forwarded", r, "10.0.0.1", Headers{Forwarded: lines(`for=1.1.1.1, for="[2001:db8::17]:4711";proto=https, for=10.1.1.1;by=10.0.0.1`)}, "2001:db8::17"},
		{"forwarded obfuscated", r, "10.0.0.1", Headers{Forwarded: lines("for=_hidden, for=10.1.1.1")}, "10.1.1.1"},
		{"XFF wins over Forwarded", r, "10.0.0.1", Headers{XForwardedFor: lines("198.51.100.7"), Forwarded: lines("for=1.1.1.1")}, "198.51.100.7"},
		{"empty elements skipped", r, "10.0.0.1", Headers{XForwardedFor: lines(" , 198.51.100.7 ,, ")}, "198.51.100.7"},
		{"trusted v6 peer", r, "2001:db8:ffff::1", Headers{XForwardedFor: lines("2001:db8:1::5")}, "2001:db8:1::5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.r.Client(netip.MustParseAddr(tc.peer), tc.h)
			if got.String() != tc.want {
				t.Fatalf("Client = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestAppendKey(t *testing.T) {
	r64, _ := New(nil, 64)
	r56, _ := New(nil, 56)
	tests := []struct {
		r    *Resolver
		in   string
		want string
	}{
		{r64, "198.51.100.7", "198.51.100.7"},
		{r64, "::ffff:198.51.100.7", "198.51.100.7"},
		{r64, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{r64, "2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"},
		{r56, "2001:db8:1:2ff:3:4:5:6", "2001:db8:1:200::/56"},
		{r64, "fe80::1%eth0", "fe80::/64"},
	}
	for _, tc := range tests {
		if got := string(tc.r.AppendKey(nil, netip.MustParseAddr(tc.in))); got != tc.want {
			t.Errorf("AppendKey(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New([]string{"10.0.0.0/33"}, 64); err == nil {
		t.Error("bad CIDR accepted")
	}
	if _, err := New(nil, 0); err == nil {
		t.Error("prefix 0 accepted")
	}
}

// FuzzClient: whatever the headers hold, the parser never panics, an untrusted
// peer is always its own client, and the answer is the peer, or an address
// written in the headers.
func FuzzClient(f *testing.F) {
	seeds := []struct{ peer, xff, fwd string }{
		{"10.0.0.1", "1.2.3.4, 10.0.0.2", ""},
		{"10.0.0.1", "", `for="[2001:db8::1]:80";proto=http, for=10.1.1.1`},
		{"203.0.113.1", "1.2.3.4", "for=5.6.7.8"},
		{"10.0.0.1", "[::1", "for=\""},
		{"10.0.0.1", ",,,", "for=;for=_x"},
		{"::ffff:10.0.0.1", "::ffff:1.2.3.4:80", ""},
		{"10.0.0.1", "fe80::1%25eth0", "FOR=1.1.1.1"},
	}
	for _, s := range seeds {
		f.Add(s.peer, s.xff, s.fwd)
	}
	r, err := New([]string{"10.0.0.0/8", "::1/128"}, 64)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, peerS, xff, fwd string) {
		peer, err := netip.ParseAddr(peerS)
		if err != nil {
			return
		}
		h := Headers{}
		if xff != "" {
			h.XForwardedFor = [][]byte{[]byte(xff)}
		}
		if fwd != "" {
			h.Forwarded = [][]byte{[]byte(fwd)}
		}
		got := r.Client(peer, h)
		if !got.IsValid() {
			t.Fatalf("invalid client for peer %s", peer)
		}
		norm := peer.Unmap().WithZone("")
		if !r.Trusted(peer) && got != norm {
			t.Fatalf("untrusted peer %s: client %s from headers", peer, got)
		}
		if got != norm {
			both := strings.ToLower(xff + " " + fwd)
			s := got.String()
			if got.Is4() {
				if !strings.Contains(both, s) {
					t.Fatalf("client %s not in headers %q", s, both)
				}
			} else if !got.Is6() {
				t.Fatalf("client %s neither v4 nor v6", s)
			}
		}
		key := r.AppendKey(nil, got)
		if _, err := netip.ParseAddr(string(key)); err != nil {
			if _, err := netip.ParsePrefix(string(key)); err != nil {
				t.Fatalf("key %q is neither address nor prefix", key)
			}
		}
	})
}
