package ordermsg

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecode: a worker decodes whatever arrives on the queue. Decode never
// panics, anything it accepts is valid, and it survives an Encode round trip
// unchanged (what the sweeper re-publishes is what the worker reads).
func FuzzDecode(f *testing.F) {
	o := Order{V: Version, OrderID: NewOrderID(42), ActivityID: 42, UserID: "alice", Quantity: 1,
		IdempotencyKey: "k", ReservedAt: 1700000000000, Deadline: 1700000030000}
	good, _ := o.Encode()
	for _, s := range []string{string(good), `{"v":1,"order_id":`, `{}`, `null`, `[]`,
		`{"v":1,"order_id":"x","activity_id":42,"user_id":"u","quantity":0}`,
		`{"v":1,"order_id":"42-a","activity_id":42,"user_id":"u\n","quantity":1,"extra":1}`,
		`{"v":1,"order_id":"` + NewShardOrderID(42, 7, 8) + `","activity_id":42,"user_id":"u","quantity":1}`,
		`{"v":1,"order_id":"42.0.8-` + NewOrderID(42)[3:] + `","activity_id":42,"user_id":"u","quantity":1}`,
		`{"v":1,"order_id":"42.64.65-` + NewOrderID(42)[3:] + `","activity_id":42,"user_id":"u","quantity":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := Decode(body)
		if err != nil {
			return
		}
		if err := o.Validate(); err != nil {
			t.Fatalf("Decode accepted an invalid order %+v: %v", o, err)
		}
		b, err := o.Encode()
		if err != nil {
			t.Fatalf("encode %+v: %v", o, err)
		}
		back, err := Decode(b)
		if err != nil || !reflect.DeepEqual(back, o) {
			t.Fatalf("round trip of %+v: %+v, %v", o, back, err)
		}
	})
}

// FuzzDecodeMessage: the same for a message of either version. Every part
// is a valid order or carries its error and its own body; the valid orders
// are of one activity; the one-pass decode agrees with the element-by-element
// one; and the valid orders survive a Batch round trip unchanged.
func FuzzDecodeMessage(f *testing.F) {
	o := Order{V: Version, OrderID: NewOrderID(42), ActivityID: 42, UserID: "alice", Quantity: 1,
		IdempotencyKey: "k", ReservedAt: 1700000000000, Deadline: 1700000030000}
	one, _ := o.Encode()
	p := o
	p.OrderID, p.UserID = NewOrderID(42), "bob"
	two, _ := Batch{Orders: []Order{o, p}}.Encode()
	other := o
	other.ActivityID, other.OrderID = 7, NewOrderID(7)
	mixed, _ := Batch{Orders: []Order{o, other}}.Encode()
	for _, s := range []string{string(one), string(two), string(mixed), `{"v":2}`, `{"v":2,"orders":[]}`,
		`{"v":2,"orders":null}`, `{"v":2,"orders":[null]}`, `{"v":2,"orders":[` + string(one) + `,{"v":1}]}`,
		`{"v":2,"orders":[` + string(one) + `],"x":1}`, `{"v":2,"orders":[1,"a",[]]}`, `{"v":3,"orders":[]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		parts, err := DecodeMessage(body)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if len(parts) == 0 || len(parts) > MaxBatch {
			t.Fatalf("%d parts", len(parts))
		}
		var valid []Order
		for i, p := range parts {
			if p.Err != nil {
				if !errors.Is(p.Err, ErrInvalid) || p.Body == nil {
					t.Fatalf("part %d: error %v, body %q", i, p.Err, p.Body)
				}
				if _, err := Decode(p.Body); err == nil {
					t.Fatalf("part %d refused (%v) but its body decodes alone", i, p.Err)
				}
				continue
			}
			if err := p.Order.Validate(); err != nil {
				t.Fatalf("part %d accepted invalid: %v", i, err)
			}
			if len(valid) > 0 && valid[0].ActivityID != p.Order.ActivityID {
				t.Fatalf("orders of activities %d and %d accepted", valid[0].ActivityID, p.Order.ActivityID)
			}
			valid = append(valid, p.Order)
		}
		if len(parts) > 1 || bytes.Contains(body, []byte("orders")) {
			if each, err := splitEach(body); err == nil && !reflect.DeepEqual(verdicts(each), verdicts(parts)) {
				t.Fatalf("one pass %v, element by element %v", verdicts(parts), verdicts(each))
			}
		}
		if len(valid) == 0 {
			return
		}
		b, err := Batch{Orders: valid}.Encode()
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		back, err := DecodeMessage(b)
		if err != nil || len(back) != len(valid) {
			t.Fatalf("round trip: %d parts, %v", len(back), err)
		}
		for i, p := range back {
			if p.Err != nil || !reflect.DeepEqual(p.Order, valid[i]) {
				t.Fatalf("round trip of %+v: %+v", valid[i], p)
			}
		}
	})
}

// verdicts lists each part's order, or nil where it is invalid.
func verdicts(parts []Part) []*Order {
	out := make([]*Order, len(parts))
	for i := range parts {
		if parts[i].Err == nil {
			out[i] = &parts[i].Order
		}
	}
	return out
}
