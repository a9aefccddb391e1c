package verify

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/reservation"
)

// Drainer is the one drain wait: it waits until a stack has processed every
// order of a sale. Drained means the order queue holds no ready message, the
// sale is in Redis with no pending reservation, every accepted order is
// decided (a row in MySQL, or failed in Redis: nothing will change it any
// more; whether that is enough is Evaluate's business) and, when rabbitmqctl
// is at hand, no message is unacknowledged.
type Drainer struct {
	DB      *sql.DB
	Redis   redis.Cmdable
	Prefix  string // [redis] key_prefix
	AMQPURL string
	// Queue and DeadQueue are the order queue and its dead-letter queue;
	// Partitions the other order queues (partitions 1..N-1), counted with
	// Queue.
	Queue, DeadQueue string
	Partitions       []string
	// Poll is the interval between checks (default 100ms).
	Poll time.Duration
	// Rabbitmqctl, when set, is run to read the unacknowledged count, which
	// AMQP cannot report; empty skips that check. Its counts lag by the
	// broker's statistics interval (5 s by default), so it is a second
	// opinion: the drain's real criterion is ready = 0 and Redis pending = 0
	// (a delivered, unsettled order is still pending in Redis).
	Rabbitmqctl string
	// Accepted are the order ids answered 202; the drain waits until each
	// is decided. Empty: not checked.
	Accepted []string
}

// DrainStatus is one observation.
type DrainStatus struct {
	Ready        int   `json:"queue_ready"`
	Unacked      int   `json:"queue_unacked"` // -1: unknown
	Dead         int   `json:"dead_lettered"`
	Pending      int64 `json:"redis_pending"`
	MySQLOrders  int64 `json:"mysql_orders"`
	UnackedKnown bool  `json:"unacked_known"`
	// SaleMissing: Redis has no such sale (lost; waiting for a rebuild).
	SaleMissing bool `json:"sale_missing,omitempty"`
	// Undecided counts accepted orders neither in MySQL nor failed in Redis
	// (only looked at once the queue and Redis are empty).
	Undecided int `json:"undecided,omitempty"`
}

func (s DrainStatus) String() string {
	switch {
	case s.SaleMissing:
		return fmt.Sprintf("%d ready, sale missing in Redis", s.Ready)
	case s.Undecided > 0:
		return fmt.Sprintf("%d ready, %d pending in Redis, %d accepted orders undecided", s.Ready, s.Pending, s.Undecided)
	}
	return fmt.Sprintf("%d ready, %d pending in Redis", s.Ready, s.Pending)
}

// Empty reports the drain complete as far as this observation sees.
func (s DrainStatus) Empty() bool {
	return s.Ready == 0 && s.Pending == 0 && !s.SaleMissing && s.Undecided == 0
}

// DrainResult is the outcome of Wait.
type DrainResult struct {
	Drained bool          `json:"drained"`
	Elapsed time.Duration `json:"-"`
	Seconds float64       `json:"seconds"`
	// Orders is how many orders MySQL gained while waiting; Rate per second.
	Orders int64       `json:"orders"`
	Rate   float64     `json:"orders_per_second"`
	Start  DrainStatus `json:"start"`
	Final  DrainStatus `json:"final"`
	// Problem says why the wait stopped without a drain.
	Problem string `json:"problem,omitempty"`
}

// Wait polls until drained or timeout; tick, when set, sees every observation.
// A service that cannot be read is tried again until the timeout (a fault test
// drains across a restart); Wait returns an error when the services could not
// be read by then, or at once when the queue does not exist.
func (d *Drainer) Wait(ctx context.Context, activityID int64, timeout time.Duration, tick func(DrainStatus, time.Duration)) (DrainResult, error) {
	poll := d.Poll
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	q := &broker.QueueProbe{URL: d.AMQPURL}
	defer q.Close()

	start := time.Now()
	deadline := start.Add(timeout)
	var res DrainResult
	first := true
	// drainedAt is when the drain was first seen complete: the first of the
	// empty observations that ended the wait. The rabbitmqctl second opinion
	// that follows one boots an Erlang VM (1–2 s of CPU on this box) and its
	// count lags by the broker's statistics interval, so it may take several
	// rounds to agree; that is not drain time (an empty observation already
	// means every accepted order decided and settled, hence acked): counting
	// it made the drain rate and the end-to-end confirmed rate look slower.
	var drainedAt time.Duration
	emptySince := time.Duration(-1)
	for {
		st, err := d.observe(ctx, q, activityID)
		if err != nil {
			emptySince = -1 // unseen meanwhile: the drain counts from the next empty look
			if errors.Is(err, broker.ErrNoQueue) || time.Now().After(deadline) {
				return res, err
			}
			q.Close()
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(poll):
			}
			continue
		}
		if first {
			res.Start, first = st, false
		}
		res.Final = st
		elapsed := time.Since(start)
		if tick != nil {
			tick(st, elapsed)
		}
		if !st.Empty() {
			emptySince = -1
		} else if emptySince < 0 {
			emptySince = elapsed
		}
		if st.Empty() {
			unacked, known, err := d.unacked(ctx)
			if err != nil {
				res.Problem = err.Error()
			}
			res.Final.Unacked, res.Final.UnackedKnown = unacked, known
			if !known || unacked == 0 {
				res.Drained = true
				drainedAt = emptySince
				break
			}
		}
		if time.Now().After(deadline) {
			res.Problem = fmt.Sprintf("not drained after %s: %s", timeout, st)
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(poll):
		}
	}
	res.Elapsed = time.Since(start)
	if res.Drained {
		res.Elapsed = drainedAt
	}
	res.Seconds = res.Elapsed.Seconds()
	res.Orders = res.Final.MySQLOrders - res.Start.MySQLOrders
	if res.Seconds > 0 {
		res.Rate = float64(res.Orders) / res.Seconds
	}
	return res, nil
}

func (d *Drainer) observe(ctx context.Context, q *broker.QueueProbe, id int64) (DrainStatus, error) {
	st := DrainStatus{Unacked: -1}
	var err error
	for _, name := range append([]string{d.Queue}, d.Partitions...) {
		n, err := q.Ready(name)
		if err != nil {
			return st, fmt.Errorf("drain: %w (is the backend running with this [rabbitmq] prefix and partitions?)", err)
		}
		st.Ready += n
	}
	if d.DeadQueue != "" {
		if st.Dead, err = q.Ready(d.DeadQueue); err != nil {
			return st, fmt.Errorf("drain: %w", err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sale, found, err := reservation.New(d.Redis, d.Prefix).Sale(cctx, id)
	switch {
	case err != nil:
		return st, fmt.Errorf("drain: read pending: %w", err)
	case !found:
		st.SaleMissing = true
	default:
		st.Pending = sale.Pending // every shard's
	}
	if err := d.DB.QueryRowContext(cctx, "SELECT COUNT(*) FROM orders WHERE activity_id = ?", id).Scan(&st.MySQLOrders); err != nil {
		return st, fmt.Errorf("drain: count orders: %w", err)
	}
	if st.Ready == 0 && st.Pending == 0 && !st.SaleMissing && len(d.Accepted) > 0 {
		if st.Undecided, err = d.undecided(cctx, id); err != nil {
			return st, err
		}
	}
	return st, nil
}

// undecided counts the accepted orders that have no MySQL row and are not
// failed in Redis.
func (d *Drainer) undecided(ctx context.Context, id int64) (int, error) {
	n := 0
	for start := 0; start < len(d.Accepted); start += 500 {
		chunk := d.Accepted[start:min(start+500, len(d.Accepted))]
		args := make([]any, len(chunk))
		for i, x := range chunk {
			args[i] = x
		}
		rows, err := d.DB.QueryContext(ctx, "SELECT order_id FROM orders WHERE order_id IN (?"+strings.Repeat(",?", len(chunk)-1)+")", args...)
		if err != nil {
			return 0, fmt.Errorf("drain: look up accepted orders: %w", err)
		}
		have := map[string]bool{}
		for rows.Next() {
			var oid string
			if err := rows.Scan(&oid); err != nil {
				_ = rows.Close()
				return 0, fmt.Errorf("drain: look up accepted orders: %w", err)
			}
			have[oid] = true
		}
		_ = rows.Close()
		if err := rows.Err(); err != nil {
			return 0, fmt.Errorf("drain: look up accepted orders: %w", err)
		}
		var rest []string
		for _, oid := range chunk {
			if !have[oid] {
				rest = append(rest, oid)
			}
		}
		if len(rest) == 0 {
			continue
		}
		recs, err := reservation.New(d.Redis, d.Prefix).Records(ctx, id, rest)
		if err != nil {
			return 0, fmt.Errorf("drain: read order records: %w", err)
		}
		for _, rec := range recs {
			if rec.State != reservation.Failed {
				n++
			}
		}
	}
	return n, nil
}

// unacked asks rabbitmqctl for the queue's unacknowledged messages.
func (d *Drainer) unacked(ctx context.Context) (int, bool, error) {
	if d.Rabbitmqctl == "" {
		return -1, false, nil
	}
	vhost := "/"
	if u, err := url.Parse(d.AMQPURL); err == nil && u.Path != "" && u.Path != "/" {
		vhost = strings.TrimPrefix(u.Path, "/")
		if v, err := url.PathUnescape(vhost); err == nil {
			vhost = v
		}
	}
	const bound = 20 * time.Second
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	cmd := exec.CommandContext(cctx, d.Rabbitmqctl, "list_queues", "-p", vhost, "--quiet", "--no-table-headers",
		"name", "messages_unacknowledged")
	// The context's kill ends rabbitmqctl, not a helper the Erlang VM
	// started that may still hold its stdout: without WaitDelay, Output
	// would wait for that one too.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		if cctx.Err() != nil && ctx.Err() == nil {
			return -1, false, fmt.Errorf("rabbitmqctl list_queues: no answer within %v: %w", bound, err)
		}
		return -1, false, fmt.Errorf("rabbitmqctl list_queues: %w", err)
	}
	total := 0
	for _, name := range append([]string{d.Queue}, d.Partitions...) {
		n, ok, err := parseUnacked(string(out), name)
		if err != nil || !ok {
			return n, ok, err
		}
		total += n
	}
	return total, true, nil
}

func parseUnacked(out, queue string) (int, bool, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == queue {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				return -1, false, fmt.Errorf("rabbitmqctl: bad count in %q", line)
			}
			return n, true, nil
		}
	}
	return -1, false, fmt.Errorf("rabbitmqctl: queue %s not listed", queue)
}
