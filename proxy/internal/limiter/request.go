package limiter

import "bytes"

// Header is what a keyed window reads of a request: *fasthttp.RequestHeader
// has both methods.
type Header interface {
	PeekBytes(name []byte) []byte
	CookieBytes(name []byte) []byte
}

// Request is what the limiter needs of a request.
type Request struct {
	Method, Path []byte
	Addr         []byte // the client address key (identity)
	Header       Header // nil: keyed windows count by address
	// A keyed window counts by its header or cookie only when someone
	// vouches for the value — otherwise a client would make up a new one
	// per request — and by Addr else: Trusted, the peer is a trusted proxy
	// (it vouches for what it forwards); or Verified covers the window.
	Trusted  bool
	Verified *Verified
	// Token is the value verified in the header or cookie that carried it
	// (Verified.Carrier): a window on that header or cookie counts by it,
	// not by the raw value, of which many spellings verify alike ("bearer
	// t", "Bearer  t") and which, for a cookie, may name another of several
	// lines than the one verified. Empty: the window counts by Addr.
	Token []byte
}

// Verified names the headers and cookies whose values the proxy itself
// verified on a request: the X-User-ID it set from a valid JWT, and the
// header or cookie that carried that token (Carrier). Built once per
// identity configuration; nil: nothing verified.
type Verified struct {
	Headers [][]byte // any case
	Cookies [][]byte
	// Carrier: where the token was read, FromHeader or FromCookie, and its
	// name; a window on it counts by Request.Token.
	Carrier     Source
	CarrierName []byte
}

// carries reports whether w reads the header or cookie that carried the
// verified token.
func (v *Verified) carries(w *Window) bool {
	if v == nil || w.Source != v.Carrier || v.Carrier == FromAddress {
		return false
	}
	if w.Source == FromCookie {
		return bytes.Equal(w.Name, v.CarrierName)
	}
	return bytes.EqualFold(w.Name, v.CarrierName)
}

// covers reports whether w reads a value v vouches for.
func (v *Verified) covers(w *Window) bool {
	if v == nil {
		return false
	}
	if w.Source == FromCookie {
		for _, n := range v.Cookies {
			if bytes.Equal(n, w.Name) {
				return true
			}
		}
		return false
	}
	for _, n := range v.Headers {
		if bytes.EqualFold(n, w.Name) {
			return true
		}
	}
	return false
}
