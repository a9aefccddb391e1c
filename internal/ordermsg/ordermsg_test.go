package ordermsg

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func order(activity int64, user string) Order {
	return Order{V: Version, OrderID: NewOrderID(activity), ActivityID: activity, UserID: user, Quantity: 1,
		IdempotencyKey: "k-" + user, ReservedAt: 1700000000000, Deadline: 1700000030000}
}

func TestDecodeMessage(t *testing.T) {
	a, b := order(42, "alice"), order(42, "bob")
	one, _ := a.Encode()
	two, _ := Batch{Orders: []Order{a, b}}.Encode()
	bad := `{"v":1,"order_id":"` + NewOrderID(42) + `","activity_id":42,"user_id":"u u","quantity":1,"reserved_at":0,"deadline":0}`
	aBody, _ := a.Encode()
	bBody, _ := b.Encode()
	poisoned := `{"v":2,"orders":[` + string(aBody) + `,` + bad + `,` + string(bBody) + `]}`
	mixed, _ := Batch{Orders: []Order{a, order(7, "carol")}}.Encode()
	var many strings.Builder
	many.WriteString(`{"v":2,"orders":[`)
	for i := range MaxBatch + 1 {
		if i > 0 {
			many.WriteString(",")
		}
		many.Write(aBody)
	}
	many.WriteString(`]}`)

	for _, c := range []struct {
		name, body string
		want       []*Order // nil entries: refused orders
		err        string   // the whole message refused
	}{
		{"v1", string(one), []*Order{&a}, ""},
		{"v2", string(two), []*Order{&a, &b}, ""},
		{"poison inside", poisoned, []*Order{&a, nil, &b}, ""},
		{"two activities", string(mixed), nil, "activities 42 and 7"},
		{"no orders", `{"v":2,"orders":[]}`, nil, "batch of 0 orders"},
		{"orders missing", `{"v":2}`, nil, "batch of 0 orders"},
		{"too many", many.String(), nil, fmt.Sprintf("batch of %d orders", MaxBatch+1)},
		{"unknown envelope field", `{"v":2,"orders":[` + string(aBody) + `],"x":1}`, nil, `unknown field "x"`},
		{"orders not a list", `{"v":2,"orders":{}}`, nil, "batch:"},
		{"v1 with orders", `{"v":1,"orders":[]}`, nil, `unknown field "orders"`},
		{"v3", `{"v":3}`, nil, "version 3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			parts, err := DecodeMessage([]byte(c.body))
			if c.err != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want ErrInvalid with %q", err, c.err)
				}
				return
			}
			if err != nil || len(parts) != len(c.want) {
				t.Fatalf("%d parts, %v; want %d", len(parts), err, len(c.want))
			}
			for i, w := range c.want {
				p := parts[i]
				switch {
				case w == nil && (!errors.Is(p.Err, ErrInvalid) || string(p.Body) != bad || !strings.Contains(p.Err.Error(), "user_id")):
					t.Errorf("part %d: %v, body %s; want refused with its own body", i, p.Err, p.Body)
				case w != nil && (p.Err != nil || p.Order != *w):
					t.Errorf("part %d: %+v, %v; want %+v", i, p.Order, p.Err, *w)
				}
			}
		})
	}
	// The dead-letter queue's consumer still sees every order of a batch
	// refused for its activities.
	parts, err := Split(mixed)
	if err != nil || len(parts) != 2 || parts[1].Order.ActivityID != 7 {
		t.Fatalf("Split of two activities: %+v, %v", parts, err)
	}
}

func batchOf(n int) ([]Order, [][]byte) {
	orders := make([]Order, n)
	bodies := make([][]byte, n)
	for i := range orders {
		orders[i] = order(42, fmt.Sprintf("user-%d", i))
		bodies[i], _ = orders[i].Encode()
	}
	return orders, bodies
}

// BenchmarkDecodeOne is the baseline: n single-order messages, n decodes.
func BenchmarkDecodeOne(b *testing.B) {
	for _, n := range []int{1, 20, 100} {
		b.Run(fmt.Sprintf("orders=%d", n), func(b *testing.B) {
			_, bodies := batchOf(n)
			b.ReportAllocs()
			for b.Loop() {
				for _, body := range bodies {
					if _, err := Decode(body); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/order")
		})
	}
}

// BenchmarkDecodeMessage decodes one message carrying n orders (v1 for n=1).
func BenchmarkDecodeMessage(b *testing.B) {
	for _, n := range []int{1, 20, 100} {
		b.Run(fmt.Sprintf("orders=%d", n), func(b *testing.B) {
			orders, bodies := batchOf(n)
			body := bodies[0]
			if n > 1 {
				body, _ = Batch{Orders: orders}.Encode()
			}
			b.ReportAllocs()
			for b.Loop() {
				if parts, err := DecodeMessage(body); err != nil || len(parts) != n {
					b.Fatal(len(parts), err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/order")
		})
	}
}
