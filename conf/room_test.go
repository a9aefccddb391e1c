package conf

import (
	"strings"
	"testing"
	"time"
)

func TestWaitingRoomKeys(t *testing.T) {
	const head = "[[proxy.rules]]\nname = \"buy\"\npath_prefix = \"/api/v1/activities/\"\nper_ip = { limit = 1, window = \"1s\" }\n"
	room := func(kv string) string { return head + "waiting_room = { key_file = \"/k\"" + kv + " }" }
	bad := []struct{ doc, want string }{
		{head + "waiting_room = { }", "proxy.rules[0].waiting_room.key_file: is required"},
		{room(", admit_per_second = -1"), "proxy.rules[0].waiting_room.admit_per_second: must be between 0.01 and 1000000"},
		{room(", max_active = -3"), "proxy.rules[0].waiting_room.max_active: must be between 1 and 10000000"},
		{room(", session = \"10ms\""), "proxy.rules[0].waiting_room.session: must be between 1s and 24h"},
		{room(", poll_interval = \"1500ms\""), "proxy.rules[0].waiting_room.poll_interval: must be whole seconds"},
		{room(", poll_interval = \"5s\", place_ttl = \"10s\""), "proxy.rules[0].waiting_room.place_ttl: must be at least 3 × poll_interval (15s)"},
		{room(", no_show_margin = -1"), "proxy.rules[0].waiting_room.no_show_margin: must be between 0 and 10000000"},
		{room(", opens_at = \"tomorrow\""), "proxy.rules[0].waiting_room.opens_at: must be an RFC 3339 time"},
		{room(", on_redis_error = \"wait\""), `proxy.rules[0].waiting_room.on_redis_error: must be "local" (the line freezes), "open" (let through) or "closed" (refuse), got "wait"`},
		{room(", cookie = \"a b\""), "proxy.rules[0].waiting_room.cookie: must be a cookie name"},
		{room(", activity_id = -1"), "proxy.rules[0].waiting_room.activity_id: must be a sale's id, or 0 to take it from the path"},
		{room(", key_grace = \"-1s\""), "proxy.rules[0].waiting_room.key_grace: must be between 0s and 168h"},
		{strings.Replace(room(""), "/api/v1/activities/", "/shop/", 1), "proxy.rules[0].waiting_room.activity_id: is 0 (taken from the path /api/v1/activities/{id}/…), but the rule's path_prefix \"/shop/\" never matches such a path"},
		{room(", seats = 3"), "proxy.rules.waiting_room.seats: unknown key"},
	}
	for _, tc := range bad {
		_, err := Parse(tc.doc, noEnv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to mention %q", tc.doc, err, tc.want)
		}
	}
	cfg, err := Parse(room(""), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Proxy.Rules[0].WaitingRoom
	if w.AdmitPerSecond != 50 || w.MaxActive != 1000 || w.Session.Duration != 2*time.Minute || w.PollInterval.Duration != 2*time.Second ||
		w.PlaceTTL.Duration != 15*time.Second || w.NoShowMargin != 0 || w.KeyGrace.Duration != 10*time.Minute ||
		w.Cookie != "seckill_room_buy" || w.OnRedisError != "local" || w.ActivityID != 0 {
		t.Errorf("defaults: %+v", *w)
	}
	cfg, err = Parse(strings.Replace(room(", activity_id = 7, opens_at = \"2026-11-11T00:00:00Z\""), "/api/v1/activities/", "/shop/", 1), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.Proxy.Rules[0].WaitingRoom; w.ActivityID != 7 || !w.OpensAtTime().Equal(time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("parsed %+v", *w)
	}
}
