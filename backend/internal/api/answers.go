package api

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/seckill/seckill/backend/internal/sale"
)

// answer is the HTTP form of a purchase outcome or of a service error: the
// one translation of the purchase path's vocabulary (sale.Outcome and sale's
// errors) to status, contract code and Retry-After (docs/contract.md).
type answer struct {
	status int
	code   string // the contract's code; "" for a 202
	// retry: Retry-After is set, the same request may pass later (nothing
	// was kept).
	retry bool
	// detail is the message and the extra fields of the error body; nil:
	// message alone.
	detail  func(sale.PurchaseResult) (string, map[string]any)
	message string
}

// outcomeAnswers has an answer for every sale.Outcome (a test checks).
var outcomeAnswers = map[sale.Outcome]answer{
	sale.Accepted: {status: fasthttp.StatusAccepted},
	sale.SoldOut:  {status: fasthttp.StatusConflict, code: CodeSoldOut, message: "sold out"},
	sale.Insufficient: {status: fasthttp.StatusConflict, code: CodeInsufficient,
		detail: func(r sale.PurchaseResult) (string, map[string]any) {
			return fmt.Sprintf("only %d units left", r.Available), map[string]any{"available": r.Available}
		}},
	sale.LimitExceeded: {status: fasthttp.StatusConflict, code: CodeLimitExceeded,
		detail: func(r sale.PurchaseResult) (string, map[string]any) {
			return fmt.Sprintf("holding %d of %d allowed", r.Held, r.Limit), map[string]any{"held": r.Held, "limit": r.Limit}
		}},
	sale.NotStarted: {status: fasthttp.StatusConflict, code: CodeNotStarted, message: "the sale has not started"},
	sale.Ended:      {status: fasthttp.StatusConflict, code: CodeEnded, message: "the sale has ended"},
	sale.BadQuantity: {status: fasthttp.StatusBadRequest, code: CodeBadRequest,
		detail: func(r sale.PurchaseResult) (string, map[string]any) {
			return fmt.Sprintf("quantity must be between 1 and %d", r.Limit), map[string]any{"limit": r.Limit}
		}},
}

// errorAnswers are the answers of sale's sentinel errors, first match wins;
// any other error is unavailableAnswer. ErrConflict's message is the error's.
var errorAnswers = []struct {
	err error
	answer
}{
	{sale.ErrActivityNotFound, answer{status: fasthttp.StatusNotFound, code: CodeActivityNotFound, message: "activity not found"}},
	{sale.ErrOrderNotFound, answer{status: fasthttp.StatusNotFound, code: CodeOrderNotFound, message: "order not found"}},
	{sale.ErrConflict, answer{status: fasthttp.StatusConflict, code: CodeConflict}},
}

// unavailableAnswer: sale.ErrUnavailable, or an error sale did not expect.
var unavailableAnswer = answer{status: fasthttp.StatusServiceUnavailable, code: CodeUnavailable, retry: true,
	message: "temporarily unavailable; retry later"}

// errorAnswer returns the answer of a service error.
func errorAnswer(err error) answer {
	for _, e := range errorAnswers {
		if errors.Is(err, e.err) {
			if e.message == "" {
				e.message = err.Error()
			}
			return e.answer
		}
	}
	return unavailableAnswer
}

// writeOutcome answers a decided purchase.
func (a *API) writeOutcome(ctx *fasthttp.RequestCtx, res sale.PurchaseResult) {
	ans, ok := outcomeAnswers[res.Outcome]
	switch {
	case !ok:
		writeError(ctx, fasthttp.StatusInternalServerError, CodeInternal, "unexpected outcome")
	case ans.status == fasthttp.StatusAccepted:
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		ctx.SetContentType("application/json")
		var buf [128]byte
		b := append(buf[:0], `{"order_id":`...)
		b = strconv.AppendQuote(b, res.OrderID) // order ids are [0-9a-z-]
		b = append(b, `,"status":`...)
		b = strconv.AppendQuote(b, res.Status)
		b = append(b, '}')
		ctx.SetBody(b)
	default:
		a.write(ctx, ans, res)
	}
}

// write answers with an error body.
func (a *API) write(ctx *fasthttp.RequestCtx, ans answer, res sale.PurchaseResult) {
	if ans.retry {
		ctx.Response.Header.Set("Retry-After", a.retryAfter)
	}
	if ans.detail == nil {
		writeError(ctx, ans.status, ans.code, ans.message)
		return
	}
	msg, body := ans.detail(res)
	body["code"], body["message"] = ans.code, msg
	writeJSON(ctx, ans.status, body)
}
