package consume_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/servicetest"
)

// prefill reserves n orders in Redis, as the backend would, and publishes
// them with every confirm awaited, one message per order.
func prefill(b *testing.B, s *stack, n int) { prefillBatches(b, s, n, 1) }

// prefillBatches is prefill with per orders a message: a multi-order (v2)
// message each when per > 1, as the backend's group commit publishes.
func prefillBatches(b *testing.B, s *stack, n, per int) {
	b.Helper()
	s.sale(1, int64(n), 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const inFlight = 1000
	var confs []*amqp.DeferredConfirmation
	flush := func() {
		for _, c := range confs {
			if ok, err := c.WaitContext(ctx); err != nil || !ok {
				b.Fatalf("prefill publish not confirmed: %v", err)
			}
		}
		confs = confs[:0]
	}
	var group []ordermsg.Order
	for i := range n {
		group = append(group, s.reserve(1, fmt.Sprintf("user%06d", i), 1))
		if len(group) < per && i < n-1 {
			continue
		}
		body, err := group[0].Encode()
		if per > 1 {
			body, err = ordermsg.Batch{Orders: group}.Encode()
		}
		servicetest.Must(b, err, "encode")
		c, err := s.pubCh.PublishWithDeferredConfirmWithContext(ctx, s.topo.Exchange, s.topo.RoutingKey, true, false,
			amqp.Publishing{ContentType: ordermsg.ContentType, DeliveryMode: amqp.Persistent, MessageId: group[0].OrderID, Body: body})
		servicetest.Must(b, err, "publish")
		group = group[:0]
		if confs = append(confs, c); len(confs) == inFlight {
			flush()
		}
	}
	flush()
}

// BenchmarkDrain measures how fast a pre-filled queue of orders drains: the
// worker's consumer (claim, MySQL batch, ack, settle) against the raw
// ceiling, a manual-ack consumer with the same channels and prefetch that
// does nothing but ack (multiple, once per batch). One op is one order:
// "worker" takes one message per order, "worker-per=N" multi-order messages
// of N orders (the backend's group commit). Run it with a fixed count, e.g.
// -benchtime=5000x: each run pre-fills.
func BenchmarkDrain(b *testing.B) {
	for _, per := range []int{1, 20, 100} {
		for _, serial := range []bool{false, true} {
			name := "worker"
			if per > 1 {
				name = fmt.Sprintf("worker-per=%d", per)
			}
			if serial {
				name += "-serial"
			}
			b.Run(name, func(b *testing.B) {
				s := newStack(b)
				prefillBatches(b, s, b.N, per)
				cfg := testConfig(s.topo)
				cfg.Prefetch, cfg.BatchSize = 400, 100
				cfg.SerialClaims = serial
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuTime(b)
				r := s.start(cfg, nil)
				for decided(r) < b.N || s.depth(s.topo.Queue) > 0 {
					time.Sleep(time.Millisecond)
				}
				b.StopTimer()
				// The consumer's CPU per order (the process's; the poll above is a
				// small part): unlike orders/s it barely moves with the load of a
				// shared box.
				b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/order")
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "orders/s")
				b.ReportMetric(float64(b.N)/value(r.m.Batches), "orders/batch")
				// The share of the channels' time inside MySQL transactions.
				b.ReportMetric(sum(r.m.TxSeconds)/b.Elapsed().Seconds()/float64(cfg.Consumers), "tx-share")
				r.shutdown(b)
				if got := s.countOrders(); got != b.N {
					b.Fatalf("%d orders written, want %d", got, b.N)
				}
			})
		}
	}
	b.Run("raw", func(b *testing.B) {
		s := newStack(b)
		prefill(b, s, b.N)
		cfg := testConfig(s.topo)
		cfg.Prefetch, cfg.BatchSize = 400, 100
		conn, err := amqp.Dial(servicetest.AMQPURL())
		servicetest.Must(b, err, "dial")
		defer conn.Close()
		b.ReportAllocs()
		b.ResetTimer()
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			total int
			done  = make(chan struct{})
		)
		for range cfg.Consumers {
			ch, err := conn.Channel()
			servicetest.Must(b, err, "channel")
			servicetest.Must(b, ch.Qos(cfg.Prefetch, 0, false), "qos")
			deliveries, err := ch.Consume(s.topo.Queue, "", false, false, false, false, nil)
			servicetest.Must(b, err, "consume")
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer ch.Close()
				var last amqp.Delivery
				n := 0
				for {
					select {
					case d := <-deliveries:
						last, n = d, n+1
						mu.Lock()
						total++
						all := total == b.N
						mu.Unlock()
						if n == cfg.BatchSize {
							if err := d.Ack(true); err != nil {
								b.Error(err)
								return
							}
							n = 0
						}
						if all {
							close(done)
						}
					case <-done:
						if n > 0 {
							if err := last.Ack(true); err != nil {
								b.Error(err)
							}
						}
						return
					}
				}
			}()
		}
		<-done
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		if got := s.depth(s.topo.Queue); got != 0 {
			b.Fatalf("%d messages left", got)
		}
	})
}

// decided counts orders the consumer has committed.
func decided(r *running) int {
	return int(value(r.m.Orders.WithLabelValues("confirmed")) + value(r.m.Orders.WithLabelValues("redelivered")))
}

// sum is the sample sum of a histogram.
func sum(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	return d.GetHistogram().GetSampleSum()
}

// cpuTime is the CPU time the process used so far, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	servicetest.Must(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru), "getrusage")
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
