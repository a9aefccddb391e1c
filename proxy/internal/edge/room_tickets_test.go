package edge

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/proxy/internal/room"
)

// Bad tickets never gain anything: a modified, forged, expired, other-room,
// other-identity or replayed ticket leaves its bearer at its identity's own
// place (or gives it a new one at the back), never admits it, never reaches
// the shop, never answers 500; each is counted by reason.
func TestRoomBadTickets(t *testing.T) {
	t.Parallel()
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 0.01}) // a line that never moves
	s.start(t, 2)
	cs := s.clients()
	kr, err := room.LoadKeyring(s.cfg.Proxy.Rules[0].WaitingRoom.KeyFile)
	servicetest.Must(t, err, "key")
	other, err := room.LoadKeyring(writeTempKey(t, "another-key-0123456789abcdef0123456789"))
	servicetest.Must(t, err, "other key")
	const a, b = "10.0.0.2", "10.0.0.1"
	rb := roomAsk(t, cs[0], "POST", purchasePath(roomAct), b, "")
	ra := roomAsk(t, cs[1], "POST", purchasePath(roomAct), a, "")
	if rb.position != 1 || ra.position != 2 || ra.ticket == "" {
		t.Fatalf("places %d %d (ticket %q), want 1, 2", rb.position, ra.position, ra.ticket)
	}
	future := time.Now().Add(time.Hour).UnixMilli()
	admission := func(kr *room.Keyring, roomName, id string, expires int64) string {
		return kr.Sign(room.Ticket{Kind: room.KindAdmission, Room: room.RoomHash(roomName), Identity: room.IdentityHash(id),
			Place: 1, Expires: expires})
	}
	flip := []byte(ra.ticket)
	flip[10] ^= 'A' ^ 'B'
	if flip[10] == ra.ticket[10] {
		flip[10] = 'C'
	}
	// (The reasons each counts under are checked on the metric below.)
	cases := []struct {
		name, ticket, cookie string
		wantPos              int64
	}{
		{"modified", string(flip), "", 2},
		{"other identity (b's place)", rb.ticket, "", 2},
		{"forged admission (another key)", admission(other, "buy/1", "a:"+a, future), "", 2},
		{"expired admission", admission(kr, "buy/1", "a:"+a, time.Now().Add(-time.Second).UnixMilli()), "", 2},
		{"other room's admission", admission(kr, "buy/2", "a:"+a, future), "", 2},
		{"replayed admission (not in force)", admission(kr, "buy/1", "a:"+a, future), "", 2},
		{"garbage header", strings.Repeat("A", 2000), "", 2},
		{"garbage cookie", "", "seckill_room_buy=%%%; x=\"", 2},
		{"short cookie", "", "seckill_room_buy=AAAA", 2},
	}
	for i, tc := range cases {
		var hdr []string
		if tc.cookie != "" {
			hdr = []string{"Cookie", tc.cookie}
		}
		r := roomAsk(t, cs[i%2], "POST", purchasePath(roomAct), a, tc.ticket, hdr...)
		if r.status != 429 || r.position != tc.wantPos {
			t.Errorf("%s: %d %s position %d, want 429 at %d", tc.name, r.status, r.code, r.position, tc.wantPos)
		}
	}
	// A new client with another's ticket gets a new place at the back.
	if r := roomAsk(t, cs[0], "POST", purchasePath(roomAct), "10.0.0.3", ra.ticket); r.status != 429 || r.position != 3 {
		t.Errorf("a third client with a's ticket: %d position %d, want 429 at 3", r.status, r.position)
	}
	if n := s.shop.sold.Load(); n != 0 {
		t.Errorf("%d purchases reached the shop", n)
	}
	text := scrape(t, s.pxs[0]) + scrape(t, s.pxs[1])
	for _, reason := range []string{"bad_signature", "other_identity", "unknown_key", "expired", "other_room", "stale", "malformed"} {
		if metricSum(text, `seckill_proxy_room_bad_tickets_total{reason="`+reason+`",room="buy/1"}`) == 0 {
			t.Errorf("no bad ticket counted as %s", reason)
		}
	}
	if metricSum(text, `seckill_proxy_room_answers_total{answer="admitted"`) != 0 {
		t.Error("a bad ticket was admitted")
	}
}

func writeTempKey(t *testing.T, key string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "k")
	servicetest.Must(t, os.WriteFile(p, []byte(key), 0o600), "key")
	return p
}

// The page a browser sees: 200 text/html with its place, a self refresh and
// no external asset; the cookie carries the ticket; sold out is a 409 page.
// A keyed purchase of a sold-out sale that may replay an accepted order
// still reaches the backend.
func TestRoomAnswers(t *testing.T) {
	t.Parallel()
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 0.01})
	s.start(t, 1)
	c := s.clients()[0]
	get := func(path, ip, cookie string, hdr ...string) (int, string, string, string) {
		h := append([]string{"Accept", "text/html,application/xhtml+xml"}, hdr...)
		if cookie != "" {
			h = append(h, "Cookie", cookie)
		}
		resp := get(t, c, "GET", path, append(h, "X-Forwarded-For", ip)...)
		setCookie := string(resp.Header.PeekCookie("seckill_room_buy"))
		return resp.StatusCode(), string(resp.Header.ContentType()), string(resp.Body()), setCookie
	}
	// A sale Redis does not hold gets no room: on to the backend.
	if r := roomAsk(t, c, "GET", "/api/v1/activities/777/page", "10.0.0.1", ""); r.status != 200 {
		t.Errorf("a sale that does not exist: %d %s, want the shop's 200", r.status, r.code)
	}
	roomAsk(t, c, "GET", "/api/v1/activities/1/page", "10.0.0.1", "")
	st, ct, body, sc := get("/api/v1/activities/1/page", "10.0.0.2", "")
	if st != 200 || !strings.HasPrefix(ct, "text/html") || !strings.Contains(body, `id="position">2<`) ||
		!strings.Contains(body, `http-equiv="refresh"`) || strings.Contains(body, "src=") || strings.Contains(body, "href=") {
		t.Fatalf("waiting page: %d %s\n%s", st, ct, body)
	}
	if !strings.Contains(sc, "HttpOnly") || !strings.Contains(strings.ToLower(sc), "samesite=lax") {
		t.Errorf("cookie %q", sc)
	}
	val := strings.TrimPrefix(strings.SplitN(sc, ";", 2)[0], "seckill_room_buy=")
	// Another address with that cookie is another client: its own place.
	if _, _, body, _ := get("/api/v1/activities/1/page", "10.0.0.3", "seckill_room_buy="+val); !strings.Contains(body, `id="position">3<`) {
		t.Errorf("another client with the cookie:\n%s", body)
	}
	// Its own client: the same place, and a fresh ticket is not signed
	// again (no Set-Cookie: the cookie it holds is good for long enough).
	if _, _, body, sc := get("/api/v1/activities/1/page", "10.0.0.2", "seckill_room_buy="+val); !strings.Contains(body, `id="position">2<`) || sc != "" {
		t.Errorf("the cookie's own client (Set-Cookie %q):\n%s", sc, body)
	}

	// Sold out: a sale with no unit left (read at the next step).
	putSale(t, s.rdb, s.prefix, 1, 0)
	time.Sleep(400 * time.Millisecond)
	if st, _, body, _ := get("/api/v1/activities/1/page", "10.0.0.2", "seckill_room_buy="+val); st != 409 || !strings.Contains(body, "Sold out") {
		t.Errorf("sold-out page: %d\n%s", st, body)
	}
	r := roomAsk(t, c, "POST", purchasePath(1), "10.0.0.2", "")
	if r.status != 409 || r.typ != "urn:seckill:proxy:sold_out" || r.position != 2 || r.ahead != 1 {
		t.Errorf("sold-out answer: %+v, want 409 sold_out at 2 with 1 ahead", r)
	}
	r = roomAsk(t, c, "POST", purchasePath(1), "10.0.0.2", "", "X-User-ID", "u2", "Idempotency-Key", "replay")
	if r.status != 202 {
		t.Errorf("keyed replay of a sold-out sale: %d %s, want the backend's 202", r.status, r.code)
	}
}

// Redis failure, per room on_redis_error: once the room's steps fail, an
// admitted client passes in every mode; a client in line keeps its place
// ("local"), passes ("open") or is refused ("closed"); a newcomer is
// refused ("local", "closed") or passes ("open"). When Redis is back the
// room is back.
func TestRoomRedisFailure(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(servicetest.RedisURL())
	if err != nil || u.Scheme != "redis" {
		t.Skip("needs a single-node Redis URL to put a fault proxy in front of")
	}
	for _, tc := range []struct {
		mode               string
		inLine, newcomer   int
		inLinePos, anyPass bool
	}{
		{"local", 429, 503, true, false},
		{"open", 200, 200, false, true},
		{"closed", 503, 503, false, false},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 0.01, OnRedisError: tc.mode})
			fp, err := faultnet.Listen("127.0.0.1:0", u.Host)
			servicetest.Must(t, err, "fault proxy")
			t.Cleanup(func() { _ = fp.Close() })
			s.cfg.Redis.URL = "redis://" + fp.Addr() + u.Path
			s.start(t, 1)
			c := s.clients()[0]
			kr, _ := room.LoadKeyring(s.cfg.Proxy.Rules[0].WaitingRoom.KeyFile)
			adm := kr.Sign(room.Ticket{Kind: room.KindAdmission, Room: room.RoomHash("buy/1"), Identity: room.IdentityHash("a:10.0.0.9"),
				Expires: time.Now().Add(time.Hour).UnixMilli()})
			ra := roomAsk(t, c, "GET", "/api/v1/activities/1/page", "10.0.0.1", "")
			if ra.status != 429 || ra.position != 1 {
				t.Fatalf("before the failure: %d position %d", ra.status, ra.position)
			}
			time.Sleep(300 * time.Millisecond) // a step saw the line
			fp.Set(faultnet.Faults{Up: faultnet.Flow{CutRate: 1}})
			fp.CutAll()
			deadline := time.Now().Add(5 * time.Second)
			for metricSum(scrape(t, s.pxs[0]), `seckill_proxy_room_redis_calls_total{result="error",room="buy/1",script="tick"}`) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("no step failed")
				}
				roomAsk(t, c, "GET", "/api/v1/activities/1/page", "10.0.0.1", ra.ticket) // keeps the room in use
				time.Sleep(50 * time.Millisecond)
			}
			if r := roomAsk(t, c, "GET", "/api/v1/activities/1/page", "10.0.0.9", adm); r.status != 200 {
				t.Errorf("admitted client: %d %s, want 200 from the shop", r.status, r.code)
			}
			r := roomAsk(t, c, "GET", "/api/v1/activities/1/page", "10.0.0.1", ra.ticket)
			if r.status != tc.inLine || (tc.inLinePos && r.position != 1) {
				t.Errorf("client in line: %d %s position %d, want %d", r.status, r.code, r.position, tc.inLine)
			}
			if r := roomAsk(t, c, "GET", "/api/v1/activities/1/page", "10.0.0.2", ""); r.status != tc.newcomer {
				t.Errorf("newcomer: %d %s, want %d", r.status, r.code, tc.newcomer)
			}
			fp.Set(faultnet.Faults{})
			deadline = time.Now().Add(5 * time.Second)
			for {
				r := roomAsk(t, c, "GET", "/api/v1/activities/1/page", "10.0.0.2", "")
				if r.status == 429 && r.position == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after Redis came back: %d %s position %d, want 429 at 2", r.status, r.code, r.position)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// With [proxy.identity] jwt the place is the verified user's: the same user
// from other addresses, at either instance, without its ticket, gets its
// place back; another user behind the same address gets its own.
func TestRoomJWTIdentity(t *testing.T) {
	t.Parallel()
	const secret = "room-jwt-secret-0123456789abcdef0123456789"
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 0.01})
	s.cfg.Proxy.Identity.JWT = &conf.JWT{Header: "Authorization", Alg: "HS256", KeyFile: writeSecret(t, secret), Claim: "sub", Issuer: "shop"}
	s.start(t, 2)
	cs := s.clients()
	alice := "Bearer " + hsToken(t, secret, "alice", time.Now().Add(time.Hour))
	bob := "Bearer " + hsToken(t, secret, "bob", time.Now().Add(time.Hour))
	a1 := roomAsk(t, cs[0], "POST", purchasePath(roomAct), "10.1.0.1", "", "Authorization", alice)
	a2 := roomAsk(t, cs[1], "POST", purchasePath(roomAct), "10.1.0.2", "", "Authorization", alice)
	b1 := roomAsk(t, cs[0], "POST", purchasePath(roomAct), "10.1.0.1", "", "Authorization", bob)
	if a1.position != 1 || a2.position != 1 || b1.position != 2 {
		t.Errorf("alice at %d then %d (another address, the other instance), bob at %d; want 1, 1, 2", a1.position, a2.position, b1.position)
	}
	// Alice's ticket is worth nothing to bob.
	if r := roomAsk(t, cs[1], "POST", purchasePath(roomAct), "10.1.0.1", a1.ticket, "Authorization", bob); r.position != 2 {
		t.Errorf("bob with alice's ticket: position %d, want his own 2", r.position)
	}
}
