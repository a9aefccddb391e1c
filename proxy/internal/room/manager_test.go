package room

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
)

func rules(keyFile string) []conf.Rule {
	return []conf.Rule{{Name: "buy", PathPrefix: "/api/v1/activities/", WaitingRoom: &conf.WaitingRoom{KeyFile: keyFile, KeyGrace: conf.D(time.Minute)}}}
}

// SIGHUP: a new key in the file signs from then on and tickets of the old
// one stay good for key_grace; a reload whose key file is bad changes
// nothing (the running key still signs) and names the key.
func TestManagerReloadRotatesKeys(t *testing.T) {
	dir := t.TempDir()
	path := writeKey(t, dir, "k", keyA)
	m, err := New(rules(path), Options{})
	if err != nil {
		t.Fatal(err)
	}
	kr := (*m.rules.Load())[0].keys
	now := time.Now()
	old := kr.Sign(Ticket{Kind: KindPlace, Place: 1, Expires: now.Add(time.Hour).UnixMilli()})

	writeKey(t, dir, "k", "short")
	if err := m.SetRules(rules(path)); err == nil || !strings.Contains(err.Error(), "waiting_room.key_file") {
		t.Fatalf("bad key file: %v, want an error naming waiting_room.key_file", err)
	}
	if _, err := kr.Parse([]byte(old), now); err != nil {
		t.Fatalf("after a refused reload the running key does not verify: %v", err)
	}

	writeKey(t, dir, "k", keyB)
	if err := m.SetRules(rules(path)); err != nil {
		t.Fatal(err)
	}
	if got := (*m.rules.Load())[0].keys; got != kr {
		t.Fatal("the reload replaced the keyring instead of rotating it")
	}
	if kr.Sign(Ticket{Kind: KindPlace, Place: 1, Expires: now.Add(time.Hour).UnixMilli()}) == old {
		t.Fatal("the new key does not sign")
	}
	if _, err := kr.Parse([]byte(old), now); err != nil {
		t.Errorf("old ticket within key_grace: %v", err)
	}
	if _, err := kr.Parse([]byte(old), now.Add(2*time.Minute)); Reason(err) != ReasonUnknownKey {
		t.Errorf("old ticket after key_grace: %v", err)
	}
	if _, err := New(rules(filepath.Join(dir, "missing")), Options{}); err == nil || !strings.Contains(err.Error(), "proxy.rules[0].waiting_room.key_file") {
		t.Errorf("missing key file: %v", err)
	}
}

func TestActivityFromPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		id   int64
		ok   bool
	}{
		{"/api/v1/activities/42/purchase", 42, true},
		{"/api/v1/activities/42", 42, true},
		{"/api/v1/activities/42/", 42, true},
		{"/api/v1/activities/", 0, false},
		{"/api/v1/activities/0/purchase", 0, false},
		{"/api/v1/activities/x/purchase", 0, false},
		{"/api/v1/activities/99999999999999999999/purchase", 0, false},
		{"/api/v2/activities/1", 0, false},
	} {
		id, ok := ActivityFromPath([]byte(tc.path))
		if id != tc.id || ok != tc.ok {
			t.Errorf("%s: %d %v, want %d %v", tc.path, id, ok, tc.id, tc.ok)
		}
	}
}
