package api

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestParseQuantity(t *testing.T) {
	cases := []struct {
		body string
		want int64
		ok   bool
	}{
		{"", 1, true}, {"  \n", 1, true}, {"{}", 1, true}, {`{"quantity":3}`, 3, true},
		{` { "quantity" : 2 } `, 2, true}, {`{"quantity":1000000}`, 1000000, true},
		{`{"quantity":0}`, 0, false}, {`{"quantity":-1}`, 0, false}, {`{"quantity":1e12}`, 0, false},
		{`{"quantity":1000000000000}`, 0, false}, {`{"quantity":1.5}`, 0, false}, {`{"quantity":1.0}`, 0, false},
		{`{"quantity":"2"}`, 0, false}, {`{"quantity":null}`, 0, false}, {`{"quantity":true}`, 0, false},
		{`{"quantity":[1]}`, 0, false}, {`{"quantity":{}}`, 0, false}, {`{"quantity":1,"x":1}`, 0, false},
		{`{"Quantity":1}`, 0, false}, {`{"quantity":1,"quantity":1}`, 0, false}, {`{"quantity":1}x`, 0, false},
		{`{"quantity":1}{}`, 0, false}, {`{"quantity":1,}`, 0, false}, {`{`, 0, false}, {`[]`, 0, false},
		{`"x"`, 0, false}, {`1`, 0, false}, {`null`, 0, false}, {`{"quantity":99999999999999999999}`, 0, false},
		{`{"quantity":01}`, 0, false}, {`{"quantity":-0}`, 0, false},
	}
	for _, c := range cases {
		got, err := parseQuantity([]byte(c.body))
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("parseQuantity(%q) = %d, %v; want %d ok=%v", c.body, got, err, c.want, c.ok)
		}
	}
}

func TestParseSpec(t *testing.T) {
	good := `{"stock":10,"per_user_limit":2,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2030-01-01T01:00:00+01:00"}`
	if _, err := parseSpec([]byte(good)); err == nil {
		t.Error("starts_at equal to ends_at (other zone) accepted")
	}
	good = `{"stock":0,"per_user_limit":1,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2030-01-01T00:00:00.001Z"}`
	if _, err := parseSpec([]byte(good)); err != nil {
		t.Errorf("minimal valid spec: %v", err)
	}
	bad := []string{
		`{"stock":10,"per_user_limit":2,"starts_at":"2030-01-01T00:00:00Z"}`,
		`{"stock":-1,"per_user_limit":2,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z"}`,
		`{"stock":9007199254740992,"per_user_limit":2,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z"}`,
		`{"stock":1,"per_user_limit":0,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z"}`,
		`{"stock":1,"per_user_limit":1,"starts_at":"2030-01-01","ends_at":"2031-01-01T00:00:00Z"}`,
		`{"stock":1,"per_user_limit":1,"starts_at":"2031-01-01T00:00:00Z","ends_at":"2030-01-01T00:00:00Z"}`,
		`{"stock":"1","per_user_limit":1,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z"}`,
		`{"stock":1.5,"per_user_limit":1,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z"}`,
		`{"stock":1,"per_user_limit":1,"starts_at":1,"ends_at":"2031-01-01T00:00:00Z"}`,
		`{"stock":1,"per_user_limit":1,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z","x":1}`,
		`{"stock":1,"per_user_limit":1,"starts_at":"0001-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z"}`,
		`{"stock":1,"per_user_limit":1,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z","stock_shards":"2"}`,
		`{"stock":1,"per_user_limit":1,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z","stock_shards":2.5}`,
	}
	for _, b := range bad {
		if _, err := parseSpec([]byte(b)); err == nil {
			t.Errorf("parseSpec(%s) accepted", b)
		}
	}
	// stock_shards: optional (0: not given), 1..64, and the error names it.
	base := `{"stock":1,"per_user_limit":1,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2031-01-01T00:00:00Z"`
	for body, want := range map[string]int{base + `}`: 0, base + `,"stock_shards":1}`: 1, base + `,"stock_shards":64}`: 64} {
		if sp, err := parseSpec([]byte(body)); err != nil || sp.StockShards != want {
			t.Errorf("parseSpec(%s) = %d %v, want %d", body, sp.StockShards, err, want)
		}
	}
	for _, k := range []string{"0", "65", "-1"} {
		_, err := parseSpec([]byte(base + `,"stock_shards":` + k + `}`))
		if err == nil || !strings.Contains(err.Error(), "stock_shards must be between 1 and 64") {
			t.Errorf("stock_shards %s: %v", k, err)
		}
	}
}

func TestParseID(t *testing.T) {
	for s, want := range map[string]int64{"1": 1, "9223372036854775807": 9223372036854775807} {
		if got, ok := parseID(s); !ok || got != want {
			t.Errorf("parseID(%q) = %d %v", s, got, ok)
		}
	}
	for _, s := range []string{"", "0", "01", "-1", "+1", "1a", "9223372036854775808", "1.0", " 1"} {
		if _, ok := parseID(s); ok {
			t.Errorf("parseID(%q) accepted", s)
		}
	}
}

// FuzzParseQuantity: whatever the strict parser accepts, encoding/json reads
// the same way (with unknown fields disallowed), and it is in range.
func FuzzParseQuantity(f *testing.F) {
	for _, s := range []string{"", "{}", `{"quantity":2}`, `{"quantity":1.5}`, `{"quantity":"2"}`, `{"quantity":1}x`, `{"q\u0075antity":3}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		q, err := parseQuantity([]byte(body))
		if err != nil {
			return
		}
		if q < 1 || q > MaxQuantity {
			t.Fatalf("accepted out-of-range quantity %d from %q", q, body)
		}
		if strings.TrimSpace(body) == "" {
			return
		}
		var v struct {
			Quantity *int64 `json:"quantity"`
		}
		dec := json.NewDecoder(bytes.NewReader([]byte(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("accepted %q, encoding/json refuses it: %v", body, err)
		}
		want := int64(1)
		if v.Quantity != nil {
			want = *v.Quantity
		}
		if want != q {
			t.Fatalf("%q: parsed %d, encoding/json %d", body, q, want)
		}
	})
}
