// Package teardown removes what one isolated stack left on the shared
// services — its Redis keys (by key prefix), its RabbitMQ queues and
// exchanges (by name prefix) and its MySQL database — and lists what is left,
// so that the demo, bench and test stacks can prove they leave nothing behind.
package teardown

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/redisnodes"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
)

// ErrUnscoped refuses a teardown that would not be limited to one stack: an
// empty Redis key prefix names every key of the database.
var ErrUnscoped = errors.New("refusing to tear down without a Redis key prefix")

// Report says what a teardown removed.
type Report struct {
	RedisKeys          int
	Queues, Exchanges  []string
	Database           string
	DatabaseWasPresent bool
}

// Remove deletes the stack's Redis keys, queues, exchanges and database. Each
// step runs even when an earlier one failed; the errors are joined.
func Remove(ctx context.Context, cfg conf.Config) (Report, error) {
	var rep Report
	if cfg.Redis.KeyPrefix == "" {
		return rep, ErrUnscoped
	}
	var errs []error
	n, err := removeRedis(ctx, cfg.Redis)
	rep.RedisKeys = n
	errs = append(errs, err)
	q, x, err := removeBroker(cfg.RabbitMQ)
	rep.Queues, rep.Exchanges = q, x
	errs = append(errs, err)
	rep.Database, rep.DatabaseWasPresent, err = removeDatabase(ctx, cfg.MySQL)
	errs = append(errs, err)
	return rep, errors.Join(errs...)
}

// Pattern is the SCAN pattern matching exactly the keys under prefix: glob
// metacharacters in the prefix are escaped.
func Pattern(prefix string) string {
	var b strings.Builder
	for _, r := range prefix {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String() + "*"
}

// RedisKeys lists the keys under prefix (SCAN, never KEYS).
func RedisKeys(ctx context.Context, rdb redis.UniversalClient, prefix string) ([]string, error) {
	// On a cluster, every master holds some of them.
	return redisnodes.Scan(ctx, rdb, Pattern(prefix))
}

func removeRedis(ctx context.Context, c conf.Redis) (int, error) {
	rdb := c.NewClient()
	defer rdb.Close()
	keys, err := RedisKeys(ctx, rdb, c.KeyPrefix)
	if err != nil {
		return 0, err
	}
	n := 0
	for start := 0; start < len(keys); start += 500 {
		chunk := keys[start:min(start+500, len(keys))]
		// One key per command: keys of different hash tags may live on
		// different nodes.
		cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range chunk {
				p.Unlink(ctx, k)
			}
			return nil
		})
		if err != nil {
			return n, fmt.Errorf("delete keys under %s: %w", c.KeyPrefix, err)
		}
		for _, cmd := range cmds {
			n += int(cmd.(*redis.IntCmd).Val())
		}
	}
	return n, nil
}

func removeBroker(c conf.RabbitMQ) (queues, exchanges []string, err error) {
	nodes, err := broker.NodesFor(c)
	if err != nil {
		return nil, nil, err
	}
	conn, err := nodes.Dial()
	if err != nil {
		return nil, nil, fmt.Errorf("rabbitmq: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("rabbitmq channel: %w", err)
	}
	defer ch.Close()
	topo := broker.TopologyFor(c)
	var errs []error
	// Partition queues of a larger [rabbitmq] partitions go too.
	retired, err := topo.Retired(conn)
	if err != nil {
		errs = append(errs, err)
	}
	// Deleting an absent queue or exchange succeeds, so a repeat is harmless.
	for _, q := range append(topo.QueueNames(), retired...) {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			errs = append(errs, fmt.Errorf("delete queue %s: %w", q, err))
			continue
		}
		queues = append(queues, q)
	}
	for _, x := range topo.ExchangeNames() {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			errs = append(errs, fmt.Errorf("delete exchange %s: %w", x, err))
			continue
		}
		exchanges = append(exchanges, x)
	}
	return queues, exchanges, errors.Join(errs...)
}

func removeDatabase(ctx context.Context, c conf.MySQL) (string, bool, error) {
	dc, err := c.Driver()
	if err != nil {
		return "", false, fmt.Errorf("mysql dsn: %w", err)
	}
	name := dc.DBName
	dc.DBName = ""
	conn, err := mysql.NewConnector(dc)
	if err != nil {
		return name, false, fmt.Errorf("mysql: %w", err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	present, err := DatabaseExists(ctx, db, name)
	if err != nil {
		return name, false, err
	}
	// The name was checked by conf (no quotes or back-quotes).
	if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
		return name, present, fmt.Errorf("drop database %s: %w", name, err)
	}
	return name, present, nil
}

// DatabaseExists reports whether the server of db holds database name.
func DatabaseExists(ctx context.Context, db *sql.DB, name string) (bool, error) {
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?`, name).Scan(&n); err != nil {
		return false, fmt.Errorf("look up database %s: %w", name, err)
	}
	return n > 0, nil
}
