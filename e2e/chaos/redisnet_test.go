package chaos

import (
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/servicetest"
)

// Redis on a bad network: the backends reach Redis through a TCP fault proxy
// (internal/faultnet) that delays chunks past the backend's redis_timeout,
// drops replies after the command ran, cuts requests before they arrive —
// each kind alone and all mixed — while a crowd buys with keyed retries and
// some unkeyed attempts. Workers and sweepers reach Redis directly. The
// client-side ledger of every answer must then agree with MySQL: I1–I5, and
// units sold = units of the confirmed orders answered 202 (a 503 kept
// nothing). `make test` runs the mixed case with 2,000 attempts, with the
// group commit's messages in the default form and one message per order;
// SECKILL_CHAOS=1 (`make chaos`) runs every kind with 5,000.
func TestRedisNetworkFaults(t *testing.T) {
	local(t)
	mixed := faultnet.Faults{
		Up:   faultnet.Flow{DelayRate: 0.02, Delay: 400 * time.Millisecond, CutRate: 0.005},
		Down: faultnet.Flow{DelayRate: 0.02, Delay: 400 * time.Millisecond, CutRate: 0.005}}
	kinds := []struct {
		name    string
		faults  faultnet.Faults
		backend string // extra [backend] lines
	}{
		{name: "slow", faults: faultnet.Faults{
			Up:   faultnet.Flow{DelayRate: 0.02, Delay: 400 * time.Millisecond},
			Down: faultnet.Flow{DelayRate: 0.02, Delay: 400 * time.Millisecond}}},
		{name: "lost replies", faults: faultnet.Faults{Down: faultnet.Flow{CutRate: 0.01}}},
		{name: "cut requests", faults: faultnet.Faults{Up: faultnet.Flow{CutRate: 0.01}}},
		{name: "mixed", faults: mixed},
		// The group commit publishing one message per order (the form for
		// workers that do not decode multi-order messages).
		{name: "mixed, one message per order", faults: mixed, backend: `group_message = "each"`},
	}
	users, stock := 700, int64(600) // 2,100 attempts
	if os.Getenv(EnvChaos) == "1" {
		users, stock = 1700, 1500 // 5,100 attempts
	} else {
		kinds = kinds[3:]
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			fp, err := faultnet.Listen("127.0.0.1:0", redisAddr(t))
			servicetest.Must(t, err, "fault proxy")
			t.Cleanup(func() { _ = fp.Close() })
			via := fmt.Sprintf("%s=redis://%s/0", conf.EnvRedisURL, fp.Addr())
			s := stack.New(t, stack.Options{Backends: 2, Workers: 2, Config: stack.FastWith(k.backend, ""),
				BackendEnv: map[int][]string{0: {via}, 1: {via}}})
			sale := s.CreateSale(t, saleID(), stock, 1)
			c := stack.NewCrowd(sale, users, 3, "net")
			for i, a := range c.Attempts {
				if i%7 == 0 {
					a.Key = "" // no retry: its 503 must keep nothing on its own
				}
			}
			fp.Set(k.faults)
			during(t, s, c, func() {})
			fp.Set(faultnet.Faults{})
			st := fp.Stats()
			t.Logf("%s: fault proxy %+v; answers %s", k.name, st, c.Summary())
			if st.Delayed+st.Cut == 0 {
				t.Fatalf("no fault was injected: %+v", st)
			}
			c.ExpectContract(t, true)
			s.Finish(t, "redis network: "+k.name, sale, c)
			for _, a := range c.Attempts {
				if a.Status == http.StatusAccepted && a.OrderID == "" {
					t.Errorf("202 without an order id: %+v", a)
				}
			}
		})
	}
}

func redisAddr(t *testing.T) string {
	t.Helper()
	o, err := redis.ParseURL(servicetest.RedisURL())
	servicetest.Must(t, err, "redis url")
	return o.Addr
}
