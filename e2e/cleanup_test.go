package e2e

import (
	"bufio"
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/internal/teardown"
)

// leftovers lists what the services still hold of a stack: queues and
// exchanges whose name starts with amqpPrefix (as the broker lists them, not
// only the names the topology declares), Redis keys under redisPrefix, and the
// database.
func leftovers(t *testing.T, amqpPrefix, redisPrefix, database string) []string {
	t.Helper()
	var out []string
	for _, kind := range []string{"list_queues", "list_exchanges"} {
		for _, name := range rabbitmqctl(t, kind) {
			if strings.HasPrefix(name, amqpPrefix) {
				out = append(out, kind+": "+name)
			}
		}
	}
	rdb, _ := servicetest.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	keys, err := teardown.RedisKeys(ctx, rdb, redisPrefix)
	servicetest.Must(t, err, "scan")
	for _, k := range keys {
		out = append(out, "redis: "+k)
	}
	db, err := sql.Open("mysql", servicetest.MySQLServerDSN())
	servicetest.Must(t, err, "mysql")
	defer db.Close()
	exists, err := teardown.DatabaseExists(ctx, db, database)
	servicetest.Must(t, err, "mysql")
	if exists {
		out = append(out, "mysql: database "+database)
	}
	return out
}

// rabbitmqctl lists the names of the default vhost's queues or exchanges.
func rabbitmqctl(t *testing.T, what string) []string {
	t.Helper()
	bin, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("rabbitmqctl missing (CI requires it): %v", err)
		}
		t.Skipf("rabbitmqctl missing: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := servicetest.CommandContext(ctx, t, bin, "-q", what, "name", "--no-table-headers").Output()
	servicetest.Must(t, err, "rabbitmqctl %s (bound %v)", what, time.Minute)
	var names []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if n := strings.TrimSpace(sc.Text()); n != "" {
			names = append(names, n)
		}
	}
	return names
}

func dbName(t *testing.T, dsn string) string {
	c, err := mysql.ParseDSN(dsn)
	servicetest.Must(t, err, "dsn")
	return c.DBName
}

// TestStacksLeaveNothing runs a sale on an e2e stack and on a bench/demo
// stack (bench/stack.sh) and checks that once each is stopped, the broker,
// Redis and MariaDB hold nothing of it: no queue, no exchange, no key, no
// database.
func TestStacksLeaveNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Run("e2e", func(t *testing.T) {
		var amqpPrefix, redisPrefix, database string
		t.Run("sale", func(t *testing.T) {
			s := stack.New(t, stack.Options{Backends: 1, Workers: 1})
			amqpPrefix, redisPrefix, database = s.AMQPPrefix, s.Prefix, dbName(t, s.DSN)
			sale := s.CreateSale(t, 7, 5, 1)
			c := stack.NewCrowd(sale, 10, 1, "clean")
			c.Run(s, s.Backends)
			s.Drain(t, sale, c.Accepted())
			if got := leftovers(t, amqpPrefix, redisPrefix, database); len(got) == 0 {
				t.Fatal("a running stack shows nothing on the services: the check cannot see it")
			}
		})
		if got := leftovers(t, amqpPrefix, redisPrefix, database); len(got) > 0 {
			t.Errorf("the stopped e2e stack left %d things behind: %v", len(got), got)
		}
	})
	t.Run("stack.sh", func(t *testing.T) {
		stack.Binary(t, "backend")
		stack.Binary(t, "proxy")
		binDir := filepath.Dir(stack.Binary(t, "worker"))
		out := t.TempDir()
		// The script starts a stack, buys through its proxy, waits for the
		// worker to write the orders, reports what it holds, and stops.
		script := `
set -euo pipefail
source bench/stack.sh
stack_init
stack_write_config "$STACK_OUT/seckill.toml" 100 1000
stack_up "$STACK_OUT/seckill.toml" 1 1
trap stack_stop EXIT
echo "ids $SECKILL_AMQP_PREFIX $SECKILL_REDIS_PREFIX $STACK_DB"
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
later=$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)
curl -fsS -o /dev/null -X PUT -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" -H 'Content-Type: application/json' \
	-d "{\"stock\":3,\"per_user_limit\":1,\"starts_at\":\"$now\",\"ends_at\":\"$later\"}" "$BACKEND_URL/admin/v1/activities/9"
for u in 1 2 3 4; do
	curl -sS -o /dev/null -X POST -H "X-User-ID: u$u" "${PROXY_URLS%%,*}/api/v1/activities/9/purchase"
done
for i in $(seq 1 100); do
	sold=$(curl -fsS "$BACKEND_URL/api/v1/activities/9" | sed -n 's/.*"sold":\([0-9]*\).*/\1/p')
	[[ $sold == 3 ]] && break
	sleep 0.1
done
echo "sold $sold"
`
		// A few seconds' work; the bound keeps a stuck stack from running
		// into the package's -timeout.
		const bound = 3 * time.Minute
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		cmd := servicetest.CommandContext(ctx, t, "bash", "-c", script)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "STACK_OUT="+out, "STACK_BIN="+binDir, "STACK_NAME=cleanup",
			"SECKILL_REDIS_URL="+servicetest.RedisURL(), "SECKILL_AMQP_URL="+servicetest.AMQPURL())
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("stack.sh run (bound %v): %v\n%s", bound, err, b)
		}
		var amqpPrefix, redisPrefix, database, sold string
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "ids" {
				amqpPrefix, redisPrefix, database = f[1], f[2], f[3]
			} else if len(f) == 2 && f[0] == "sold" {
				sold = f[1]
			}
		}
		if amqpPrefix == "" || !strings.HasPrefix(database, "seckill_cleanup_") {
			t.Fatalf("stack ids not printed:\n%s", b)
		}
		if sold != "3" {
			t.Fatalf("the stack did not sell its 3 units (sold %q), so it proves nothing:\n%s", sold, b)
		}
		if got := leftovers(t, amqpPrefix, redisPrefix, database); len(got) > 0 {
			log, _ := os.ReadFile(filepath.Join(out, "logs", "teardown.log"))
			t.Errorf("the stopped stack.sh stack left %d things behind: %v\nteardown: %s", len(got), got, log)
		}
	})
}
