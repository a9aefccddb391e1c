// Package ordermsg is the contract between the backend, which publishes an order
// after reserving it, and the workers, which write it to MySQL: the message body
// and the order id format.
package ordermsg

import (
	"bytes"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ContentType of a published order.
const ContentType = "application/json"

// Version of the message body; a worker dead-letters versions it does not know.
const Version = 1

// Order is the body of one order message.
type Order struct {
	V              int    `json:"v"`
	OrderID        string `json:"order_id"`
	ActivityID     int64  `json:"activity_id"`
	UserID         string `json:"user_id"`
	Quantity       int64  `json:"quantity"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// ReservedAt and Deadline are unix milliseconds of Redis's clock.
	ReservedAt int64 `json:"reserved_at"`
	Deadline   int64 `json:"deadline"`
}

// ErrInvalid marks a message that can never be processed (dead-letter it).
var ErrInvalid = errors.New("invalid order message")

var userIDRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// ValidUserID reports whether id is a valid X-User-ID.
func ValidUserID(id string) bool { return userIDRe.MatchString(id) }

// ValidIdempotencyKey reports whether k is 1–128 printable ASCII characters.
func ValidIdempotencyKey(k string) bool {
	if len(k) < 1 || len(k) > 128 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// Encode returns the JSON body of o.
func (o Order) Encode() ([]byte, error) {
	o.V = Version
	return json.Marshal(o)
}

// Decode parses and validates a message body.
func Decode(body []byte) (Order, error) {
	var o Order
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return Order{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := o.Validate(); err != nil {
		return Order{}, err
	}
	return o, nil
}

// Validate checks every field.
func (o Order) Validate() error {
	switch {
	case o.V != Version:
		return fmt.Errorf("%w: version %d, want %d", ErrInvalid, o.V, Version)
	case o.ActivityID <= 0:
		return fmt.Errorf("%w: activity_id %d", ErrInvalid, o.ActivityID)
	case !ValidUserID(o.UserID):
		return fmt.Errorf("%w: user_id %q", ErrInvalid, o.UserID)
	case o.Quantity < 1 || o.Quantity > 1_000_000:
		return fmt.Errorf("%w: quantity %d", ErrInvalid, o.Quantity)
	case o.IdempotencyKey != "" && !ValidIdempotencyKey(o.IdempotencyKey):
		return fmt.Errorf("%w: idempotency_key", ErrInvalid)
	}
	id, err := ActivityOf(o.OrderID)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if id != o.ActivityID {
		return fmt.Errorf("%w: order %s does not belong to activity %d", ErrInvalid, o.OrderID, o.ActivityID)
	}
	return nil
}

var b32 = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewOrderID returns a fresh order id of activity id: "<id>-<26 random chars>".
// The activity id inside lets a lookup find the sale's keys without an index.
func NewOrderID(activityID int64) string { return NewShardOrderID(activityID, 0, 1) }

// MaxShards bounds a sale's stock shards (reservation's layout).
const MaxShards = 64

// NewShardOrderID returns a fresh order id of stock shard shard of a sale
// of shards shards: "<id>-<26 random chars>" for shard 0 (whose keys are the
// unsharded sale's), else "<id>.<shard>.<shards>-<26 random chars>": a
// shard's keys depend on both (reservation.ShardTag), so a lookup finds them
// from the id alone.
func NewShardOrderID(activityID int64, shard, shards int) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	buf := make([]byte, 0, 56)
	buf = strconv.AppendInt(buf, activityID, 10)
	if shard > 0 {
		buf = append(buf, '.')
		buf = strconv.AppendInt(buf, int64(shard), 10)
		buf = append(buf, '.')
		buf = strconv.AppendInt(buf, int64(shards), 10)
	}
	buf = append(buf, '-')
	buf = append(buf, b32.EncodeToString(b[:])...)
	return string(buf)
}

// ActivityOf returns the activity id of an order id, or an error if id is not
// an order id.
func ActivityOf(orderID string) (int64, error) {
	id, _, _, err := Parse(orderID)
	return id, err
}

// ShardOf returns the stock shard an order id names and the sale's shard
// count it names (0 and 0 for the unsharded form: shard 0, whatever the
// count), or an error if id is not an order id.
func ShardOf(orderID string) (shard, shards int, err error) {
	_, shard, shards, err = Parse(orderID)
	return shard, shards, err
}

// Parse returns the activity id, the stock shard and the shard count of an
// order id (see NewShardOrderID).
func Parse(orderID string) (activityID int64, shard, shards int, err error) {
	bad := func() (int64, int, int, error) { return 0, 0, 0, fmt.Errorf("not an order id: %q", orderID) }
	i := strings.IndexByte(orderID, '-')
	if i <= 0 || len(orderID) > 64 || len(orderID)-i-1 != 26 {
		return bad()
	}
	head := orderID[:i]
	if j := strings.IndexByte(head, '.'); j >= 0 {
		ks, ns, ok := strings.Cut(head[j+1:], ".")
		k, ok1 := canonical(ks)
		n, ok2 := canonical(ns)
		if !ok || !ok1 || !ok2 || k < 1 || k >= n || n > MaxShards {
			return bad()
		}
		shard, shards, head = k, n, head[:j]
	}
	id, err := strconv.ParseInt(head, 10, 64)
	if err != nil || id <= 0 || head[0] == '0' || head[0] == '+' {
		return bad()
	}
	for _, c := range orderID[i+1:] {
		if !strings.ContainsRune("0123456789abcdefghjkmnpqrstvwxyz", c) {
			return bad()
		}
	}
	return id, shard, shards, nil
}

// canonical parses a positive decimal without sign or leading zero (one
// order id per order).
func canonical(s string) (int, bool) {
	if s == "" || len(s) > 2 || s[0] < '1' || s[0] > '9' {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// Time converts a message timestamp.
func Time(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// MarkerType is the AMQP type property of a drain marker; orders carry none.
const MarkerType = "seckill.drain-marker"

// Marker is the body of a drain marker: published to the order queue after a
// sale was rebuilt from MySQL because Redis lost it, it reaches a worker only
// after every order queued before it was delivered; the worker that takes it
// ends the sale's recovery (the token names which one) once the orders
// before it in its channel are decided.
type Marker struct {
	ActivityID int64  `json:"activity_id"`
	Token      string `json:"token"`
}

// Encode returns the JSON body of m.
func (m Marker) Encode() ([]byte, error) { return json.Marshal(m) }

// MessageID is the marker's AMQP message id.
func (m Marker) MessageID() string {
	return "drain-" + strconv.FormatInt(m.ActivityID, 10) + "-" + m.Token
}

// DecodeMarker parses and validates a marker body.
func DecodeMarker(body []byte) (Marker, error) {
	var m Marker
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Marker{}, fmt.Errorf("%w: marker: %v", ErrInvalid, err)
	}
	if m.ActivityID <= 0 || m.Token == "" || len(m.Token) > 64 {
		return Marker{}, fmt.Errorf("%w: marker of activity %d, token %q", ErrInvalid, m.ActivityID, m.Token)
	}
	return m, nil
}

// BatchVersion is the body version of a message that carries several orders
// of one activity: the backend's group commit reserves a group of purchases
// in one script call and publishes the accepted ones as one message, answered
// only once the broker confirmed it.
const BatchVersion = 2

// Batch is the body of one message carrying several orders, each an Order
// body of Version as if published alone.
type Batch struct {
	V      int     `json:"v"`
	Orders []Order `json:"orders"`
}

// MaxBatch bounds the orders of one batch message.
const MaxBatch = 1024

// Encode returns the JSON body of b.
func (b Batch) Encode() ([]byte, error) {
	if len(b.Orders) == 0 || len(b.Orders) > MaxBatch {
		return nil, fmt.Errorf("ordermsg: a batch of %d orders, want 1..%d", len(b.Orders), MaxBatch)
	}
	out := Batch{V: BatchVersion, Orders: make([]Order, len(b.Orders))}
	for i, o := range b.Orders {
		o.V = Version
		out.Orders[i] = o
	}
	return json.Marshal(out)
}

// Part is one order of a decoded message: the order, or why it is invalid.
type Part struct {
	// Order is valid when Err is nil.
	Order Order
	// Body is the order's own body when Err is set: in a batch, its element
	// (an Order body of Version, as if published alone), which is what is
	// dead-lettered; for a single-order message, the message body.
	Body []byte
	// Err marks an order that can never be processed (ErrInvalid).
	Err error
}

// DecodeMessage decodes a message body of either version. A Version body is
// one part, or an error as Decode gives it. A BatchVersion body is its
// orders in order, each valid or with its own error; an error is returned
// only when the batch as a whole is unusable: not a batch object, no orders
// or more than MaxBatch, or valid orders of more than one activity (the
// backend publishes a batch per activity, so that is a producer bug, and the
// worker's grouping per activity must not silently split a message).
func DecodeMessage(body []byte) ([]Part, error) {
	parts, err := Split(body)
	if err != nil {
		return nil, err
	}
	var act int64
	for _, p := range parts {
		switch {
		case p.Err != nil:
		case act == 0:
			act = p.Order.ActivityID
		case p.Order.ActivityID != act:
			return nil, fmt.Errorf("%w: batch holds orders of activities %d and %d", ErrInvalid, act, p.Order.ActivityID)
		}
	}
	return parts, nil
}

// Split is DecodeMessage without the one-activity rule: what the dead-letter
// queue's consumer needs to decide every order a refused batch carried.
func Split(body []byte) ([]Part, error) {
	if !isBatch(body) {
		o, err := Decode(body)
		if err != nil {
			return nil, err
		}
		return []Part{{Order: o}}, nil
	}
	// The common case: every order well-formed and valid, decoded in one
	// pass; any error falls back to decoding element by element, so that
	// each order gets its own verdict.
	var b Batch
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if dec.Decode(&b) == nil && b.V == BatchVersion && len(b.Orders) > 0 && len(b.Orders) <= MaxBatch {
		parts := make([]Part, len(b.Orders))
		ok := true
		for i, o := range b.Orders {
			if o.Validate() != nil {
				ok = false
				break
			}
			parts[i].Order = o
		}
		if ok {
			return parts, nil
		}
	}
	return splitEach(body)
}

// The bodies Encode writes begin so; anything else is probed.
var (
	orderPrefix = []byte(`{"v":1,`)
	batchPrefix = []byte(`{"v":2,`)
)

// isBatch reports whether body is of BatchVersion, without parsing it twice
// in the common case.
func isBatch(body []byte) bool {
	switch {
	case bytes.HasPrefix(body, orderPrefix):
		return false
	case bytes.HasPrefix(body, batchPrefix):
		return true
	}
	var probe struct {
		V int `json:"v"`
	}
	return json.Unmarshal(body, &probe) == nil && probe.V == BatchVersion
}

// splitEach decodes a batch element by element.
func splitEach(body []byte) ([]Part, error) {
	var raw struct {
		V      int               `json:"v"`
		Orders []json.RawMessage `json:"orders"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: batch: %v", ErrInvalid, err)
	}
	if raw.V != BatchVersion {
		return nil, fmt.Errorf("%w: batch version %d, want %d", ErrInvalid, raw.V, BatchVersion)
	}
	if len(raw.Orders) == 0 || len(raw.Orders) > MaxBatch {
		return nil, fmt.Errorf("%w: batch of %d orders, want 1..%d", ErrInvalid, len(raw.Orders), MaxBatch)
	}
	parts := make([]Part, len(raw.Orders))
	for i, r := range raw.Orders {
		o, err := Decode(r)
		if err != nil {
			parts[i] = Part{Body: r, Err: fmt.Errorf("order %d of the batch: %w", i, err)}
			continue
		}
		parts[i].Order = o
	}
	return parts, nil
}
