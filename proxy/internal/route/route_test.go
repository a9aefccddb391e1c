package route

import "testing"

func TestApplies(t *testing.T) {
	cases := []struct {
		methods      []string
		prefix       string
		method, path string
		want         bool
	}{
		{nil, "/api/", "GET", "/api/v1", true},
		{nil, "/api/", "POST", "/api/", true},
		{nil, "/api/", "GET", "/api", false},    // shorter than the prefix
		{nil, "/api/", "GET", "/API/v1", false}, // case-sensitive
		{nil, "", "DELETE", "/anything", true},
		{[]string{"POST"}, "/api/", "POST", "/api/v1/activities/1/purchase", true},
		{[]string{"POST"}, "/api/", "GET", "/api/v1/activities/1", false},
		{[]string{"POST"}, "/api/", "post", "/api/v1", false}, // methods are exact
		{[]string{"GET", "HEAD"}, "/", "HEAD", "/x", true},
		{[]string{"GET", "HEAD"}, "/", "PUT", "/x", false},
		{[]string{"POST"}, "/api/", "POST", "/other", false},
	}
	for _, c := range cases {
		m := New(c.methods, c.prefix)
		if got := m.Applies([]byte(c.method), []byte(c.path)); got != c.want {
			t.Errorf("%v %q: %s %s = %v, want %v", c.methods, c.prefix, c.method, c.path, got, c.want)
		}
	}
}
