package servicetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TLSRedis is a Redis of the test's own that speaks TLS only, one node or a
// cluster, with a CA and certificates made for the test. Every server asks
// for a client certificate (Redis's default, tls-auth-clients yes).
type TLSRedis struct {
	URL      string // rediss://127.0.0.1:port/0 or rediss-cluster://seed,seed,seed
	CAFile   string // PEM: the CA that signed every certificate
	CertFile string // PEM: the client's certificate, signed by the CA
	KeyFile  string // PEM: its key
	Nodes    []*Private
	ca       *x509.Certificate
	caKey    *ecdsa.PrivateKey
	dir      string
}

// StartTLSRedis starts one TLS-only redis-server on 127.0.0.1, its
// certificate valid for 127.0.0.1 alone; it is killed when the test ends.
func StartTLSRedis(t testing.TB) *TLSRedis {
	t.Helper()
	r := newTLSRedis(t)
	n := r.startNode(t, "127.0.0.1", nil)
	r.URL = "rediss://" + n.Addr + "/0"
	return r
}

// StartTLSCluster starts a Redis Cluster of 3 masters and 3 replicas that
// speaks TLS to clients, on its bus (tls-cluster) and for replication
// (tls-replication). Node i listens on a loopback address of its own,
// 127.0.0.(11+i), with a certificate valid for that address alone, so a
// client that checked every node against one name (the first seed's) could
// talk to one node only. The URL names the first three nodes.
func StartTLSCluster(t testing.TB) *TLSRedis {
	t.Helper()
	r := newTLSRedis(t)
	cli := needBinary(t, "redis-cli")
	var addrs []string
	for i := range 6 {
		ip := fmt.Sprintf("127.0.0.%d", 11+i)
		bus := FreePortOn(t, ip)
		n := r.startNode(t, ip, []string{"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
			"--cluster-config-file", filepath.Join(r.dir, "nodes-"+ip+".conf"), "--cluster-node-timeout", "2000",
			"--cluster-announce-ip", ip, "--tls-cluster", "yes", "--tls-replication", "yes", "--repl-diskless-sync-delay", "0"})
		addrs = append(addrs, n.Addr)
	}
	args := append([]string{"--tls", "--cacert", r.CAFile, "--cert", r.CertFile, "--key", r.KeyFile,
		"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	// Seconds; redis-cli has no timeout of its own (it waits forever for
	// nodes that never meet).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := CommandContext(ctx, t, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create over TLS (bound 1m): %v\n%s", err, out)
	}
	// Usable once every node has the whole slot map and every replica
	// synced its master (over TLS).
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range addrs {
		rdb := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: r.ClientTLS(), MaxRetries: -1})
		for {
			ok, why := clusterNodeReady(rdb)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				_ = rdb.Close()
				t.Fatalf("TLS cluster node %s not ready after 30s: %s", addr, why)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = rdb.Close()
	}
	r.URL = "rediss-cluster://" + strings.Join(addrs[:3], ",")
	return r
}

// StartTLSSentinel starts 1 master and 1 replica (replication on TLS) and 3
// Sentinels (master name "seckill") that speak TLS only, each server on a
// loopback address of its own, 127.0.0.21–25, with a certificate for that
// address alone. The URL names the Sentinels.
func StartTLSSentinel(t testing.TB) *TLSRedis {
	t.Helper()
	r := newTLSRedis(t)
	master := r.startNode(t, "127.0.0.21", []string{"--tls-replication", "yes", "--repl-diskless-sync-delay", "0"})
	mhost, mport, _ := net.SplitHostPort(master.Addr)
	// The announce options: a connection to 127.0.0.21 leaves from
	// 127.0.0.1, which is what the others would otherwise be told.
	r.startNode(t, "127.0.0.22", []string{"--tls-replication", "yes", "--replicaof", mhost, mport, "--replica-announce-ip", "127.0.0.22"})
	var sentinels []string
	for i := range 3 {
		ip := fmt.Sprintf("127.0.0.%d", 23+i)
		cfg := filepath.Join(r.dir, "sentinel-"+ip+".conf")
		// tls-replication: the Sentinel talks TLS to the data nodes.
		Must(t, os.WriteFile(cfg, []byte("tls-replication yes\nsentinel announce-ip "+ip+"\nsentinel monitor seckill "+mhost+" "+mport+" 2\n"+
			"sentinel down-after-milliseconds seckill 1000\nsentinel failover-timeout seckill 5000\n"), 0o644), "sentinel config")
		n := r.startNode(t, ip, []string{"--sentinel"}, cfg)
		sentinels = append(sentinels, n.Addr)
	}
	// Usable once the replica synced and every Sentinel knows the replica
	// and the two other Sentinels.
	deadline := time.Now().Add(30 * time.Second)
	for {
		why := sentinelsReady(r.ClientTLS(), r.Nodes[1].Addr, sentinels)
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TLS Sentinel set not ready after 30s: %s", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.URL = "rediss-sentinel://" + strings.Join(sentinels, ",") + "/seckill/0"
	return r
}

// sentinelsReady is "" once the replica's link is up and each Sentinel
// sees one replica and two other Sentinels; else what is missing.
func sentinelsReady(tc *tls.Config, replica string, sentinels []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: replica, TLSConfig: tc, MaxRetries: -1})
	repl, err := rdb.Info(ctx, "replication").Result()
	_ = rdb.Close()
	if err != nil || !strings.Contains(repl, "master_link_status:up") {
		return fmt.Sprintf("replica %s: %v %q", replica, err, repl)
	}
	for _, s := range sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s, TLSConfig: tc, MaxRetries: -1})
		m, err := sc.Master(ctx, "seckill").Result()
		reps, rerr := sc.Replicas(ctx, "seckill").Result()
		_ = sc.Close()
		if err != nil || rerr != nil || m["num-other-sentinels"] != "2" || len(reps) != 1 {
			return fmt.Sprintf("sentinel %s: %v %v, master %v, replicas %v", s, err, rerr, m, reps)
		}
	}
	return ""
}

// clusterNodeReady: the node sees cluster_state:ok, three replicas, and is
// a master or a replica whose link to its master is up.
func clusterNodeReady(rdb *redis.Client) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := rdb.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") {
		return false, fmt.Sprintf("cluster info: %v %q", err, info)
	}
	nodes, err := rdb.ClusterNodes(ctx).Result()
	if err != nil || strings.Count(nodes, " slave ")+strings.Count(nodes, ",slave ") != 3 {
		return false, fmt.Sprintf("cluster nodes: %v\n%s", err, nodes)
	}
	repl, err := rdb.Info(ctx, "replication").Result()
	if err != nil || !(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
		return false, fmt.Sprintf("replication: %v %q", err, repl)
	}
	return true, ""
}

// ClientTLS is the client side: the CA as the only root, the client
// certificate, each server verified by the host it is dialled at.
func (r *TLSRedis) ClientTLS() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(r.ca)
	cert, err := tls.LoadX509KeyPair(r.CertFile, r.KeyFile)
	if err != nil {
		panic(err) // written by newTLSRedis a moment ago
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

func newTLSRedis(t testing.TB) *TLSRedis {
	t.Helper()
	needBinary(t, "redis-server")
	r := &TLSRedis{dir: t.TempDir()}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Must(t, err, "CA key")
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "seckill test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	Must(t, err, "CA certificate")
	r.ca, err = x509.ParseCertificate(der)
	Must(t, err, "parse CA")
	r.caKey = key
	r.CAFile = filepath.Join(r.dir, "ca.pem")
	writePEM(t, r.CAFile, "CERTIFICATE", der)
	r.CertFile, r.KeyFile = r.Issue(t, "client", nil, x509.ExtKeyUsageClientAuth)
	return r
}

// Issue signs a certificate for name with the test's CA, valid for the IP
// addresses ips (none: a client certificate), and writes it and its key.
func (r *TLSRedis) Issue(t testing.TB, name string, ips []net.IP, usage ...x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Must(t, err, "key")
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	Must(t, err, "serial")
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, r.ca, &key.PublicKey, r.caKey)
	Must(t, err, "certificate %s", name)
	kder, err := x509.MarshalECPrivateKey(key)
	Must(t, err, "marshal key")
	certFile, keyFile = filepath.Join(r.dir, name+".pem"), filepath.Join(r.dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	Must(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600), "write %s", path)
}

// startNode starts a TLS-only redis-server on ip (plain port off) with a
// certificate for ip alone, from configFile (a Sentinel's, which it
// rewrites) when given; the certificate serves as a client certificate
// too, for the servers' connections to each other (bus, replication,
// Sentinels).
func (r *TLSRedis) startNode(t testing.TB, ip string, extra []string, configFile ...string) *Private {
	t.Helper()
	cert, key := r.Issue(t, "node-"+ip, []net.IP{net.ParseIP(ip)}, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	var errs []string
	for range 5 {
		port := FreePortOn(t, ip)
		p := &Private{Addr: net.JoinHostPort(ip, strconv.Itoa(port)), owner: t, tls: r.ClientTLS()}
		argv := append(append([]string{"redis-server"}, configFile...), "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", ip,
			"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", r.CAFile,
			"--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", r.dir)
		p.argv = append(argv, extra...)
		if err := p.startRedis(); err != nil {
			errs = append(errs, err.Error()) // port taken meanwhile: another
			if errors.Is(err, errNoAnswer) {
				break // not a lost port: another try would wait as long again
			}
			continue
		}
		t.Cleanup(p.Kill)
		r.Nodes = append(r.Nodes, p)
		return p
	}
	t.Fatalf("TLS redis-server on %s did not start: %s", ip, strings.Join(errs, "; "))
	return nil
}
