package stack

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/brokertest"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
)

// AdminToken is the admin token of every test stack: random per test
// process and strong enough for the backend outside dev_mode.
var AdminToken = func() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "e2e-" + hex.EncodeToString(b)
}()

// Fast is the config of fault tests: reservations go overdue after 2s, the
// sweeper looks every 200ms and gives up on a message 2s after the deadline,
// the reconciler runs every second. worker holds extra [worker] lines.
func Fast(worker string) string { return FastWith("", worker) }

// FastWith is Fast with extra [backend] lines too.
func FastWith(backend, worker string) string {
	return `
[backend]
reservation_ttl = "2s"
publish_timeout = "1s"
` + backend + `
[rabbitmq]
reconnect_max = "500ms"
[worker]
sweep_interval     = "200ms"
republish_after    = "2s"
reconcile_interval = "1s"
retry_max          = "1s"
` + worker + "\n"
}

// Options shape a stack.
type Options struct {
	Backends, Workers int
	// RedisDB selects the Redis database (0 when unset): a test that flushes
	// its database uses one no other test shares.
	RedisDB int
	// Config is the TOML given to every process ("" for the defaults).
	Config string
	// BackendEnv is added to the environment of backend i.
	BackendEnv map[int][]string
	// StartWorkers false leaves the workers prepared but not started.
	NoStartWorkers bool
	// AMQPURL is a broker of the test's own ("" for the shared one).
	AMQPURL string
	// AMQPPrefix, with AMQPURL, names the topology ("" for one from the
	// test's name): a test that declares it first, where it wants it.
	AMQPPrefix string
	// RedisURL is a Redis of the test's own ("" for the shared one).
	RedisURL string
	// Partitions is [rabbitmq] partitions (0: the default, 1).
	Partitions int
	// WorkerEnv is added to the environment of worker i (every run).
	WorkerEnv map[int][]string
}

// Stack is one isolated deployment.
type Stack struct {
	t          testing.TB
	Dir        string
	Env        []string
	ConfigPath string
	DSN        string
	DB         *sql.DB
	Redis      redis.UniversalClient
	RedisURL   string
	Prefix     string // Redis key prefix
	AMQPPrefix string
	AMQPURL    string
	Topo       broker.Topology
	Res        *reservation.Store
	Backends   []*Proc
	Workers    []*Proc
	Proxies    []*Proc // started by StartProxy
	HTTP       *http.Client
	// RedisLost is set by a test that deletes Redis data (FLUSHDB): the
	// records of orders settled before the loss are gone for good (MySQL
	// answers for them); every record still present must agree.
	RedisLost bool
}

// New builds the binaries, isolates the services and starts the processes.
func New(t testing.TB, o Options) *Stack {
	t.Helper()
	s := &Stack{t: t, Dir: t.TempDir()}
	s.DSN = servicetest.MySQLDSN(t)
	s.RedisURL = o.RedisURL
	if s.RedisURL == "" {
		s.RedisURL = redisURL(t, o.RedisDB)
	}
	s.Redis, s.Prefix = servicetest.RedisAt(t, s.RedisURL)
	s.AMQPURL = o.AMQPURL
	if s.AMQPURL == "" {
		s.AMQPURL = servicetest.AMQPURL()
		s.AMQPPrefix = brokertest.Prefix(t)
	} else {
		s.AMQPPrefix = servicetest.Name(t) // an own broker goes with the test
		if o.AMQPPrefix != "" {
			s.AMQPPrefix = o.AMQPPrefix
		}
	}
	s.Topo = broker.TopologyFor(conf.RabbitMQ{Prefix: s.AMQPPrefix, DeliveryLimit: conf.Default().RabbitMQ.DeliveryLimit, Partitions: o.Partitions})
	s.Res = reservation.New(s.Redis, s.Prefix)
	s.ConfigPath = filepath.Join(s.Dir, "seckill.toml")
	servicetest.Must(t, os.WriteFile(s.ConfigPath, []byte(o.Config), 0o644), "config")
	s.Env = append(os.Environ(),
		conf.EnvMySQLDSN+"="+s.DSN,
		conf.EnvRedisURL+"="+s.RedisURL,
		conf.EnvRedisKeyPrefix+"="+s.Prefix,
		conf.EnvAMQPURL+"="+s.AMQPURL,
		conf.EnvAMQPQueuePrefix+"="+s.AMQPPrefix,
		conf.EnvAdminToken+"="+AdminToken,
		conf.EnvAMQPPartitions+"="+strconv.Itoa(s.Topo.Partitions),
	)
	s.HTTP = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	t.Cleanup(s.HTTP.CloseIdleConnections)
	s.DB = openDB(t, s.DSN)

	backend, worker := Binary(t, "backend"), Binary(t, "worker")
	for i := range o.Backends {
		p := NewProc(t, backend, fmt.Sprintf("backend-%d", i), "", s.Dir, s.Env, "-config", s.ConfigPath).
			Serves(t, conf.EnvBackendListen)
		p.Start(t, o.BackendEnv[i]...)
		s.Backends = append(s.Backends, p)
	}
	for i := range o.Workers {
		p := NewProc(t, worker, fmt.Sprintf("worker-%d", i), "", s.Dir, append(append([]string{}, s.Env...), o.WorkerEnv[i]...),
			"-config", s.ConfigPath).Serves(t, conf.EnvWorkerListen)
		s.Workers = append(s.Workers, p)
	}
	for _, p := range s.Backends {
		p.WaitReady(t, "/readyz")
	}
	if !o.NoStartWorkers {
		s.StartWorkers(t)
	}
	return s
}

// StartWorkers starts every worker not running and waits until it is ready.
func (s *Stack) StartWorkers(t testing.TB) {
	t.Helper()
	for _, p := range s.Workers {
		if !p.Running() {
			p.Start(t)
		}
	}
	for _, p := range s.Workers {
		p.WaitReady(t, "/readyz")
	}
}

func redisURL(t testing.TB, db int) string {
	u, err := url.Parse(servicetest.RedisURL())
	servicetest.Must(t, err, "redis url")
	if db != 0 {
		u.Path = "/" + strconv.Itoa(db)
	}
	return u.String()
}

func openDB(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	c := conf.Default().MySQL
	c.DSN = dsn
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := schema.Open(ctx, c)
	servicetest.Must(t, err, "open db")
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Sale is a flash sale of a stack.
type Sale struct {
	ID           int64
	Stock, Limit int64
}

// CreateSale opens a sale now (for an hour) through the first backend.
func (s *Stack) CreateSale(t testing.TB, id, stock, limit int64) Sale {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"stock": stock, "per_user_limit": limit,
		"starts_at": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339),
		"ends_at":   time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/admin/v1/activities/%d", s.Backends[0].URL(), id), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.HTTP.Do(req)
	servicetest.Must(t, err, "create sale")
	msg, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		t.Fatalf("create sale: %d %s", resp.StatusCode, msg)
	}
	return Sale{ID: id, Stock: stock, Limit: limit}
}

// PartitionDepth is the number of ready messages in partition i's queue.
func (s *Stack) PartitionDepth(t testing.TB, i int) (int, error) {
	conn, err := s.dialAMQP()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(s.Topo.PartitionQueue(i), true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// QueueDepth returns the ready and unacknowledged messages of the order queue
// (unacknowledged: consumers counted by the broker; RabbitMQ's passive declare
// reports ready messages only, so the drain also waits for Redis).
func (s *Stack) QueueDepth(t testing.TB) (int, error) {
	conn, err := s.dialAMQP()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range s.Topo.OrderQueues() {
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			return 0, err
		}
		n += q.Messages
	}
	return n, nil
}

// DeadLetters counts the messages in the dead-letter queue.
func (s *Stack) DeadLetters(t testing.TB) int {
	t.Helper()
	conn, err := s.dialAMQP()
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	q, err := ch.QueueDeclarePassive(s.Topo.DeadQueue, true, false, false, false, nil)
	servicetest.Must(t, err, "dead-letter queue")
	return q.Messages
}

// dialAMQP connects to the stack's broker, the first node of AMQPURL that
// answers when it names several.
func (s *Stack) dialAMQP() (*amqp.Connection, error) {
	nodes, err := broker.ParseNodes(s.AMQPURL)
	if err != nil {
		return nil, err
	}
	return nodes.Dial()
}
