package servicetest

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// errNoAnswer: a server started, neither answered nor exited within its
// bound. Unlike a port lost to another process, another try would only wait
// as long again, so the retry loops give up on it.
var errNoAnswer = errors.New("did not answer")

// needBinary skips the test when name is not installed, or fails it under CI.
func needBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		unavailable(t, name, err)
	}
	return p
}

// Private is a server of the test's own, which it may stop, restart or count
// exactly (INFO commandstats, SHOW GLOBAL STATUS): nothing else uses it.
type Private struct {
	Addr   string     // host:port
	owner  testing.TB // the test whose child every run is
	cmd    *Cmd
	exited chan struct{}
	argv   []string
	tls    *tls.Config // a TLS-only redis-server: how to reach it
}

// PrivateRedis starts a throwaway redis-server on a free port; it is killed
// when the test ends. The port is only probed free, so another process may
// take it before the server binds it: then the server exits and another port
// is tried.
func PrivateRedis(t testing.TB) *Private {
	t.Helper()
	bin := needBinary(t, "redis-server")
	var errs []string
	for range 10 {
		p := redisServer(t, bin, FreePort(t))
		err := p.startRedis()
		if err == nil {
			t.Cleanup(p.Kill)
			return p
		}
		errs = append(errs, err.Error())
		if errors.Is(err, errNoAnswer) {
			break // not a lost port: another try would wait as long again
		}
	}
	t.Fatalf("private redis-server did not start: %s", strings.Join(errs, "; "))
	return nil
}

// StartRedisArgs starts redis-server with the command line args(port) on a
// free port (args must make it listen there, on 127.0.0.1, without TLS) and
// kills it when the test ends: a server of a configuration the test needs
// (a cluster node of a deployment's config file). args is called again for
// each port tried.
func StartRedisArgs(t testing.TB, args func(port int) []string) *Private {
	t.Helper()
	bin := needBinary(t, "redis-server")
	var errs []string
	for range 10 {
		port := FreePort(t)
		p := &Private{Addr: "127.0.0.1:" + strconv.Itoa(port), owner: t, argv: append([]string{bin}, args(port)...)}
		if err := p.startRedis(); err != nil {
			errs = append(errs, err.Error())
			if errors.Is(err, errNoAnswer) {
				break // not a lost port: another try would wait as long again
			}
			continue
		}
		t.Cleanup(p.Kill)
		return p
	}
	t.Fatalf("redis-server %v did not start: %s", args(0), strings.Join(errs, "; "))
	return nil
}

// redisServer is a redis-server on port that keeps nothing on disk, a
// child of test t.
func redisServer(t testing.TB, bin string, port int) *Private {
	return &Private{Addr: "127.0.0.1:" + strconv.Itoa(port), owner: t, argv: []string{bin, "--port", strconv.Itoa(port),
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no"}}
}

// Start restarts the server on its address (after Kill) and waits until it
// answers. It stays a child of the test that made it, whichever test
// restarts it.
func (p *Private) Start(t testing.TB) {
	t.Helper()
	Must(t, p.startRedis(), "restart private redis-server")
}

// startRedis runs the server and waits until this very process answers on
// Addr (its INFO process_id), not some other server that holds the port.
func (p *Private) startRedis() error {
	cmd := Command(p.owner, p.argv[0], p.argv[1:]...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.argv[0], err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, TLSConfig: p.tls})
	defer rdb.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-exited:
			p.cmd = nil
			return fmt.Errorf("redis-server on %s exited at start (port taken?)", p.Addr)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		pid, err := redisPid(ctx, rdb)
		cancel()
		if err == nil && pid == cmd.Process.Pid {
			return nil
		}
		if time.Now().After(deadline) {
			p.Kill()
			return fmt.Errorf("redis-server on %s %w within a minute (last: pid %d, %v)", p.Addr, errNoAnswer, pid, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisPid is the process id of the server rdb reaches.
func redisPid(ctx context.Context, rdb *redis.Client) (int, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("INFO server has no process_id")
}

// Kill stops the server at once (SIGKILL) and reaps it.
func (p *Private) Kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		if p.exited != nil {
			<-p.exited
		} else {
			_ = p.cmd.Wait()
		}
		p.cmd = nil
	}
}

// PrivateMariaDB starts a throwaway MariaDB server (its own data directory
// and port, root without password) and returns the DSN of its database
// "seckill". It is killed when the test ends. Takes a few seconds.
func PrivateMariaDB(t testing.TB) (*Private, string) {
	t.Helper()
	bin := needBinary(t, "mariadbd")
	install := needBinary(t, "mariadb-install-db")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	// A few seconds; bounded so that a stuck install fails the test, not
	// the package's -timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := CommandContext(ctx, t, install, "--no-defaults", "--datadir="+data,
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		t.Fatalf("mariadb-install-db (bound 2m): %v\n%s", err, out)
	}
	port := FreePort(t)
	argv := []string{bin, "--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "pid"),
		"--innodb-buffer-pool-size=32M", "--skip-log-bin", "--log-error=" + filepath.Join(dir, "err.log")}
	if os.Geteuid() == 0 {
		argv = append(argv, "--user=root")
	}
	p := &Private{Addr: "127.0.0.1:" + strconv.Itoa(port), owner: t, argv: argv}
	p.cmd = Command(t, argv[0], argv[1:]...)
	Must(t, p.cmd.Start(), "start mariadbd")
	t.Cleanup(p.Kill)
	dsn := fmt.Sprintf("root@tcp(%s)/", p.Addr)
	db, err := sql.Open("mysql", dsn)
	Must(t, err, "open")
	defer db.Close()
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = db.PingContext(ctx)
		if err == nil {
			_, err = db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS seckill")
		}
		cancel()
		if err == nil {
			break
		}
		if i > 300 {
			log, _ := os.ReadFile(filepath.Join(dir, "err.log"))
			t.Fatalf("private mariadbd on %s did not start: %v\n%s", p.Addr, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p, dsn + "seckill"
}
