package coalesce_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seckill/seckill/backend/internal/coalesce"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// BenchmarkReserveCoalesced is one hot sale reserved by 32 goroutines per
// CPU, each reservation a fresh user: "direct" calls Reserve per request
// (the baseline: one script call each), "coalesced" goes through a
// Coalescer (max 64, linger 2ms, the defaults) whose groups are one
// ReserveMulti. ns/op and allocs/op are per request.
func BenchmarkReserveCoalesced(b *testing.B) {
	for _, mode := range []string{"direct", "coalesced"} {
		b.Run(mode, func(b *testing.B) {
			rdb, prefix := servicetest.Redis(b)
			st := reservation.New(rdb, prefix)
			const id = 1
			now, err := rdb.Time(context.Background()).Result()
			servicetest.Must(b, err, "time")
			_, _, err = st.Warm(context.Background(), id, reservation.WarmArgs{Total: 1 << 40, Limit: 1,
				Start: now.Add(-time.Hour), End: now.Add(time.Hour)})
			servicetest.Must(b, err, "warm")
			type call struct {
				req reservation.Request
				res reservation.Result
				err error
			}
			var groups atomic.Int64
			c := coalesce.New(64, 2*time.Millisecond, func(_ reservation.Keys, g []*call) {
				groups.Add(1)
				ctx := context.Background()
				if len(g) == 1 {
					g[0].res, g[0].err = st.Reserve(ctx, g[0].req)
					return
				}
				rs := make([]reservation.Request, len(g))
				for i, x := range g {
					rs[i] = x.req
				}
				res, errs, err := st.ReserveMulti(ctx, rs)
				for i, x := range g {
					if err != nil {
						x.err = err
						continue
					}
					x.res, x.err = res[i], errs[i]
				}
			})
			var n atomic.Int64
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					x := &call{req: reservation.Request{ActivityID: id, UserID: "u" + strconv.FormatInt(n.Add(1), 10),
						Quantity: 1, OrderID: ordermsg.NewOrderID(id), TTL: time.Minute, Keys: st.ShardKeys(id, 0, 1)}}
					if mode == "direct" {
						x.res, x.err = st.Reserve(context.Background(), x.req)
					} else {
						c.Do(x.req.Keys, x)
					}
					if x.err != nil || x.res.Outcome != reservation.Reserved {
						b.Errorf("%+v %v", x.res, x.err)
						return
					}
				}
			})
			if g := groups.Load(); g > 0 {
				b.ReportMetric(float64(b.N)/float64(g), "reqs/call")
			}
		})
	}
}

// BenchmarkCoalescerOverhead is the coalescer's own cost per call, its run
// doing nothing, beside a direct call of the same run.
func BenchmarkCoalescerOverhead(b *testing.B) {
	var sink atomic.Int64
	run := func(_ int, g []*int) { sink.Add(int64(len(g))) }
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			x := 1
			for pb.Next() {
				run(0, []*int{&x})
			}
		})
	})
	b.Run("coalesced", func(b *testing.B) {
		c := coalesce.New(64, 2*time.Millisecond, run)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			x := 1
			for pb.Next() {
				c.Do(0, &x)
			}
		})
	})
}
