package edge

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// normalPath is what ctx.Path() returns for a request URI.
func normalPath(uri []byte) []byte {
	var req fasthttp.Request
	req.Header.SetRequestURIBytes(uri)
	req.Header.SetHost("h")
	return req.URI().Path()
}

// plainPath may only short-cut URIs whose path needs no normalization: what
// it returns must be exactly ctx.Path(), or rules could be bypassed.
func TestPlainPath(t *testing.T) {
	for _, tc := range []struct {
		uri  string
		ok   bool
		path string
	}{
		{"/", true, "/"},
		{"/api/v1/activities/42/purchase", true, "/api/v1/activities/42/purchase"},
		{"/a/b.c/d-e_f~g?x=1&y=/../z", true, "/a/b.c/d-e_f~g"},
		{"/?", true, "/"},
		{"//api/v1/activities/1/purchase", false, ""},
		{"/api//v1", false, ""},
		{"/api/./v1", false, ""},
		{"/api/../admin", false, ""},
		{"/x/.", false, ""},
		{"/%61pi/v1", false, ""},
		{"/a+b", false, ""},
		{"/a#frag", false, ""},
		{"http://h/api", false, ""},
		{"*", false, ""},
		{"", false, ""},
	} {
		p, ok := plainPath([]byte(tc.uri))
		if ok != tc.ok || string(p) != tc.path {
			t.Errorf("plainPath(%q) = %q, %v; want %q, %v", tc.uri, p, ok, tc.path, tc.ok)
		}
		if ok && !bytes.Equal(p, normalPath([]byte(tc.uri))) {
			t.Errorf("plainPath(%q) = %q, ctx.Path() = %q", tc.uri, p, normalPath([]byte(tc.uri)))
		}
	}
}

func FuzzPlainPath(f *testing.F) {
	for _, s := range []string{"/", "/a/b?c", "//a", "/a/../b", "/%2e%2e/x", "/a.b/.c", "/x?/.."} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, uri []byte) {
		p, ok := plainPath(uri)
		if !ok {
			return
		}
		if want := normalPath(uri); !bytes.Equal(p, want) {
			t.Fatalf("plainPath(%q) = %q, ctx.Path() = %q", uri, p, want)
		}
	})
}
