package edge

import (
	"bytes"
	"html"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/proxy/internal/room"
	"github.com/seckill/seckill/proxy/internal/soldout"
)

// The waiting room's HTTP side: which requests it sees, the identity it
// keys places by, and its answers (docs/waiting-room.md). The line itself
// is package room's.

var (
	// hdrRoomTicket carries an API client's ticket both ways.
	hdrRoomTicket = []byte("Room-Ticket")
	ctHTML        = []byte("text/html; charset=utf-8")
	noStore       = []byte("no-store")
)

// enterRoom runs the waiting room of the request's rule, if it has one. ok
// is false when the room answered; otherwise res says what to add to the
// upstream's answer (afterRoom).
func (h *Handler) enterRoom(ctx *fasthttp.RequestCtx, method, path []byte, verified bool, now time.Time) (res room.Result, ok bool) {
	if h.Rooms == nil || !h.Rooms.Applies(method, path) {
		return room.Result{}, true
	}
	rh := &ctx.Request.Header
	// One place per identity: the verified user where the JWT identity
	// vouches for one, else the client's address (as its per-IP window).
	var id string
	if user := rh.PeekCanonical(hdrUserID); verified && len(user) > 0 {
		id = "u:" + string(user)
	} else {
		id = "a:" + string(h.clientKey(ctx, nil))
	}
	soldID, purchase := soldout.PurchaseID(method, path)
	q := room.Request{Method: method, Path: path, Identity: id, Ticket: rh.PeekBytes(hdrRoomTicket),
		Cookies: rh.PeekAll(fasthttp.HeaderCookie), Purchase: purchase, Now: now}
	if purchase {
		user, key := rh.PeekBytes(hdrUserID), rh.PeekBytes(hdrIdempotencyKey)
		q.MayReplay = func() bool {
			return len(key) > 0 && (h.SoldOut == nil || h.SoldOut.MayHold(soldID, now, user, key))
		}
	}
	res = h.Rooms.Enter(q)
	switch res.Answer {
	case room.Pass, room.Admitted:
		return res, true
	}
	roomAnswer(ctx, &res)
	return res, false
}

// afterRoom hands an admitted client its admission ticket with the
// upstream's answer, and ends its admission when a purchase was answered
// 202 or 409 (it is done: its slot goes to the next in line).
func (h *Handler) afterRoom(ctx *fasthttp.RequestCtx, res *room.Result) {
	if res.Answer != room.Admitted {
		return
	}
	if res.Ticket != "" {
		setTicket(ctx, res)
	}
	if st := ctx.Response.StatusCode(); res.Purchase && (st == fasthttp.StatusAccepted || st == fasthttp.StatusConflict) {
		h.Rooms.Finish(res.Room, res.Identity, st == fasthttp.StatusAccepted)
	}
}

func setTicket(ctx *fasthttp.RequestCtx, res *room.Result) {
	ctx.Response.Header.SetBytesK(hdrRoomTicket, res.Ticket)
	if res.Kept {
		return // the cookie the client holds is this ticket
	}
	c := fasthttp.AcquireCookie()
	defer fasthttp.ReleaseCookie(c)
	c.SetKey(res.Cookie)
	c.SetValue(res.Ticket)
	c.SetPath("/")
	c.SetHTTPOnly(true)
	c.SetSecure(res.Secure)
	c.SetSameSite(fasthttp.CookieSameSiteLaxMode)
	c.SetMaxAge(int(res.MaxAge))
	ctx.Response.Header.SetCookie(c)
}

func wantsHTML(ctx *fasthttp.RequestCtx) bool {
	return bytes.Contains(ctx.Request.Header.Peek(fasthttp.HeaderAccept), []byte("text/html"))
}

// roomAnswer writes the room's own answer: problem+json with the position
// as extension members, or a small HTML page for a browser.
func roomAnswer(ctx *fasthttp.RequestCtx, res *room.Result) {
	var status int
	var typ, title, detail string
	switch res.Answer {
	case room.Waiting:
		status, typ, title = fasthttp.StatusTooManyRequests, "waiting-room", "You are in the waiting room"
		detail = "you keep your place in line; ask again after Retry-After with your ticket"
	case room.PreQueue:
		status, typ, title = fasthttp.StatusTooManyRequests, "waiting-room", "The sale has not opened yet"
		detail = "everyone who arrives before the opening is put in a random order at the opening"
	case room.SoldOut:
		status, typ, title = fasthttp.StatusConflict, "sold_out", "Sold out"
		detail = "no unit is left for the people in line"
	default:
		status, typ, title = fasthttp.StatusServiceUnavailable, "room-unavailable", "Waiting room unavailable"
		detail = "the waiting room cannot reach its store; retry later"
	}
	rh := &ctx.Response.Header
	rh.SetCanonical([]byte(fasthttp.HeaderCacheControl), noStore)
	if res.RetryAfter > 0 {
		rh.Set(fasthttp.HeaderRetryAfter, strconv.FormatInt(res.RetryAfter, 10))
	}
	if res.Ticket != "" {
		setTicket(ctx, res)
	}
	eta := int64(0)
	if res.ETA > 0 {
		eta = int64((res.ETA + time.Second - 1) / time.Second)
	}
	if wantsHTML(ctx) {
		// A page to show: 200 while waiting (browsers and caches treat it
		// as content), the problem's status otherwise.
		if res.Answer == room.Waiting || res.Answer == room.PreQueue {
			status = fasthttp.StatusOK
		}
		ctx.SetStatusCode(status)
		rh.SetContentTypeBytes(ctHTML)
		ctx.SetBody(roomPage(res, title, detail, eta))
		return
	}
	// Built in a pooled buffer: SetBody copies it (a poll is the hot path
	// of a crowd in line).
	bp := roomBufs.Get().(*[]byte)
	defer roomBufs.Put(bp)
	ext := appendProblemHead((*bp)[:0], status, typ, title, detail)
	ext = append(ext, `,"room":`...)
	ext = strconv.AppendQuote(ext, res.Room.Name)
	if res.Answer != room.Unavailable {
		if res.Place > 0 {
			ext = append(ext, `,"position":`...)
			ext = strconv.AppendInt(ext, res.Place, 10)
			ext = append(ext, `,"ahead":`...)
			ext = strconv.AppendInt(ext, res.Ahead, 10)
		}
		if res.Answer != room.SoldOut {
			ext = append(ext, `,"eta_seconds":`...)
			ext = strconv.AppendInt(ext, eta, 10)
		}
	}
	if res.Ticket != "" {
		ext = append(ext, `,"ticket":`...)
		ext = strconv.AppendQuote(ext, res.Ticket)
	}
	ext = append(ext, '}')
	*bp = ext
	ctx.Response.ResetBody()
	ctx.SetStatusCode(status)
	rh.SetContentTypeBytes(ctProblem)
	ctx.SetBody(ext)
}

var roomBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// roomPage is the waiting page: no script, no external asset; it reloads
// itself after Retry-After (the cookie carries the ticket).
func roomPage(res *room.Result, title, detail string, eta int64) []byte {
	b := make([]byte, 0, 1024)
	b = append(b, `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">`...)
	if res.RetryAfter > 0 {
		b = append(b, `<meta http-equiv="refresh" content="`...)
		b = strconv.AppendInt(b, res.RetryAfter, 10)
		b = append(b, `">`...)
	}
	b = append(b, `<title>`...)
	b = append(b, html.EscapeString(title)...)
	b = append(b, `</title><style>body{font-family:system-ui,sans-serif;max-width:32em;margin:4em auto;padding:0 1em;color:#222}`+
		`.n{font-size:3em;font-weight:700}dt{color:#666}dd{margin:0 0 1em}</style></head><body><h1>`...)
	b = append(b, html.EscapeString(title)...)
	b = append(b, `</h1><p>`...)
	b = append(b, html.EscapeString(detail)...)
	b = append(b, `</p><dl>`...)
	if res.Place > 0 {
		b = append(b, `<dt>Your place</dt><dd class="n" id="position">`...)
		b = strconv.AppendInt(b, res.Place, 10)
		b = append(b, `</dd><dt>People ahead of you</dt><dd class="n" id="ahead">`...)
		b = strconv.AppendInt(b, res.Ahead, 10)
		b = append(b, `</dd>`...)
	}
	if res.Answer == room.Waiting || res.Answer == room.PreQueue {
		b = append(b, `<dt>Estimated wait</dt><dd id="eta">`...)
		b = appendWait(b, eta)
		b = append(b, `</dd>`...)
	}
	b = append(b, `</dl><p><small>This page refreshes by itself; keep it open to keep your place.</small></p></body></html>`...)
	return b
}

func appendWait(b []byte, s int64) []byte {
	switch {
	case s < 60:
		b = strconv.AppendInt(b, max(s, 1), 10)
		return append(b, " s"...)
	case s < 3600:
		b = strconv.AppendInt(b, (s+59)/60, 10)
		return append(b, " min"...)
	}
	b = strconv.AppendInt(b, s/3600, 10)
	b = append(b, " h "...)
	b = strconv.AppendInt(b, (s%3600+59)/60, 10)
	return append(b, " min"...)
}
