package servicetest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// needBinary skips the test when name is not installed, or fails it under CI.
func needBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		unavailable(t, name, err)
	}
	return p
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Must(t, err, "listen")
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Private is a server of the test's own, which it may stop, restart or count
// exactly (INFO commandstats, SHOW GLOBAL STATUS): nothing else uses it.
type Private struct {
	Addr string // host:port
	cmd  *exec.Cmd
	argv []string
}

// PrivateRedis starts a throwaway redis-server on a free port; it is killed
// when the test ends.
func PrivateRedis(t testing.TB) *Private {
	t.Helper()
	bin := needBinary(t, "redis-server")
	port := freePort(t)
	p := &Private{Addr: "127.0.0.1:" + strconv.Itoa(port), argv: []string{bin, "--port", strconv.Itoa(port),
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no"}}
	p.Start(t)
	t.Cleanup(p.Kill)
	return p
}

// Start (re)starts the server and waits until it answers.
func (p *Private) Start(t testing.TB) {
	t.Helper()
	p.cmd = exec.Command(p.argv[0], p.argv[1:]...)
	Must(t, p.cmd.Start(), "start %s", p.argv[0])
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	defer rdb.Close()
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if i > 250 {
			t.Fatalf("private redis-server on %s did not start: %v", p.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server at once (SIGKILL) and reaps it.
func (p *Private) Kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
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
	out, err := exec.Command(install, "--no-defaults", "--datadir="+data,
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	port := freePort(t)
	argv := []string{bin, "--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "pid"),
		"--innodb-buffer-pool-size=32M", "--skip-log-bin", "--log-error=" + filepath.Join(dir, "err.log")}
	if os.Geteuid() == 0 {
		argv = append(argv, "--user=root")
	}
	p := &Private{Addr: "127.0.0.1:" + strconv.Itoa(port), argv: argv}
	p.cmd = exec.Command(argv[0], argv[1:]...)
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
