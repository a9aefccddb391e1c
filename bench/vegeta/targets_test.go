package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

func TestTargets(t *testing.T) {
	var b bytes.Buffer
	if err := write(&b, "http://127.0.0.1:9", 42, 3, 50, 2); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 50 {
		t.Fatalf("%d targets, want 50", len(lines))
	}
	keys, users := map[string]bool{}, map[string]bool{}
	for _, l := range lines {
		var tg target
		if err := json.Unmarshal([]byte(l), &tg); err != nil {
			t.Fatal(err)
		}
		if tg.Method != "POST" || tg.URL != "http://127.0.0.1:9/api/v1/activities/42/purchase" {
			t.Errorf("target %+v", tg)
		}
		body, _ := base64.StdEncoding.DecodeString(tg.Body)
		if string(body) != `{"quantity":2}` {
			t.Errorf("body %q", body)
		}
		keys[tg.Header["Idempotency-Key"][0]] = true
		users[tg.Header["X-User-ID"][0]] = true
	}
	if len(keys) != 50 {
		t.Errorf("%d distinct keys for 50 targets", len(keys))
	}
	for u := range users {
		if u != "u0" && u != "u1" && u != "u2" {
			t.Errorf("user %s outside the pool of 3", u)
		}
	}
	if err := write(&b, "x", 1, 0, 1, 1); err == nil {
		t.Error("users=0 must be refused")
	}
}
