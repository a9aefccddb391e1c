package limiter

import (
	"errors"
	"time"
)

// Store decides hits against sliding windows: the seam between the rules
// (HTTP requests here, Envoy's descriptors elsewhere) and where the windows
// live. Redis keeps them for every instance; Memory keeps them in this
// process.
type Store interface {
	// Take admits weight hits in every window of ws at one moment, or in
	// none of them, and describes each window in out (len(out) == len(ws)).
	// An error means nothing is known of the decision: ErrShed when the
	// store is too busy to decide in time, any other when it failed.
	Take(ws []Want, weight int, out []Got) (admitted bool, err error)
}

// Want is one window a decision needs.
type Want struct {
	Key    string // the window's log, in the store's namespace
	Limit  int    // at most this many hits ...
	Length time.Duration
}

// Got is what a store says of one window of a decision.
type Got struct {
	// Full: fewer than the weight's free slots; this window refused.
	Full bool
	// Remaining: free slots after the decision; -1 when the store did not
	// look (a cluster decision refused by an earlier hash tag).
	Remaining int
	// Reset: for a full window, until the weight fits (the earliest retry
	// this window can pass); else until its oldest hit slides out.
	Reset time.Duration
	// At is the admission moment in the store's clock (µs): each admitted
	// hit counts in the window's log from then until At + Length.
	At int64
}

// ErrShed: the decision could not be sent to the store within the bound
// (the limiter is overloaded, not the store broken): the request is
// answered 503 with Retry-After, never decided by on_redis_error.
var ErrShed = errors.New("limiter: overloaded, decision shed")
