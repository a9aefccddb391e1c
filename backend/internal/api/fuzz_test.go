package api

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/seckill/seckill/internal/ordermsg"
)

// refUserID is the contract's X-User-ID rule (1–64 of [A-Za-z0-9_.-]) written
// byte by byte, independently of the regexp the service uses.
func refUserID(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// FuzzPurchaseHeaders: the header checks of a purchase accept exactly what
// the contract allows (no newline, NUL or non-ASCII slips through to Redis
// keys, the idempotency field "user:key" or log lines).
func FuzzPurchaseHeaders(f *testing.F) {
	for _, s := range [][2]string{{"alice", "k1"}, {"a\n", "k"}, {"", ""}, {"é", "\x7f"}, {"a:b", "x:y"},
		{string(bytes.Repeat([]byte("a"), 65)), string(bytes.Repeat([]byte("k"), 129))}, {"user-1.x_Y", " ~"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, user, key string) {
		if got, want := ordermsg.ValidUserID(user), refUserID(user); got != want {
			t.Fatalf("ValidUserID(%q) = %v, the contract says %v", user, got, want)
		}
		okKey := len(key) >= 1 && len(key) <= 128
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				okKey = false
			}
		}
		if got := ordermsg.ValidIdempotencyKey(key); got != okKey {
			t.Fatalf("ValidIdempotencyKey(%q) = %v, the contract says %v", key, got, okKey)
		}
	})
}

// FuzzParseSpec: whatever the admin body parser accepts is a sale the rest
// of the system can hold, and encoding/json reads the same numbers.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		`{"stock":10,"per_user_limit":1,"starts_at":"2026-01-01T00:00:00Z","ends_at":"2026-01-02T00:00:00Z"}`,
		`{"stock":-1,"per_user_limit":1,"starts_at":"2026-01-01T00:00:00Z","ends_at":"2026-01-02T00:00:00Z"}`,
		`{"stock":1e3,"per_user_limit":1,"starts_at":"x","ends_at":"y"}`,
		`{"stock":1,"per_user_limit":1,"starts_at":"2026-01-01T00:00:00.0001Z","ends_at":"2026-01-01T00:00:00.0002Z"}`,
		`{}`, `[]`, `{"stock":1,"stock":2}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		sp, err := parseSpec([]byte(body))
		if err != nil {
			return
		}
		if sp.Stock < 0 || sp.Stock > MaxStock || sp.PerUserLimit < 1 || sp.PerUserLimit > MaxQuantity {
			t.Fatalf("accepted out-of-range spec %+v from %q", sp, body)
		}
		if !sp.StartsAt.Before(sp.EndsAt) || sp.StartsAt.Year() < 1970 || sp.EndsAt.Year() > 9999 {
			t.Fatalf("accepted bad window %+v from %q", sp, body)
		}
		var v struct {
			Stock        int64  `json:"stock"`
			PerUserLimit int64  `json:"per_user_limit"`
			StartsAt     string `json:"starts_at"`
			EndsAt       string `json:"ends_at"`
		}
		dec := json.NewDecoder(bytes.NewReader([]byte(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("accepted %q, encoding/json refuses it: %v", body, err)
		}
		if v.Stock != sp.Stock || v.PerUserLimit != sp.PerUserLimit {
			t.Fatalf("%q: parsed %+v, encoding/json %+v", body, sp, v)
		}
	})
}
