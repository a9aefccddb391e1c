package ceiling_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/bench/internal/ceiling"
	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/redisnodes"
	"github.com/seckill/seckill/internal/servicetest"
)

const short = 300 * time.Millisecond

// check asserts what every ceiling must give: work done, a rate that is that
// work over the time taken.
func check(t *testing.T, r ceiling.Result, name, unit string) {
	t.Helper()
	if r.Name != name || r.Unit != unit || r.Ops <= 0 || r.Seconds < short.Seconds() || r.PerSecond <= 0 {
		t.Fatalf("result %+v", r)
	}
	if got := float64(r.Ops) / r.Seconds; got < r.PerSecond*0.999 || got > r.PerSecond*1.001 {
		t.Fatalf("per second %.1f, ops over seconds %.1f", r.PerSecond, got)
	}
}

// TestPublishConfirm against the real broker: every confirmed message is in
// the queue (the function checks it), and the queue is gone afterwards.
func TestPublishConfirm(t *testing.T) {
	prefix := servicetest.AMQPPrefix(t, []string{".ceiling"}, nil)
	q := prefix + ".ceiling"
	r, err := ceiling.PublishConfirm(context.Background(), servicetest.AMQPURL(), q, short, 256)
	if err != nil {
		t.Fatal(err)
	}
	check(t, r, ceiling.Publish, "msgs/s")
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err == nil {
		t.Fatalf("queue %s is still there", q)
	}
	if _, err := ceiling.PublishConfirm(context.Background(), servicetest.AMQPURL(), q, short, 0); err == nil {
		t.Fatal("window 0: no error")
	}
}

// TestPublishConfirmRefusesAForeignQueue: a queue of that name with other
// settings is an error, and is left as it was (not deleted).
func TestPublishConfirmRefusesAForeignQueue(t *testing.T) {
	prefix := servicetest.AMQPPrefix(t, []string{".classic"}, nil)
	q := prefix + ".classic"
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic})
	servicetest.Must(t, err, "declare")
	if _, err := ceiling.PublishConfirm(context.Background(), servicetest.AMQPURL(), q, short, 16); err == nil {
		t.Fatal("a classic queue of that name: no error")
	}
	if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
		t.Fatalf("the foreign queue is gone: %v", err)
	}
}

// TestTransactions against the real MariaDB: every order committed is in
// the database (the function checks it), which is dropped afterwards.
func TestTransactions(t *testing.T) {
	var cfg conf.MySQL = conf.Default().MySQL
	cfg.DSN = servicetest.MySQLServerDSN()
	name := servicetest.Name(t) + "_ceil"
	r, err := ceiling.Transactions(context.Background(), cfg, name, short, 2)
	if err != nil {
		t.Fatal(err)
	}
	check(t, r, ceiling.Transaction, "orders/s")
	if r.Ops%ceiling.Batch != 0 {
		t.Fatalf("%d orders: not whole transactions of %d", r.Ops, ceiling.Batch)
	}
	dc, err := mysql.ParseDSN(servicetest.MySQLServerDSN())
	servicetest.Must(t, err, "dsn")
	dc.DBName = ""
	db, err := sql.Open("mysql", dc.FormatDSN())
	servicetest.Must(t, err, "open")
	defer db.Close()
	var n int
	servicetest.Must(t, db.QueryRow("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", name).Scan(&n), "schemata")
	if n != 0 {
		t.Fatalf("database %s is still there", name)
	}
	for _, bad := range []string{"", "a`b", "a b"} {
		if _, err := ceiling.Transactions(context.Background(), cfg, bad, short, 2); err == nil || !strings.Contains(err.Error(), "database name") {
			t.Errorf("database %q: %v", bad, err)
		}
	}
}

// TestScripts against the real Redis: every call reserved (the function
// checks Redis's pending count), and the sale's keys are gone afterwards; a
// sale that exists already is refused and left alone.
func TestScripts(t *testing.T) {
	rdb, prefix := servicetest.Redis(t)
	ctx := context.Background()
	r, err := ceiling.Scripts(ctx, rdb, prefix, 42, short, 8)
	if err != nil {
		t.Fatal(err)
	}
	check(t, r, ceiling.Reserve, "calls/s")
	keys, err := redisnodes.Scan(ctx, rdb, prefix+"*")
	servicetest.Must(t, err, "scan")
	if len(keys) != 0 {
		t.Fatalf("keys left: %v", keys)
	}

	servicetest.Must(t, rdb.HSet(ctx, prefix+"{act:43}:meta", "total", 5, "sold", 0, "pending", 0, "limit", 1,
		"start", 0, "end", time.Now().Add(time.Hour).UnixMilli()).Err(), "hset")
	if _, err := ceiling.Scripts(ctx, rdb, prefix, 43, short, 8); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("an existing sale: %v", err)
	}
	if v, _ := rdb.HGet(ctx, prefix+"{act:43}:meta", "total").Result(); v != "5" {
		t.Fatalf("the existing sale was changed: total %q", v)
	}
}
