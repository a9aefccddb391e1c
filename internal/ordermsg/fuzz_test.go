package ordermsg

import (
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
