package edge

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

var (
	hdrContentLength    = []byte("content-length:")
	hdrTransferEncoding = []byte("transfer-encoding:")
)

// ambiguousFraming reports a request that carries both Transfer-Encoding:
// chunked and a Content-Length (request smuggling, RFC 9112 §6.3). fasthttp
// rejects duplicate or malformed Content-Lengths and unknown transfer codings
// itself, but lets chunked silently win over a Content-Length; a front proxy
// must refuse such a request instead, since an upstream or a hop behind it
// may frame it the other way.
// The wire header block is scanned because, once the body is read, fasthttp's
// parsed header no longer tells which framing the client sent.
func ambiguousFraming(h *fasthttp.RequestHeader) bool {
	raw := h.RawHeaders()
	if len(raw) == 0 {
		return false
	}
	var cl, te bool
	for len(raw) > 0 {
		var line []byte
		line, raw, _ = bytes.Cut(raw, []byte("\n"))
		cl = cl || hasPrefixFold(line, hdrContentLength)
		te = te || hasPrefixFold(line, hdrTransferEncoding)
	}
	return cl && te
}

func hasPrefixFold(line, prefix []byte) bool {
	return len(line) >= len(prefix) && bytes.EqualFold(line[:len(prefix)], prefix)
}
