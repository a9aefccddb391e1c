// Package api is the backend's HTTP edge (fasthttp + fasthttp/router): it
// validates input, calls package sale, and maps results and errors to the
// contract in docs/contract.md. Every error body is JSON with a stable code.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/fasthttp/router"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/internal/connlimit"
	"github.com/seckill/seckill/internal/metrics"
	"github.com/seckill/seckill/internal/ordermsg"
)

// Error codes of the contract.
const (
	CodeBadRequest       = "bad_request"
	CodeBodyTooLarge     = "body_too_large"
	CodeHeaderTooLarge   = "header_too_large"
	CodeTimeout          = "request_timeout"
	CodeSoldOut          = "sold_out"
	CodeInsufficient     = "insufficient_stock"
	CodeLimitExceeded    = "limit_exceeded"
	CodeNotStarted       = "not_started"
	CodeEnded            = "ended"
	CodeActivityNotFound = "activity_not_found"
	CodeOrderNotFound    = "order_not_found"
	CodeUnauthorized     = "unauthorized"
	CodeConflict         = "stock_conflict"
	CodeUnavailable      = "unavailable"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeInternal         = "internal"
)

// Service is what the handlers need of package sale.
type Service interface {
	Purchase(ctx context.Context, r sale.PurchaseRequest) (sale.PurchaseResult, error)
	Order(ctx context.Context, orderID string) (sale.OrderView, error)
	WaitOrder(ctx context.Context, orderID string, wait time.Duration) (sale.OrderView, error)
	Activity(ctx context.Context, id int64) (sale.ActivityView, error)
	PutActivity(ctx context.Context, id int64, s sale.Spec) (sale.ActivityView, bool, error)
}

// Check is one readiness probe. An Optional check is reported in /readyz's
// body but does not fail it.
type Check struct {
	Name     string
	Fn       func(ctx context.Context) error
	Optional bool
	// Detail, when set, says which instance of the dependency is in use
	// (the broker node), in /readyz's "details".
	Detail func() string
}

// Config of the HTTP edge.
type Config struct {
	AdminToken string // "" disables the admin API
	// AdminFailLimit failed authentications per source and AdminFailWindow
	// (defaults 10 per minute).
	AdminFailLimit  int
	AdminFailWindow time.Duration
	MaxBodyBytes    int
	AdminBodyBytes  int
	RetryAfter      time.Duration
	CheckTimeout    time.Duration
	ReadTimeout     time.Duration
	WriteTimeout    time.Duration
	IdleTimeout     time.Duration
	// StateTTL is how long a sale state may be cached (the service's own
	// cache TTL): the freshness the answer announces.
	StateTTL time.Duration
	// MaxConns bounds the connections served at once (Listener);
	// 0: fasthttp's default bound.
	MaxConns int
}

// API holds the handlers.
type API struct {
	svc        Service
	cfg        Config
	log        *slog.Logger
	checks     []Check
	gatherer   prometheus.Gatherer
	m          *Metrics
	retryAfter string
	admin      *adminAuth
	// base is the parent of every call's context: the request's own context is
	// never kept past the handler, and is only cancelled at shutdown anyway.
	base context.Context
}

// New returns the HTTP edge. m may be nil.
func New(svc Service, cfg Config, checks []Check, g prometheus.Gatherer, log *slog.Logger, m *Metrics) *API {
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = time.Second
	}
	secs := int(math.Ceil(cfg.RetryAfter.Seconds()))
	if secs < 1 {
		secs = 1
	}
	return &API{
		svc: svc, cfg: cfg, log: log, checks: checks, gatherer: g, m: m,
		retryAfter: strconv.Itoa(secs),
		admin:      newAdminAuth(cfg.AdminToken, cfg.AdminFailLimit, cfg.AdminFailWindow, log, m),
		base:       context.Background(),
	}
}

// Handler routes every endpoint.
func (a *API) Handler() fasthttp.RequestHandler {
	r := router.New()
	r.RedirectTrailingSlash = false
	r.RedirectFixedPath = false
	r.POST("/api/v1/activities/{id}/purchase", a.instrument("purchase", a.purchase))
	r.GET("/api/v1/activities/{id}", a.instrument("activity", a.activity))
	r.GET("/api/v1/orders/{order_id}", a.instrument("order", a.order))
	if a.cfg.AdminToken != "" {
		r.PUT("/admin/v1/activities/{id}", a.instrument("admin_put", a.putActivity))
	}
	r.GET("/healthz", a.instrument("healthz", a.healthz))
	r.GET("/readyz", a.instrument("readyz", a.readyz))
	if a.gatherer != nil {
		r.GET("/metrics", metrics.Handler(a.gatherer))
	}
	r.NotFound = a.instrument("not_found", func(ctx *fasthttp.RequestCtx) {
		writeError(ctx, fasthttp.StatusNotFound, CodeNotFound, "no such endpoint")
	})
	r.MethodNotAllowed = a.instrument("method_not_allowed", func(ctx *fasthttp.RequestCtx) {
		writeError(ctx, fasthttp.StatusMethodNotAllowed, CodeMethodNotAllowed, "method not allowed here")
	})
	r.PanicHandler = func(ctx *fasthttp.RequestCtx, v any) {
		a.log.Error("handler panic", "path", string(ctx.Path()), "panic", v)
		ctx.ResetBody()
		writeError(ctx, fasthttp.StatusInternalServerError, CodeInternal, "internal error")
	}
	return r.Handler
}

// Server returns a fasthttp server for the API: per-path body limits, and
// JSON errors also for what fasthttp itself refuses.
func (a *API) Server() *fasthttp.Server {
	maxBody := max(a.cfg.MaxBodyBytes, a.cfg.AdminBodyBytes)
	return &fasthttp.Server{
		Handler:                      a.Handler(),
		Name:                         "seckill-backend",
		ReadTimeout:                  a.cfg.ReadTimeout,
		WriteTimeout:                 a.cfg.WriteTimeout,
		IdleTimeout:                  a.cfg.IdleTimeout,
		MaxRequestBodySize:           maxBody,
		DisablePreParseMultipartForm: true,
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			if strings.HasPrefix(string(h.RequestURI()), "/admin/") {
				return fasthttp.RequestConfig{MaxRequestBodySize: a.cfg.AdminBodyBytes}
			}
			return fasthttp.RequestConfig{MaxRequestBodySize: a.cfg.MaxBodyBytes}
		},
		ErrorHandler: a.serverError,
		Logger:       slogPrintf{a.log},
		// Listener bounds connections first, with the API's answer.
		Concurrency: 2 * a.maxConns(),
	}
}

// Listener wraps ln with the connection bound (Config.MaxConns): beyond it
// a connection gets the API's 503 unavailable with Retry-After, not
// fasthttp's text/plain answer, and is closed.
func (a *API) Listener(ln net.Listener) net.Listener {
	body, _ := json.Marshal(errorBody{Code: CodeUnavailable, Message: "too many connections; retry later"})
	secs, _ := strconv.Atoi(a.retryAfter)
	return connlimit.Listen(ln, connlimit.Config{Max: a.maxConns(), Busy: connlimit.Answer{
		Status: fasthttp.StatusServiceUnavailable, ContentType: "application/json", Body: body, RetryAfter: secs}})
}

func (a *API) maxConns() int {
	if a.cfg.MaxConns > 0 {
		return a.cfg.MaxConns
	}
	return fasthttp.DefaultConcurrency
}

type slogPrintf struct{ log *slog.Logger }

// Printf logs at debug level: fasthttp reports client faults (oversized or
// malformed requests) here, which must not flood the log under attack.
func (l slogPrintf) Printf(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }

// serverError answers what fasthttp refused before any handler ran.
func (a *API) serverError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, CodeBodyTooLarge, "request body too large")
	case errors.As(err, &small):
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, CodeHeaderTooLarge, "request header too large")
	case isTimeout(err):
		writeError(ctx, fasthttp.StatusRequestTimeout, CodeTimeout, "request not received in time")
	default:
		writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, "malformed HTTP request")
	}
	a.m.request("server_error", ctx.Response.StatusCode(), 0)
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

func (a *API) instrument(route string, h fasthttp.RequestHandler) fasthttp.RequestHandler {
	if a.m == nil {
		return h
	}
	return func(ctx *fasthttp.RequestCtx) {
		start := time.Now()
		h(ctx)
		a.m.request(route, ctx.Response.StatusCode(), time.Since(start))
	}
}

func (a *API) purchase(ctx *fasthttp.RequestCtx) {
	id, ok := parseID(userValue(ctx, "id"))
	if !ok {
		writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, "activity id must be a positive 64-bit integer")
		return
	}
	body := ctx.PostBody()
	if len(body) > a.cfg.MaxBodyBytes {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, CodeBodyTooLarge, "request body too large")
		return
	}
	user := ctx.Request.Header.Peek("X-User-ID")
	if len(user) == 0 {
		writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, "X-User-ID header is required")
		return
	}
	req := sale.PurchaseRequest{ActivityID: id, UserID: string(user)}
	if !ordermsg.ValidUserID(req.UserID) {
		writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, "X-User-ID must be 1-64 of [A-Za-z0-9_.-]")
		return
	}
	if key := ctx.Request.Header.Peek("Idempotency-Key"); len(key) > 0 {
		req.IdempotencyKey = string(key)
		if !ordermsg.ValidIdempotencyKey(req.IdempotencyKey) {
			writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, "Idempotency-Key must be 1-128 printable ASCII characters")
			return
		}
	}
	q, err := parseQuantity(body)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	req.Quantity = q
	res, err := a.svc.Purchase(a.base, req)
	if err != nil {
		a.serviceError(ctx, err)
		return
	}
	a.writeOutcome(ctx, res)
}

func (a *API) activity(ctx *fasthttp.RequestCtx) {
	id, ok := parseID(userValue(ctx, "id"))
	if !ok {
		writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, "activity id must be a positive 64-bit integer")
		return
	}
	v, err := a.svc.Activity(a.base, id)
	if err != nil {
		a.serviceError(ctx, err)
		return
	}
	setFreshness(&ctx.Response.Header, v, a.cfg.StateTTL, time.Now())
	writeJSON(ctx, fasthttp.StatusOK, v)
}

// setFreshness tells caches how old the state is and how long it may be
// kept: Age and Cache-Control max-age, in whole seconds as HTTP wants them
// (a sub-second TTL announces max-age=0: downstream caches with their own
// sub-second TTL, such as the proxy's, use as_of in the body). A stale
// answer (Redis and MySQL not readable) must not be kept.
func setFreshness(h *fasthttp.ResponseHeader, v sale.ActivityView, ttl time.Duration, now time.Time) {
	age := max(now.Sub(v.AsOf), 0)
	var buf [32]byte
	h.Set(fasthttp.HeaderAge, string(strconv.AppendInt(buf[:0], int64(age/time.Second), 10)))
	if v.Stale || ttl <= 0 {
		h.Set(fasthttp.HeaderCacheControl, "no-cache")
		return
	}
	left := max(ttl-age, 0)
	h.Set(fasthttp.HeaderCacheControl, string(strconv.AppendInt(append(buf[:0], "max-age="...), int64(left/time.Second), 10)))
}

func (a *API) order(ctx *fasthttp.RequestCtx) {
	oid := userValue(ctx, "order_id")
	if len(oid) > 64 {
		writeError(ctx, fasthttp.StatusNotFound, CodeOrderNotFound, "order not found")
		return
	}
	var v sale.OrderView
	var err error
	if wait := ctx.QueryArgs().Peek("wait"); wait != nil {
		d, ok := parseWait(wait)
		if !ok {
			writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, "wait must be a duration such as 5s or 500ms, or whole seconds, at least 0")
			return
		}
		v, err = a.svc.WaitOrder(a.base, oid, d)
	} else {
		v, err = a.svc.Order(a.base, oid)
	}
	if err != nil {
		a.serviceError(ctx, err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, v)
}

func (a *API) putActivity(ctx *fasthttp.RequestCtx) {
	if !a.admin.check(ctx) {
		return
	}
	id, ok := parseID(userValue(ctx, "id"))
	if !ok {
		writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, "activity id must be a positive 64-bit integer")
		return
	}
	body := ctx.PostBody()
	if len(body) > a.cfg.AdminBodyBytes {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, CodeBodyTooLarge, "request body too large")
		return
	}
	sp, err := parseSpec(body)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	v, created, err := a.svc.PutActivity(a.base, id, sale.Spec(sp))
	if err != nil {
		a.serviceError(ctx, err)
		return
	}
	status := fasthttp.StatusOK
	if created {
		status = fasthttp.StatusCreated
	}
	writeJSON(ctx, status, v)
}

// SetAdminToken replaces the admin token (a reload). The admin API's being
// on or off is fixed at start: an empty token here locks it.
func (a *API) SetAdminToken(token string) { a.admin.set(token) }

func (a *API) healthz(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, fasthttp.StatusOK, map[string]string{"status": "ok"})
}

func (a *API) readyz(ctx *fasthttp.RequestCtx) {
	status, details := map[string]string{}, map[string]string{}
	ok := true
	for _, c := range a.checks {
		if c.Detail != nil {
			details[c.Name] = c.Detail()
		}
		cctx, cancel := context.WithTimeout(a.base, a.cfg.CheckTimeout)
		err := c.Fn(cctx)
		cancel()
		if err != nil {
			ok = ok && c.Optional
			status[c.Name] = err.Error()
		} else {
			status[c.Name] = "ok"
		}
	}
	if !ok {
		ctx.Response.Header.Set("Retry-After", a.retryAfter)
		writeJSON(ctx, fasthttp.StatusServiceUnavailable, map[string]any{
			"code": CodeUnavailable, "message": "a dependency is not reachable", "checks": status, "details": details,
		})
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"status": "ok", "checks": status, "details": details})
}

// serviceError answers one of the sale package's errors.
func (a *API) serviceError(ctx *fasthttp.RequestCtx, err error) {
	ans := errorAnswer(err)
	if ans.code == CodeUnavailable {
		if !errors.Is(err, sale.ErrUnavailable) {
			a.log.Error("unexpected service error", "path", string(ctx.Path()), "err", err)
		} else {
			a.log.Debug("unavailable", "path", string(ctx.Path()), "err", err)
		}
	}
	a.write(ctx, ans, sale.PurchaseResult{})
}

func userValue(ctx *fasthttp.RequestCtx, name string) string {
	v, _ := ctx.UserValue(name).(string)
	return v
}

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeError(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	writeJSON(ctx, status, errorBody{Code: code, Message: msg})
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = fasthttp.StatusInternalServerError
		b = []byte(`{"code":"internal","message":"encode response"}`)
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
