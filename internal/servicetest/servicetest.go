// Package servicetest gives tests isolated handles on the real Redis, MariaDB and
// RabbitMQ: a fresh key prefix, a fresh database, a fresh broker name prefix.
// When a service is unreachable the test is skipped, except under CI (CI=true),
// where a missing service fails the test.
package servicetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/redisnodes"
)

// Environment variables that point tests at other servers.
const (
	EnvRedisURL = "SECKILL_TEST_REDIS_URL"
	EnvMySQLDSN = "SECKILL_TEST_MYSQL_DSN" // without a database name
	EnvAMQPURL  = "SECKILL_TEST_AMQP_URL"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// RedisURL is the Redis tests use.
func RedisURL() string { return envOr(EnvRedisURL, "redis://127.0.0.1:6379/0") }

// MySQLServerDSN is the DSN of the MariaDB server without a database.
func MySQLServerDSN() string { return envOr(EnvMySQLDSN, "root@tcp(127.0.0.1:3306)/") }

// AMQPURL is the broker tests use.
func AMQPURL() string { return envOr(EnvAMQPURL, "amqp://guest:guest@127.0.0.1:5672/") }

// unavailable skips the test, or fails it under CI.
func unavailable(t testing.TB, what string, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s unavailable (CI requires it): %v", what, err)
	}
	t.Skipf("%s unavailable: %v", what, err)
}

// hostOf is the host part of a service URL, for messages (no credentials).
func hostOf(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil && u.Host != "" {
		return u.Host
	}
	return "(unparsed url)"
}

// Name returns a short unique name for isolating one test: letters, digits, '_'.
func Name(t testing.TB) string {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	base := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '_'
	}, t.Name())
	if len(base) > 24 {
		base = base[:24]
	}
	return "t_" + base + "_" + hex.EncodeToString(b[:])
}

// Redis returns a client and a key prefix unique to this test; every key under
// the prefix is deleted when the test ends. SECKILL_TEST_REDIS_URL may name a
// cluster or a Sentinel (conf's URL forms): the tests that take this client
// then run on that engine.
func Redis(t testing.TB) (redis.UniversalClient, string) {
	t.Helper()
	return RedisAt(t, RedisURL())
}

// RedisNode is Redis for a test that needs one node (its address, its
// database: a fault proxy in front of it); under a cluster or Sentinel
// SECKILL_TEST_REDIS_URL it uses the shared node.
func RedisNode(t testing.TB) (*redis.Client, string) {
	t.Helper()
	u := RedisURL()
	if tg, err := conf.ParseRedisURL(u); err != nil || tg.Kind != conf.RedisNode {
		u = "redis://127.0.0.1:6379/0"
	}
	rdb, prefix := RedisAt(t, u)
	return rdb.(*redis.Client), prefix
}

// RedisAt is Redis at rawURL (any of conf's URL forms; a test that flushes
// its database picks one no other test uses).
func RedisAt(t testing.TB, rawURL string) (redis.UniversalClient, string) {
	t.Helper()
	rc := conf.Default().Redis
	rc.URL = rawURL
	// go-redis's own default timeouts, which the tests had before they used
	// conf's client: a test's setup on a loaded machine is no deadline test.
	rc.ReadTimeout, rc.WriteTimeout = conf.D(3*time.Second), conf.D(3*time.Second)
	rc.DialTimeout = conf.D(5 * time.Second)
	if _, err := conf.ParseRedisURL(rawURL); err != nil {
		t.Fatalf("redis url %q: %v", rawURL, err)
	}
	rdb := rc.NewClient()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		unavailable(t, "redis at "+hostOf(rawURL), err)
	}
	prefix := Name(t) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		keys, _ := redisnodes.Scan(ctx, rdb, prefix+"*")
		for _, k := range keys {
			rdb.Del(ctx, k)
		}
		_ = rdb.Close()
	})
	return rdb, prefix
}

// MySQLDSN creates a database unique to this test and returns a DSN naming it;
// the database is dropped when the test ends.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(MySQLServerDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		unavailable(t, "mysql at "+cfg.Addr, err)
	}
	name := Name(t)
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		_ = db.Close()
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
		_ = db.Close()
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// AMQPPrefix returns a broker name prefix unique to this test and deletes the
// queues and exchanges named by the returned prefix when the test ends.
// queues and exchanges list the suffixes the test declares (e.g. ".orders").
func AMQPPrefix(t testing.TB, queues, exchanges []string) string {
	t.Helper()
	// A broker that accepts and does not answer is unavailable in
	// seconds (amqp.Dial would give its handshake 30 s).
	conn, err := amqp.DialConfig(AMQPURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		unavailable(t, "rabbitmq at "+hostOf(AMQPURL()), err)
	}
	_ = conn.Close()
	prefix := Name(t)
	t.Cleanup(func() {
		conn, err := amqp.Dial(AMQPURL())
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		for _, q := range queues {
			_, _ = ch.QueueDelete(prefix+q, false, false, false)
		}
		for _, x := range exchanges {
			_ = ch.ExchangeDelete(prefix+x, false, false)
		}
	})
	return prefix
}

// Must fails the test on a non-nil error.
func Must(t testing.TB, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}
