package chaos

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/e2e/internal/stack"
)

// Three order-queue partitions, one worker assigned to each
// (SECKILL_WORKER_PARTITIONS); mid-sale each worker in turn is killed -9 and
// restarted. While a partition's only worker is down its queue fills (the
// orders routed there wait for it, no other worker takes them); after the
// restarts everything drains and I1–I5 hold.
func TestPartitionWorkersKilled(t *testing.T) {
	local(t)
	env := map[int][]string{}
	for i := range 3 {
		env[i] = []string{conf.EnvWorkerPartitions + "=" + strconv.Itoa(i)}
	}
	s := stack.New(t, stack.Options{Backends: 2, Workers: 3, Partitions: 3, WorkerEnv: env, Config: stack.Fast(`batch_size = 20`)})
	sale := s.CreateSale(t, saleID(), 1200, 2)
	c := stack.NewCrowd(sale, 500, 3, "pk")
	c.Spread = 4 * time.Second
	backedUp := 0
	during(t, s, c, func() {
		for i := range 3 {
			midSale(c, float64(i)*0.25+0.1, float64(i)*0.25+0.25)
			s.Workers[i].Kill(t)
			time.Sleep(time.Duration(400+rand.IntN(300)) * time.Millisecond)
			if n, err := s.PartitionDepth(t, i); err == nil && n > 0 {
				backedUp++
			}
			s.Workers[i].Start(t)
		}
	})
	s.StartWorkers(t)
	if backedUp < 2 {
		t.Errorf("only %d of 3 partitions held messages while their worker was down: orders are not routed over the partitions, or another worker consumed them", backedUp)
	}
	c.ExpectContract(t, false)
	s.Finish(t, "3 partitions: each partition's worker kill -9", sale, c)
}

// [rabbitmq] partitions lowered from 3 to 1 with orders queued in every
// partition: the backends and workers restart with 1, the workers (which
// consume all partitions) find the retired queues .p1 and .p2 and drain
// them. No order stays behind (the drain waits on all three queues); I1–I5.
func TestPartitionsLowered(t *testing.T) {
	local(t)
	s := stack.New(t, stack.Options{Backends: 2, Workers: 2, Partitions: 3, NoStartWorkers: true, Config: stack.Fast("")})
	sale := s.CreateSale(t, saleID(), 600, 2)
	c := stack.NewCrowd(sale, 200, 2, "pl")
	c.Run(s, s.Backends)
	for i := range 3 {
		if n, err := s.PartitionDepth(t, i); err != nil || n == 0 {
			t.Fatalf("partition %d holds %d messages (%v) before the change; want some", i, n, err)
		}
	}
	one := conf.EnvAMQPPartitions + "=1"
	for _, b := range s.Backends {
		b.Kill(t)
		b.Start(t, one)
		b.WaitReady(t, "/readyz")
	}
	for _, w := range s.Workers {
		w.Start(t, one)
		w.WaitReady(t, "/readyz")
	}
	c.ExpectContract(t, false)
	s.Finish(t, "partitions 3 -> 1 with orders queued", sale, c)
}
