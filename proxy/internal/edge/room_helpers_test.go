package edge

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	isoldout "github.com/seckill/seckill/internal/soldout"
	"github.com/seckill/seckill/proxy/internal/room"
)

// The waiting room's tests run two proxy instances (each its own Redis
// client, limiter and rooms, as two processes would have) against the real
// Redis under the test's key prefix, in front of shopUpstream.

const roomAct = 1

// shop is a fake backend holding a sale's stock where the backend does
// (reservation.KeysFor(prefix, id).Meta: total, sold, pending): a purchase
// takes a unit if one is left (202) or answers 409 sold_out, and the last
// unit publishes the v2 sold-out event on the stock-event channel, as the
// backend does. Other paths answer 200 "shop".
type shop struct {
	addr   string
	rdb    redis.UniversalClient
	prefix string
	bought sync.Map // X-Test-Client -> purchase time
	soldAt atomic.Int64
	sold   atomic.Int64
}

// takeUnit sells a unit to ARGV[1] and records the buyer beside the stock
// (KEYS[2], the sale's hash slot), so that a MULTI reads both at one moment.
var takeUnit = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'total', 'sold', 'pending')
if not m[1] then return -1 end
local left = tonumber(m[1]) - tonumber(m[2] or '0') - tonumber(m[3] or '0')
if left <= 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'sold', 1)
redis.call('SADD', KEYS[2], ARGV[1])
return left`)

// buyersKey is the set of clients the shop sold a unit to.
func buyersKey(prefix string, id int64) string {
	return reservation.KeysFor(prefix, id).Base + "test-buyers"
}

func startShop(t *testing.T, rdb redis.UniversalClient, prefix string) *shop {
	t.Helper()
	s := &shop{rdb: rdb, prefix: prefix}
	s.addr = servicetest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		id, purchase := purchaseOf(ctx)
		if !purchase {
			ctx.SetContentType("text/html")
			ctx.SetBodyString("<html><body><h1 id=shop>shop</h1></body></html>")
			return
		}
		if k := ctx.Request.Header.Peek("Idempotency-Key"); len(k) > 0 && string(k) == "replay" {
			ctx.SetStatusCode(202)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"order_id":"o-replay","status":"confirmed"}`)
			return
		}
		meta := reservation.KeysFor(prefix, id).Meta
		buyer := "a:" + string(ctx.Request.Header.Peek("X-Test-Client"))
		left, err := takeUnit.Run(context.Background(), rdb, []string{meta, buyersKey(prefix, id)}, buyer).Int64()
		if err != nil {
			ctx.SetStatusCode(503)
			return
		}
		if left == 0 {
			ctx.SetStatusCode(409)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"code":"sold_out","message":"sold out"}`)
			return
		}
		s.bought.Store(string(ctx.Request.Header.Peek("X-Test-Client")), time.Now())
		s.sold.Add(1)
		if left == 1 {
			s.soldAt.Store(time.Now().UnixMilli())
			rdb.Publish(context.Background(), reservation.Channel(prefix), isoldout.SoldOutEvent(id))
		}
		ctx.SetStatusCode(202)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"order_id":"o","status":"pending"}`)
	}})
	return s
}

func purchaseOf(ctx *fasthttp.RequestCtx) (int64, bool) {
	p := string(ctx.Path())
	rest, ok := strings.CutPrefix(p, "/api/v1/activities/")
	if !ok || !strings.HasSuffix(rest, "/purchase") || string(ctx.Method()) != "POST" {
		return 0, false
	}
	id, err := strconv.ParseInt(strings.TrimSuffix(rest, "/purchase"), 10, 64)
	return id, err == nil
}

// putSale writes a sale of total units, open since a second ago.
func putSale(t *testing.T, rdb redis.UniversalClient, prefix string, id int64, total int) {
	t.Helper()
	now := time.Now().UnixMilli()
	err := rdb.HSet(context.Background(), reservation.KeysFor(prefix, id).Meta, "total", total, "sold", 0, "pending", 0,
		"limit", 1, "start", now-1000, "end", now+3_600_000).Err()
	servicetest.Must(t, err, "put sale")
}

// roomSetup is a shop and the config of two proxies in front of it with a
// waiting room on the purchase path.
type roomSetup struct {
	cfg    conf.Config
	shop   *shop
	rdb    redis.UniversalClient
	prefix string
	pxs    []*proxyUnderTest
	trace  chan room.Event
}

func newRoomSetup(t *testing.T, wr conf.WaitingRoom) *roomSetup {
	t.Helper()
	rdb, prefix := servicetest.Redis(t)
	s := &roomSetup{rdb: rdb, prefix: prefix, trace: make(chan room.Event, 100_000)}
	s.shop = startShop(t, rdb, prefix)
	cfg := conf.Default()
	cfg.Redis.URL = servicetest.RedisURL()
	cfg.Redis.KeyPrefix = prefix
	cfg.Proxy.Upstreams = []string{"http://" + s.shop.addr}
	cfg.Proxy.Listen, cfg.Proxy.AdminListen = "127.0.0.1:0", "127.0.0.1:1"
	cfg.Proxy.TrustedProxies = []string{"127.0.0.0/8"}
	// The room is under test, not the windows: they live in memory.
	cfg.Proxy.Limiter = "memory"
	if wr.KeyFile == "" {
		wr.KeyFile = filepath.Join(t.TempDir(), "room.key")
		servicetest.Must(t, os.WriteFile(wr.KeyFile, []byte("test-room-key-0123456789abcdef0123456789"), 0o600), "key")
	}
	if wr.PollInterval.Duration == 0 {
		wr.PollInterval = conf.D(time.Second)
	}
	if wr.PlaceTTL.Duration == 0 {
		wr.PlaceTTL = conf.D(3 * time.Second)
	}
	cfg.Proxy.Rules = []conf.Rule{{Name: "buy", PathPrefix: "/api/v1/activities/", OnRedisError: "open",
		Global: &conf.Window{Limit: 10_000_000, Window: conf.D(time.Second)}, WaitingRoom: &wr}}
	s.cfg = cfg
	// A room per sale named in the path is made for a sale Redis holds:
	// one with stock enough for any test; tests of stock put their own.
	putSale(t, rdb, prefix, roomAct, 1_000_000)
	return s
}

func (s *roomSetup) start(t *testing.T, n int) {
	t.Helper()
	for range n {
		s.pxs = append(s.pxs, startProxy(t, s.cfg, WithRoom(func(o *room.Options) {
			o.Trace = func(e room.Event) { s.trace <- e }
		})))
	}
}

// events drains the admissions traced so far.
func (s *roomSetup) events() []room.Event {
	var out []room.Event
	for {
		select {
		case e := <-s.trace:
			out = append(out, e)
		default:
			return out
		}
	}
}

// roomReply is one answer as a client sees it.
type roomReply struct {
	status     int
	typ        string // problem type: the proxy's own answers are urn:seckill:proxy:*
	retryAfter int
	ticket     string
	code       string
	position   int64
	ahead      int64
	eta        int64
	at         time.Time
}

// roomAsk sends one request as client ip (X-Forwarded-For from the trusted
// loopback) with its ticket, if any, in the Room-Ticket header.
func roomAsk(t *testing.T, c *fasthttp.HostClient, method, path, ip, ticket string, hdr ...string) roomReply {
	t.Helper()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + c.Addr + path)
	req.Header.SetMethod(method)
	req.Header.Set("X-Forwarded-For", ip)
	req.Header.Set("X-Test-Client", ip)
	if ticket != "" {
		req.Header.Set("Room-Ticket", ticket)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if err := c.Do(req, resp); err != nil {
		t.Errorf("%s %s as %s: %v", method, path, ip, err)
		return roomReply{}
	}
	r := roomReply{status: resp.StatusCode(), at: time.Now()}
	r.retryAfter, _ = strconv.Atoi(string(resp.Header.Peek("Retry-After")))
	r.ticket = string(resp.Header.Peek("Room-Ticket"))
	if strings.HasPrefix(string(resp.Header.ContentType()), "application/") {
		var b struct {
			Type     string `json:"type"`
			Code     string `json:"code"`
			Position int64  `json:"position"`
			Ahead    int64  `json:"ahead"`
			ETA      int64  `json:"eta_seconds"`
			Ticket   string `json:"ticket"`
		}
		_ = json.Unmarshal(resp.Body(), &b)
		r.typ, r.code, r.position, r.ahead, r.eta = b.Type, b.Code, b.Position, b.Ahead, b.ETA
		if b.Ticket != "" && b.Ticket != r.ticket {
			t.Errorf("ticket in the body %q differs from Room-Ticket %q", b.Ticket, r.ticket)
		}
	}
	return r
}

func purchasePath(id int64) string {
	return "/api/v1/activities/" + strconv.FormatInt(id, 10) + "/purchase"
}

// politeClient asks once, then polls as Retry-After tells, keeping its
// ticket (the one it holds, if any, first), alternating between the proxies, until its purchase is answered
// by the shop (202, 409) or the room says sold out; it returns every reply.
// A 503 (a Redis call of the room timed out under the test's burst) is
// retried as told too.
func politeClient(t *testing.T, cs []*fasthttp.HostClient, ip string, first int, ticket string) []roomReply {
	var out []roomReply
	for i := first; ; i++ {
		r := roomAsk(t, cs[i%len(cs)], "POST", purchasePath(roomAct), ip, ticket)
		out = append(out, r)
		if r.ticket != "" {
			ticket = r.ticket
		}
		switch r.status {
		case 429, 503:
			time.Sleep(time.Duration(max(r.retryAfter, 1)) * time.Second)
			continue
		}
		return out
	}
}

func clientIP(i int) string {
	return "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
}

func chaos() bool { return os.Getenv("SECKILL_CHAOS") == "1" }
