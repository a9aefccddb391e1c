package conf

import (
	"math"
	"strings"
	"time"
)

// WaitingRoom is [[proxy.rules]] waiting_room: a line in front of the
// rule's windows, shared by every proxy instance through Redis
// (docs/waiting-room.md). A rule without it has no room.
type WaitingRoom struct {
	// ActivityID is the sale the room serves; 0 takes it from the request
	// path /api/v1/activities/{id}/… (one room per activity then; a request
	// of the rule whose path names none passes as if there were no room).
	ActivityID int64 `toml:"activity_id"`
	// OpensAt (RFC 3339) is when the line starts moving; arrivals before it
	// are put in a random order at the opening. "": the sale's starts_at as
	// Redis holds it, else at once.
	OpensAt string `toml:"opens_at"`
	// AdmitPerSecond is the pace at which the line moves (all instances
	// together).
	AdmitPerSecond float64 `toml:"admit_per_second"`
	// MaxActive caps the clients admitted and not yet done.
	MaxActive int `toml:"max_active"`
	// Session is how long an admission lasts; a client not done by then
	// frees its slot.
	Session Duration `toml:"session"`
	// PollInterval is the Retry-After told to those far from the front
	// (near it: 1 s); whole seconds.
	PollInterval Duration `toml:"poll_interval"`
	// PlaceTTL: a place whose holder has not polled this long is skipped
	// when the line reaches it; at least 3 × poll_interval.
	PlaceTTL Duration `toml:"place_ttl"`
	// NoShowMargin: admitted and unfinished clients may exceed the units
	// left by this many (some admitted clients never buy).
	NoShowMargin int `toml:"no_show_margin"`
	// KeyFile holds the HMAC key of the room's tickets (at least 32 bytes);
	// read at start and on SIGHUP, the previous key accepted for KeyGrace.
	KeyFile  string   `toml:"key_file"`
	KeyGrace Duration `toml:"key_grace"`
	// Cookie carries the ticket of a browser; "": "seckill_room_<rule>".
	Cookie string `toml:"cookie"`
	// CookieSecure marks the cookie Secure (the proxy behind TLS).
	CookieSecure bool `toml:"cookie_secure"`
	// OnRedisError is "local" (the line freezes: admitted clients pass,
	// waiters keep their last known place, newcomers get 503), "open" (the
	// room lets every request through to the rule's windows) or "closed"
	// (503 to all but admitted clients).
	OnRedisError string `toml:"on_redis_error"`
}

// OpensAtTime parses OpensAt (validated); zero when not set.
func (w *WaitingRoom) OpensAtTime() time.Time {
	t, _ := time.Parse(time.RFC3339, w.OpensAt)
	return t
}

func (w *WaitingRoom) validate(p *problems, key string, r *Rule) {
	key += ".waiting_room"
	if w.ActivityID < 0 {
		p.add(key+".activity_id", "must be a sale's id, or 0 to take it from the path, got %d", w.ActivityID)
	}
	if w.ActivityID == 0 && !strings.HasPrefix(r.PathPrefix, roomPathPrefix) && !strings.HasPrefix(roomPathPrefix, r.PathPrefix) {
		p.add(key+".activity_id", "is 0 (taken from the path %s{id}/…), but the rule's path_prefix %q never matches such a path",
			roomPathPrefix, r.PathPrefix)
	}
	if w.OpensAt != "" {
		if _, err := time.Parse(time.RFC3339, w.OpensAt); err != nil {
			p.add(key+".opens_at", "must be an RFC 3339 time such as 2026-11-11T00:00:00Z, got %q", w.OpensAt)
		}
	}
	if w.AdmitPerSecond == 0 {
		w.AdmitPerSecond = 50
	}
	if math.IsNaN(w.AdmitPerSecond) || w.AdmitPerSecond < 0.01 || w.AdmitPerSecond > 1_000_000 {
		p.add(key+".admit_per_second", "must be between 0.01 and 1000000, got %v", w.AdmitPerSecond)
	}
	if w.MaxActive == 0 {
		w.MaxActive = 1000
	}
	checkRange(p, key+".max_active", w.MaxActive, 1, 10_000_000)
	if w.Session.Duration == 0 {
		w.Session = D(2 * time.Minute)
	}
	if w.Session.Duration < time.Second || w.Session.Duration > 24*time.Hour {
		p.add(key+".session", "must be between 1s and 24h, got %q", w.Session.String())
	}
	if w.PollInterval.Duration == 0 {
		w.PollInterval = D(2 * time.Second)
	}
	pi := w.PollInterval.Duration
	if pi < time.Second || pi > time.Minute || pi%time.Second != 0 {
		p.add(key+".poll_interval", "must be whole seconds between 1s and 1m (it is sent as Retry-After), got %q", w.PollInterval.String())
	}
	if w.PlaceTTL.Duration == 0 {
		w.PlaceTTL = D(max(15*time.Second, 3*pi))
	}
	if w.PlaceTTL.Duration < 3*pi || w.PlaceTTL.Duration > time.Hour {
		p.add(key+".place_ttl", "must be at least 3 × poll_interval (%s) and at most 1h, got %q", (3 * pi).String(), w.PlaceTTL.String())
	}
	if w.NoShowMargin < 0 || w.NoShowMargin > 10_000_000 {
		p.add(key+".no_show_margin", "must be between 0 and 10000000, got %d", w.NoShowMargin)
	}
	if w.KeyFile == "" {
		p.add(key+".key_file", "is required: the HMAC key of the room's tickets (at least 32 bytes, the same file on every instance)")
	}
	if w.KeyGrace.Duration == 0 {
		w.KeyGrace = D(10 * time.Minute)
	}
	if w.KeyGrace.Duration < 0 || w.KeyGrace.Duration > 7*24*time.Hour {
		p.add(key+".key_grace", "must be between 0s and 168h, got %q", w.KeyGrace.String())
	}
	if w.Cookie == "" {
		w.Cookie = "seckill_room_" + r.Name
	}
	if !isToken(w.Cookie) {
		p.add(key+".cookie", "must be a cookie name, got %q", w.Cookie)
	}
	switch w.OnRedisError {
	case "":
		w.OnRedisError = "local"
	case "local", "open", "closed":
	default:
		p.add(key+".on_redis_error", `must be "local" (the line freezes), "open" (let through) or "closed" (refuse), got %q`, w.OnRedisError)
	}
}

// roomPathPrefix is where a room without activity_id finds the sale's id.
const roomPathPrefix = "/api/v1/activities/"
