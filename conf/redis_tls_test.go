package conf_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/lua"
)

// tlsClient is conf.Parse of a [redis] section for r with the given
// overrides of its keys ("" drops a key), and its client.
func tlsClient(t *testing.T, r *servicetest.TLSRedis, over map[string]string) redis.UniversalClient {
	t.Helper()
	keys := map[string]string{"url": r.URL, "tls_ca_file": r.CAFile, "tls_cert_file": r.CertFile, "tls_key_file": r.KeyFile}
	for k, v := range over {
		keys[k] = v
	}
	doc := "[redis]\n"
	for k, v := range keys {
		if v != "" {
			doc += fmt.Sprintf("%s = %q\n", k, v)
		}
	}
	cfg, err := conf.Parse(doc, nil)
	servicetest.Must(t, err, "parse %s", doc)
	rdb := cfg.Redis.NewClient()
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// useOverTLS runs plain commands (one and pipelined, on keys of many
// slots), loads every script and sells a sale per activity id through the
// reservation scripts: 40 concurrent buyers of 5 units each get exactly 5
// reserved and 35 sold_out.
func useOverTLS(t *testing.T, rdb redis.UniversalClient, ids []int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const prefix = "tls:"
	servicetest.Must(t, rdb.Set(ctx, prefix+"one", "v", time.Minute).Err(), "set")
	if v, err := rdb.Get(ctx, prefix+"one").Result(); err != nil || v != "v" {
		t.Fatalf("get: %q, %v", v, err)
	}
	pipe := rdb.Pipeline()
	for i := range 50 {
		pipe.Set(ctx, fmt.Sprintf("%s{k%d}", prefix, i), i, time.Minute)
	}
	_, err := pipe.Exec(ctx)
	servicetest.Must(t, err, "pipelined sets")
	for i := range 50 {
		if n, err := rdb.Get(ctx, fmt.Sprintf("%s{k%d}", prefix, i)).Int(); err != nil || n != i {
			t.Fatalf("key %d: %d, %v", i, n, err)
		}
	}
	servicetest.Must(t, lua.Preload(ctx, rdb), "preload the scripts")
	store := reservation.New(rdb, prefix)
	for _, id := range ids {
		now := time.Now()
		out, _, err := store.Warm(ctx, id, reservation.WarmArgs{Total: 5, Limit: 1, Start: now.Add(-time.Minute),
			End: now.Add(time.Hour), Users: map[string]int64{}})
		servicetest.Must(t, err, "warm sale %d", id)
		if out != reservation.WarmCreated {
			t.Fatalf("warm sale %d: %v", id, out)
		}
		var mu sync.Mutex
		got := map[reservation.Outcome]int{}
		var wg sync.WaitGroup
		for u := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := store.Reserve(ctx, reservation.Request{ActivityID: id, UserID: fmt.Sprint("u", u), Quantity: 1,
					OrderID: fmt.Sprintf("o-%d-%d", id, u), TTL: time.Minute})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("sale %d reserve: %v", id, err)
					return
				}
				got[res.Outcome]++
			}()
		}
		wg.Wait()
		if got[reservation.Reserved] != 5 || got[reservation.SoldOut] != 35 {
			t.Errorf("sale %d over TLS: %v; want 5 reserved, 35 sold_out", id, got)
		}
	}
}

// A TLS-only redis-server (rediss://), the CA and the client certificate
// from [redis] tls_*: commands, pipelines and the reservation scripts run.
// It breaks the way a TLS setup does: without the CA the server's
// certificate is unknown, without a client certificate the server refuses,
// under another tls_server_name the name does not match, and a plain
// redis:// client gets no answer.
func TestRedisOverTLS(t *testing.T) {
	t.Parallel()
	r := servicetest.StartTLSRedis(t)
	useOverTLS(t, tlsClient(t, r, nil), []int64{1})

	var unknown x509.UnknownAuthorityError
	var badName x509.HostnameError
	for _, tc := range []struct {
		name string
		over map[string]string
		want func(error) bool
	}{
		{"no CA: the system roots", map[string]string{"tls_ca_file": ""}, func(err error) bool { return errors.As(err, &unknown) }},
		{"no client certificate", map[string]string{"tls_cert_file": "", "tls_key_file": ""}, func(err error) bool { return err != nil }},
		{"another server name", map[string]string{"tls_server_name": "redis.example"}, func(err error) bool {
			return errors.As(err, &badName) && badName.Host == "redis.example"
		}},
		{"plain redis://", map[string]string{"url": strings.Replace(r.URL, "rediss://", "redis://", 1), "tls_ca_file": "",
			"tls_cert_file": "", "tls_key_file": ""}, func(err error) bool { return err != nil }},
	} {
		rdb := tlsClient(t, r, tc.over)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if !tc.want(err) {
			t.Errorf("%s: ping answered %v", tc.name, err)
		}
	}
}

// A Redis Cluster on TLS (rediss-cluster://, bus and replication on TLS
// too), each node on its own address with a certificate for that address
// alone: every node is verified by its own name, so keys of every master,
// the scripts loaded on every master and a sale on each master all work.
// Checked against one name for all nodes (tls_server_name the first
// seed's address, what a cluster client did before), the other masters'
// certificates do not match.
func TestRedisClusterOverTLS(t *testing.T) {
	t.Parallel()
	r := servicetest.StartTLSCluster(t)
	rdb := tlsClient(t, r, nil)
	cc := rdb.(*redis.ClusterClient)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One sale on each master.
	masters := map[string]int64{}
	for id := int64(1); len(masters) < 3 && id < 1000; id++ {
		n, err := cc.MasterForKey(ctx, reservation.KeysFor("tls:", id).Meta)
		servicetest.Must(t, err, "master of sale %d", id)
		if _, ok := masters[n.Options().Addr]; !ok {
			masters[n.Options().Addr] = id
		}
	}
	var ids []int64
	for _, id := range masters {
		ids = append(ids, id)
	}
	if len(ids) != 3 {
		t.Fatalf("sales on %d masters, want 3: %v", len(ids), masters)
	}
	useOverTLS(t, rdb, ids)

	one := tlsClient(t, r, map[string]string{"tls_server_name": strings.Split(r.Nodes[0].Addr, ":")[0]})
	var badName x509.HostnameError
	// A key of the first seed's master answers, a key of another master
	// fails on the name.
	answered, failed := false, false
	for i := 0; i < 50 && !(answered && failed); i++ {
		err := one.Get(ctx, fmt.Sprintf("tls:{k%d}", i)).Err()
		switch {
		case err == nil:
			answered = true
		case errors.As(err, &badName):
			failed = true
		default:
			t.Fatalf("key %d with one server name: %v, want a name mismatch", i, err)
		}
	}
	if !answered || !failed {
		t.Errorf("with one server name for all nodes: some key answered %v, some failed on the name %v; want both", answered, failed)
	}
}

// Sentinel on TLS (rediss-sentinel://): the Sentinels, the master and its
// replica each on its own address with a certificate for it alone; the
// client verifies each Sentinel and the master the Sentinels name by its
// own address, and a sale sells exactly its stock. With one server name for
// all (the first Sentinel's address) the master's certificate is refused.
func TestRedisSentinelOverTLS(t *testing.T) {
	t.Parallel()
	r := servicetest.StartTLSSentinel(t)
	useOverTLS(t, tlsClient(t, r, nil), []int64{1})

	one := tlsClient(t, r, map[string]string{"tls_server_name": "127.0.0.23"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var badName x509.HostnameError
	if err := one.Get(ctx, "tls:one").Err(); !errors.As(err, &badName) {
		t.Errorf("with the first Sentinel's name for every server: %v, want the master's certificate refused", err)
	}
}
