package limiter

import (
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

func TestMatch(t *testing.T) {
	rs, err := Compile([]conf.Rule{
		{Name: "buy", Methods: []string{"POST"}, PathPrefix: "/api/v1/activities/", PerIP: &conf.Window{Limit: 1, Window: conf.D(time.Second)}},
		{Name: "api", PathPrefix: "/api/", Global: &conf.Window{Limit: 1, Window: conf.D(time.Second)}},
	}, "p:", nil)
	servicetest.Must(t, err, "compile")
	for _, tc := range []struct {
		method, path string
		want         int
	}{{"POST", "/api/v1/activities/1/purchase", 2}, {"GET", "/api/v1/activities/1", 1}, {"GET", "/other", 0}} {
		if got := len(rs.Match(nil, []byte(tc.method), []byte(tc.path))); got != tc.want {
			t.Errorf("%s %s: %d rules, want %d", tc.method, tc.path, got, tc.want)
		}
	}
	if _, err := Compile([]conf.Rule{{Name: "x", PathPrefix: "/"}}, "", nil); err == nil {
		t.Error("rule without windows compiled")
	}
}

// fakeHeader serves one header and one cookie.
type fakeHeader struct{ name, value, cookie, cvalue []byte }

func (h *fakeHeader) PeekBytes(n []byte) []byte {
	if string(n) == string(h.name) {
		return h.value
	}
	return nil
}

func (h *fakeHeader) CookieBytes(n []byte) []byte {
	if string(n) == string(h.cookie) {
		return h.cvalue
	}
	return nil
}

// FuzzClientKey: any header or cookie value yields a bounded key of the
// expected form, a missing or empty one falls back to the address, and so
// does one nobody vouches for; two different values never share a key.
func FuzzClientKey(f *testing.F) {
	f.Add([]byte("u1"), []byte("u2"), false)
	f.Add([]byte("1.2.3.4"), []byte(""), true)
	f.Add([]byte("{rl:a:1.2.3.4}"), []byte("a:1.2.3.4"), false)
	f.Add(make([]byte, 5000), []byte("\x00"), true)
	w := &Window{Kind: PerIP, Source: FromHeader, Name: []byte("X-User-ID")}
	wc := &Window{Kind: PerIP, Source: FromCookie, Name: []byte("session")}
	f.Fuzz(func(t *testing.T, v1, v2 []byte, cookie bool) {
		win := w
		if cookie {
			win = wc
		}
		key := func(v []byte) string {
			h := &fakeHeader{name: w.Name, value: v, cookie: wc.Name, cvalue: v}
			return string(appendClientKey(nil, win, Request{Addr: []byte("203.0.113.9"), Header: h, Trusted: true}))
		}
		k1, k2 := key(v1), key(v2)
		h := &fakeHeader{name: w.Name, value: v1, cookie: wc.Name, cvalue: v1}
		if k := string(appendClientKey(nil, win, Request{Addr: []byte("203.0.113.9"), Header: h})); k != "a:203.0.113.9" {
			t.Fatalf("value %q from an untrusted peer, nothing verified: key %q, want the address", v1, k)
		}
		for _, tc := range []struct {
			v []byte
			k string
		}{{v1, k1}, {v2, k2}} {
			if len(tc.v) == 0 {
				if tc.k != "a:203.0.113.9" {
					t.Fatalf("empty value: key %q, want the address", tc.k)
				}
				continue
			}
			if len(tc.k) != 34 || (tc.k[:2] != "h:" && tc.k[:2] != "c:") || strings.ContainsAny(tc.k, "{} ") {
				t.Fatalf("value %q: key %q", tc.v, tc.k)
			}
		}
		same := string(v1) == string(v2) || (len(v1) > maxKeyInput && len(v2) > maxKeyInput && string(v1[:maxKeyInput]) == string(v2[:maxKeyInput]))
		if !same && k1 == k2 {
			t.Fatalf("values %q and %q share key %q", v1, v2, k1)
		}
	})
}

// A keyed window counts by its header or cookie only when a trusted peer
// sent the request or the proxy verified that very header or cookie (the
// X-User-ID it set from a JWT, or the token's own header or cookie);
// otherwise by the address.
func TestKeyNeedsVouching(t *testing.T) {
	hdr := &Window{Kind: PerIP, Source: FromHeader, Name: []byte("X-User-ID")}
	auth := &Window{Kind: PerIP, Source: FromHeader, Name: []byte("Authorization")}
	apiKey := &Window{Kind: PerIP, Source: FromHeader, Name: []byte("X-Api-Key")}
	sess := &Window{Kind: PerIP, Source: FromCookie, Name: []byte("session")}
	other := &Window{Kind: PerIP, Source: FromCookie, Name: []byte("Session")} // cookie names are case-sensitive
	viaHeader := &Verified{Headers: [][]byte{[]byte("X-User-Id"), []byte("authorization")}}
	viaCookie := &Verified{Headers: [][]byte{[]byte("X-User-Id")}, Cookies: [][]byte{[]byte("session")}}
	all := &multiHeader{values: map[string]string{"x-user-id": "v", "authorization": "v", "x-api-key": "v"}, cookies: map[string]string{"session": "v", "Session": "v"}}
	for _, tc := range []struct {
		name     string
		w        *Window
		trusted  bool
		verified *Verified
		keyed    bool
	}{
		{"untrusted, unverified header", hdr, false, nil, false},
		{"untrusted, unverified cookie", sess, false, nil, false},
		{"trusted peer: any header", apiKey, true, nil, true},
		{"trusted peer: any cookie", other, true, nil, true},
		{"verified X-User-ID", hdr, false, viaHeader, true},
		{"verified token header", auth, false, viaHeader, true},
		{"another header of a verified request", apiKey, false, viaHeader, false},
		{"a cookie of a header-verified request", sess, false, viaHeader, false},
		{"verified token cookie", sess, false, viaCookie, true},
		{"a cookie named in another case", other, false, viaCookie, false},
	} {
		k := string(appendClientKey(nil, tc.w, Request{Addr: []byte("198.51.100.7"), Header: all, Trusted: tc.trusted, Verified: tc.verified}))
		if keyed := k != "a:198.51.100.7"; keyed != tc.keyed {
			t.Errorf("%s: key %q, want keyed by the value %v", tc.name, k, tc.keyed)
		}
	}
}

// The header or cookie that carried the verified token counts by the token
// as verified, not by its raw value: spellings of one Authorization value,
// or another cookie line beside the verified one, share one window; without
// a token it counts by the address, even from a trusted peer.
func TestCarrierCountsVerifiedToken(t *testing.T) {
	auth := &Window{Kind: PerIP, Source: FromHeader, Name: []byte("Authorization")}
	sess := &Window{Kind: PerIP, Source: FromCookie, Name: []byte("session")}
	viaHeader := &Verified{Headers: [][]byte{[]byte("X-User-Id"), []byte("authorization")}, Carrier: FromHeader, CarrierName: []byte("authorization")}
	viaCookie := &Verified{Headers: [][]byte{[]byte("X-User-Id")}, Cookies: [][]byte{[]byte("session")}, Carrier: FromCookie, CarrierName: []byte("session")}
	key := func(w *Window, raw string, v *Verified, trusted bool, tok string) string {
		h := &multiHeader{values: map[string]string{"authorization": raw}, cookies: map[string]string{"session": raw}}
		return string(appendClientKey(nil, w, Request{Addr: []byte("198.51.100.7"), Header: h, Trusted: trusted, Verified: v, Token: []byte(tok)}))
	}
	for _, tc := range []struct {
		name string
		w    *Window
		v    *Verified
	}{{"header", auth, viaHeader}, {"cookie", sess, viaCookie}} {
		want := key(tc.w, "Bearer t", tc.v, false, "t")
		if want == "a:198.51.100.7" {
			t.Fatalf("%s: a verified token counts by the address", tc.name)
		}
		for _, raw := range []string{"bearer t", "BEARER  t", "junk!1", ""} {
			for _, trusted := range []bool{false, true} {
				if k := key(tc.w, raw, tc.v, trusted, "t"); k != want {
					t.Errorf("%s %q (trusted %v): key %q, want %q (the verified token's)", tc.name, raw, trusted, k, want)
				}
			}
		}
		if k := key(tc.w, "Bearer u", tc.v, false, "u"); k == want {
			t.Errorf("%s: another token shares the window", tc.name)
		}
		if k := key(tc.w, "Bearer t", tc.v, true, ""); k != "a:198.51.100.7" {
			t.Errorf("%s: no verified token: key %q, want the address", tc.name, k)
		}
	}
}

// multiHeader serves several headers (any case) and cookies.
type multiHeader struct{ values, cookies map[string]string }

func (h *multiHeader) PeekBytes(n []byte) []byte {
	if v, ok := h.values[strings.ToLower(string(n))]; ok {
		return []byte(v)
	}
	return nil
}

func (h *multiHeader) CookieBytes(n []byte) []byte {
	if v, ok := h.cookies[string(n)]; ok {
		return []byte(v)
	}
	return nil
}
