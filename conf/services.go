package conf

import (
	"errors"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Redis is the [redis] section.
type Redis struct {
	URL          string   `toml:"url"`
	KeyPrefix    string   `toml:"key_prefix"`
	PoolSize     int      `toml:"pool_size"`
	DialTimeout  Duration `toml:"dial_timeout"`
	ReadTimeout  Duration `toml:"read_timeout"`
	WriteTimeout Duration `toml:"write_timeout"`
	// TLS of a rediss:// URL (RedisTLS). Empty: the system's CAs, no client
	// certificate, each server verified by the host it is dialled at.
	TLSCAFile     string `toml:"tls_ca_file"`
	TLSCertFile   string `toml:"tls_cert_file"`
	TLSKeyFile    string `toml:"tls_key_file"`
	TLSServerName string `toml:"tls_server_name"`
}

func defaultRedis() Redis {
	return Redis{
		URL:          "redis://127.0.0.1:6379/0",
		PoolSize:     64,
		DialTimeout:  D(time.Second),
		ReadTimeout:  D(500 * time.Millisecond),
		WriteTimeout: D(500 * time.Millisecond),
	}
}

func (r *Redis) validate(p *problems) {
	if t, err := ParseRedisURL(r.URL); err != nil {
		p.add("redis.url", "%v", err)
	} else if _, err := r.tlsConfig(t); err != nil {
		var ke keyError
		if errors.As(err, &ke) {
			p.add(ke.key, "%v", ke.err)
		} else {
			p.add("redis.url", "%v", err)
		}
	}
	if strings.ContainsAny(r.KeyPrefix, "{} \t\r\n") {
		p.add("redis.key_prefix", "must not contain braces or white space, got %q", r.KeyPrefix)
	}
	checkRange(p, "redis.pool_size", r.PoolSize, 1, 10000)
	checkPositive(p, "redis.dial_timeout", r.DialTimeout)
	checkPositive(p, "redis.read_timeout", r.ReadTimeout)
	checkPositive(p, "redis.write_timeout", r.WriteTimeout)
}

// MySQL is the [mysql] section.
type MySQL struct {
	DSN             string   `toml:"dsn"`
	MaxOpenConns    int      `toml:"max_open_conns"`
	MaxIdleConns    int      `toml:"max_idle_conns"`
	ConnMaxLifetime Duration `toml:"conn_max_lifetime"`
	QueryTimeout    Duration `toml:"query_timeout"`
}

func defaultMySQL() MySQL {
	return MySQL{
		DSN:             "root@tcp(127.0.0.1:3306)/seckill",
		MaxOpenConns:    32,
		MaxIdleConns:    16,
		ConnMaxLifetime: D(5 * time.Minute),
		QueryTimeout:    D(5 * time.Second),
	}
}

// Driver returns the parsed DSN with the settings every binary relies on.
func (m MySQL) Driver() (*mysql.Config, error) {
	c, err := mysql.ParseDSN(m.DSN)
	if err != nil {
		return nil, err
	}
	c.ParseTime = true
	c.Loc = time.UTC
	c.InterpolateParams = true
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["time_zone"] = "'+00:00'"
	// No isolation level here: MariaDB and MySQL name the session variable
	// differently and an unknown one fails every connection. A pool whose
	// transactions all need READ COMMITTED sets it per connection
	// (schema.ReadCommitted); others ask per transaction (sql.TxOptions).
	return c, nil
}

func (m *MySQL) validate(p *problems) {
	c, err := mysql.ParseDSN(m.DSN)
	switch {
	case err != nil:
		p.add("mysql.dsn", "%v", err)
	case c.DBName == "":
		p.add("mysql.dsn", "must name a database, e.g. root@tcp(127.0.0.1:3306)/seckill")
	case strings.ContainsAny(c.DBName, "`'\"\\ "):
		p.add("mysql.dsn", "database name %q has characters that are not allowed", c.DBName)
	}
	checkRange(p, "mysql.max_open_conns", m.MaxOpenConns, 1, 10000)
	checkRange(p, "mysql.max_idle_conns", m.MaxIdleConns, 0, 10000)
	checkPositive(p, "mysql.conn_max_lifetime", m.ConnMaxLifetime)
	checkPositive(p, "mysql.query_timeout", m.QueryTimeout)
}

// RabbitMQ is the [rabbitmq] section.
type RabbitMQ struct {
	// URL is one broker address or several (ParseAMQPURLs: comma-separated
	// URLs, or one URL naming several hosts); URLs is the same as a TOML
	// list. Clients connect to the first address that serves and move on
	// to the next when it fails (docs/faults.md, "Broker node lost").
	URL  string   `toml:"url"`
	URLs []string `toml:"urls"`
	// Prefix is put before every exchange and queue name, so that isolated stacks
	// (tests, several demos) can share one broker.
	Prefix          string   `toml:"prefix"`
	DeliveryLimit   int      `toml:"delivery_limit"`
	PublishChannels int      `toml:"publish_channels"`
	ConfirmTimeout  Duration `toml:"confirm_timeout"`
	ReconnectMin    Duration `toml:"reconnect_min"`
	ReconnectMax    Duration `toml:"reconnect_max"`
	// NackLimit is the number of consecutive nacks after which a publisher
	// reopens its channel (and, when the new one is refused too, reconnects
	// to the next node).
	NackLimit int `toml:"nack_limit"`
	// Partitions is the number of order queues; each order goes to the
	// queue its order id hashes to (docs/scale-out.md).
	Partitions int `toml:"partitions"`
}

// MaxPartitions bounds [rabbitmq] partitions (and the retired partition
// queues a worker looks for).
const MaxPartitions = 64

func defaultRabbitMQ() RabbitMQ {
	return RabbitMQ{
		URL:             "amqp://guest:guest@127.0.0.1:5672/",
		Prefix:          "seckill",
		DeliveryLimit:   5,
		PublishChannels: 4,
		ConfirmTimeout:  D(5 * time.Second),
		ReconnectMin:    D(100 * time.Millisecond),
		ReconnectMax:    D(5 * time.Second),
		NackLimit:       5,
		Partitions:      1,
	}
}

func (r *RabbitMQ) validate(p *problems) {
	if len(r.URLs) > 0 {
		seen := map[string]bool{}
		for i, u := range r.URLs {
			us, err := ParseAMQPURLs(u)
			if err != nil {
				p.add(keyIndex("rabbitmq.urls", i), "%v", err)
				continue
			}
			for _, u := range us {
				if seen[u] {
					p.add(keyIndex("rabbitmq.urls", i), "%s is listed twice", Redact(u))
				}
				seen[u] = true
			}
		}
	} else if _, err := ParseAMQPURLs(r.URL); err != nil {
		p.add("rabbitmq.url", "%v", err)
	}
	if r.Prefix == "" || strings.ContainsAny(r.Prefix, " \t\r\n") {
		p.add("rabbitmq.prefix", "must be a non-empty name without white space, got %q", r.Prefix)
	}
	checkRange(p, "rabbitmq.delivery_limit", r.DeliveryLimit, 1, 1000)
	checkRange(p, "rabbitmq.publish_channels", r.PublishChannels, 1, 256)
	checkRange(p, "rabbitmq.partitions", r.Partitions, 1, MaxPartitions)
	checkRange(p, "rabbitmq.nack_limit", r.NackLimit, 1, 100000)
	checkPositive(p, "rabbitmq.confirm_timeout", r.ConfirmTimeout)
	checkPositive(p, "rabbitmq.reconnect_min", r.ReconnectMin)
	checkPositive(p, "rabbitmq.reconnect_max", r.ReconnectMax)
	if r.ReconnectMax.Duration < r.ReconnectMin.Duration {
		p.add("rabbitmq.reconnect_max", "must not be below rabbitmq.reconnect_min")
	}
}
