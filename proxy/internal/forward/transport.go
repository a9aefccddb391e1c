package forward

import (
	"bufio"
	"errors"
	"io"
	"time"

	"github.com/valyala/fasthttp"
)

// transport is the pool's fasthttp.RoundTripper: fasthttp's own exchange
// (DefaultTransport: the request written by fasthttp, the response header
// and body read and framed by fasthttp) but for one choice. A response whose
// Content-Length is at most bufferUpTo is read whole, and its connection goes
// back to the pool, before RoundTrip returns; DefaultTransport with
// StreamResponseBody gives every response a stream (four allocations, a
// mutex and a sync.Once, and a copy through them into the body buffer) even
// when the edge reads it whole at once, as it does for small ones. A larger
// response, or one of unknown length, streams as before: fasthttp's body
// reader behind a stream that hands the connection back when it is closed,
// reused only when the body was read to its end.
//
// It supports what the pool uses of fasthttp.HostClient: no MaxConnDuration,
// no MaxResponseBodySize beyond fasthttp's own, one goroutine reading and
// closing a streamed body (the server that writes it out).
type transport struct{ bufferUpTo int }

// maxInterim bounds the 1xx answers before the final one (fasthttp's bound).
const maxInterim = 100

var errTooManyInterim = errors.New("forward: too many interim (1xx) responses")

func (t *transport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (retry bool, err error) {
	// As DefaultTransport: the request's timeout (DoTimeout's, what is left
	// of it) bounds the write, the response and a streamed body.
	var deadline time.Time
	if d := req.GetTimeOut(); d > 0 {
		deadline = time.Now().Add(d)
	}
	cc, err := hc.AcquireConn(req.GetTimeOut(), req.ConnectionClose())
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	resp.ParseNetConn(conn)

	if err := conn.SetWriteDeadline(nearer(deadline, hc.WriteTimeout)); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	bw := hc.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	hc.ReleaseWriter(bw)
	// Any timeout is ErrTimeout, as in DefaultTransport.
	if x, ok := err.(interface{ Timeout() bool }); ok && x.Timeout() {
		err = fasthttp.ErrTimeout
	}
	if err != nil {
		hc.CloseConn(cc)
		return true, err
	}

	if err := conn.SetReadDeadline(nearer(deadline, hc.ReadTimeout)); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	if req.Header.IsHead() {
		resp.SkipBody = true
	}
	if hc.DisableHeaderNamesNormalizing {
		resp.Header.DisableNormalizing()
	}
	br := hc.AcquireReader(conn)
	if err := readHeader(resp, br); err != nil {
		hc.ReleaseReader(br)
		hc.CloseConn(cc)
		return true, err
	}
	closeConn := req.ConnectionClose() || resp.ConnectionClose()
	n := resp.Header.ContentLength()
	if skipBody(resp) || (n >= 0 && n <= t.bufferUpTo) {
		if !skipBody(resp) {
			resp.StreamBody = false
			if err := resp.ReadBody(br, hc.MaxResponseBodySize); err != nil {
				hc.ReleaseReader(br)
				hc.CloseConn(cc)
				return err != fasthttp.ErrBodyTooLarge, err
			}
		}
		hc.ReleaseReader(br)
		if closeConn {
			hc.CloseConn(cc)
		} else {
			hc.ReleaseConn(cc)
		}
		return false, nil
	}

	// Streamed: fasthttp's body reader (Content-Length, chunked, or until
	// the upstream closes), in a response of its own, behind a stream that
	// owns the connection until it is closed.
	body := fasthttp.AcquireResponse()
	resp.Header.CopyTo(&body.Header)
	body.StreamBody = true
	if err := body.ReadBody(br, 0); err != nil {
		fasthttp.ReleaseResponse(body)
		hc.ReleaseReader(br)
		hc.CloseConn(cc)
		return true, err
	}
	release := func(reuse bool) {
		hc.ReleaseReader(br)
		if reuse {
			hc.ReleaseConn(cc)
		} else {
			hc.CloseConn(cc)
		}
	}
	resp.SetBodyStream(&stream{body: body, release: release, reuse: !closeConn && n != -2}, n)
	return false, nil
}

// readHeader reads the final response header, past any interim 1xx
// answers (101 Switching Protocols is final), as Response.ReadLimitBody.
func readHeader(resp *fasthttp.Response, br *bufio.Reader) error {
	if err := resp.Header.Read(br); err != nil {
		return err
	}
	for n := 0; ; n++ {
		if c := resp.Header.StatusCode(); c < 100 || c > 199 || c == fasthttp.StatusSwitchingProtocols {
			return nil
		}
		if n >= maxInterim {
			return errTooManyInterim
		}
		if err := resp.Header.Read(br); err != nil {
			return err
		}
	}
}

// skipBody: the response has no body (HEAD, 1xx, 204, 304), as fasthttp's
// Response.mustSkipBody.
func skipBody(resp *fasthttp.Response) bool {
	c := resp.Header.StatusCode()
	return resp.SkipBody || (c >= 100 && c < 200) || c == fasthttp.StatusNoContent || c == fasthttp.StatusNotModified
}

// nearer is deadline, or now + timeout when that comes first (a client
// timeout; zero: none), as DefaultTransport computes it.
func nearer(deadline time.Time, timeout time.Duration) time.Time {
	if timeout > 0 {
		if t := time.Now().Add(timeout); deadline.IsZero() || t.Before(deadline) {
			return t
		}
	}
	return deadline
}

// stream is a streamed response body. Whoever writes the response out
// (fasthttp's server) reads it and closes it, in one goroutine: the
// connection goes back to the pool when the body was read to its end, and
// is closed otherwise (a close before the end, a read error, a write error
// towards the client).
type stream struct {
	body *fasthttp.Response // its body stream is fasthttp's reader of the connection
	// release hands the reader back, and the connection to the pool (true)
	// or closes it.
	release func(reuse bool)
	reuse   bool // the connection may serve another exchange once the body ended
	ended   bool // the body was read to its end
	failed  bool
	closed  bool
}

func (s *stream) Read(p []byte) (int, error) {
	if s.closed {
		return 0, io.ErrClosedPipe
	}
	n, err := s.body.BodyStream().Read(p)
	switch {
	case err == io.EOF:
		s.ended = true
	case err != nil:
		s.failed = true
	}
	return n, err
}

// CloseWithError is fasthttp.ReadCloserWithError: the server calls it once
// the response is written (err: why writing it stopped).
func (s *stream) CloseWithError(err error) error {
	if s.closed {
		return nil
	}
	s.closed = true
	reuse := s.reuse && s.ended && !s.failed && err == nil
	_ = s.body.CloseBodyStream()
	fasthttp.ReleaseResponse(s.body)
	s.release(reuse)
	return nil
}
