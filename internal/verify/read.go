package verify

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
)

// Checker reads one stack's MySQL database and Redis key space.
type Checker struct {
	DB     *sql.DB
	Redis  redis.Cmdable
	Prefix string // [redis] key_prefix
}

// Check reads the sale's State and evaluates it. An error means the check
// could not be made (a service unreachable), not that the sale is broken.
func (c *Checker) Check(ctx context.Context, in Input) (Verdict, error) {
	st, err := c.Read(ctx, in.ActivityID, in.Accepted)
	if err != nil {
		return Verdict{}, err
	}
	return Evaluate(st, in), nil
}

// Read gathers what Evaluate needs; accepted only serves to say where
// missing orders went.
func (c *Checker) Read(ctx context.Context, id int64, accepted []Accepted) (State, error) {
	var st State
	var err error
	if st.MySQL, err = c.readMySQL(ctx, id, accepted); err != nil {
		return st, err
	}
	if st.Redis, err = c.readRedis(ctx, id); err != nil {
		return st, err
	}
	return st, nil
}

func (c *Checker) readMySQL(ctx context.Context, id int64, accepted []Accepted) (MySQLState, error) {
	var m MySQLState
	err := c.DB.QueryRowContext(ctx,
		"SELECT total_stock, stock, sold, per_user_limit FROM activities WHERE id = ?", id).
		Scan(&m.Total, &m.Stock, &m.Sold, &m.Limit)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return m, fmt.Errorf("read activity %d: %w", id, err)
	default:
		m.Found = true
	}
	if m.Orders, err = c.orders(ctx, id); err != nil {
		return m, err
	}
	if m.Purchases, err = salesdb.Users(ctx, c.DB, id); err != nil {
		return m, err
	}
	for u, n := range m.Purchases {
		if n == 0 {
			delete(m.Purchases, u)
		}
	}
	have := make(map[string]bool, len(m.Orders))
	for _, o := range m.Orders {
		have[o.ID] = true
	}
	var missing []string
	for _, a := range accepted {
		if !have[a.OrderID] {
			have[a.OrderID] = true
			missing = append(missing, a.OrderID)
		}
	}
	if m.Elsewhere, err = c.otherActivity(ctx, id, missing); err != nil {
		return m, err
	}
	return m, nil
}

func (c *Checker) orders(ctx context.Context, id int64) ([]Order, error) {
	rows, err := c.DB.QueryContext(ctx,
		"SELECT order_id, user_id, quantity, status, COALESCE(reason, ''), COALESCE(idempotency_key, '') FROM orders WHERE activity_id = ?", id)
	if err != nil {
		return nil, fmt.Errorf("read orders of activity %d: %w", id, err)
	}
	defer rows.Close()
	var out []Order
	for rows.Next() {
		var o Order
		if err := rows.Scan(&o.ID, &o.User, &o.Quantity, &o.Status, &o.Reason, &o.Key); err != nil {
			return nil, fmt.Errorf("read orders of activity %d: %w", id, err)
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read orders of activity %d: %w", id, err)
	}
	return out, nil
}

// otherActivity counts how many of ids exist under another activity.
func (c *Checker) otherActivity(ctx context.Context, id int64, ids []string) (int, error) {
	n := 0
	for start := 0; start < len(ids); start += 500 {
		chunk := ids[start:min(start+500, len(ids))]
		args := make([]any, 0, len(chunk)+1)
		args = append(args, id)
		for _, x := range chunk {
			args = append(args, x)
		}
		var k int
		q := "SELECT COUNT(*) FROM orders WHERE activity_id <> ? AND order_id IN (?" + strings.Repeat(",?", len(chunk)-1) + ")"
		if err := c.DB.QueryRowContext(ctx, q, args...).Scan(&k); err != nil {
			return 0, fmt.Errorf("look up lost orders: %w", err)
		}
		n += k
	}
	return n, nil
}

func (c *Checker) readRedis(ctx context.Context, id int64) (RedisState, error) {
	r := RedisState{Records: map[string]reservation.Record{}, Users: map[string]int64{}}
	store := reservation.New(c.Redis, c.Prefix)
	sale, found, err := store.Sale(ctx, id)
	if err != nil {
		return r, err
	}
	r.Found = found
	r.Total, r.Sold, r.Pending, r.Limit = sale.Total, sale.Sold, sale.Pending, sale.Limit
	shards, err := store.Shards(ctx, id)
	if err != nil {
		return r, err
	}
	if shards > 1 && found {
		// The shard totals (with no move left in flight) add up to the stock:
		// no unit was lost or made by the moves between shards.
		sum, ok, err := store.Allotted(ctx, id)
		if err != nil {
			return r, err
		}
		if ok && sum != sale.Total {
			r.Unreadable = append(r.Unreadable, fmt.Sprintf("the shard totals add up to %d, not the stock %d", sum, sale.Total))
		}
	}
	for k := 0; k < shards; k++ {
		if err := c.readShard(ctx, store, id, store.ShardKeys(id, k, shards), &r); err != nil {
			return r, err
		}
	}
	return r, nil
}

// readShard reads one stock shard's records, deadlines and users into r.
func (c *Checker) readShard(ctx context.Context, store *reservation.Store, id int64, k reservation.Keys, r *RedisState) error {
	n, err := store.ShardBuckets(ctx, id, k)
	if err != nil {
		return err
	}
	// Every bucket, and the unbucketed hashes: a record anywhere else than
	// its own bucket is reported, not lost from sight.
	for _, h := range k.Hashes(reservation.OrderBuckets, n) {
		var cursor uint64
		for {
			kv, next, err := c.Redis.HScan(ctx, h, cursor, "", 1000).Result()
			if err != nil {
				return fmt.Errorf("scan %s: %w", h, err)
			}
			for i := 0; i+1 < len(kv); i += 2 {
				rec, err := reservation.ParseRecord(kv[i], kv[i+1])
				if err != nil {
					r.Unreadable = append(r.Unreadable, fmt.Sprintf("reservation record: %v", err))
					continue
				}
				if sh, n, _ := ordermsg.ShardOf(kv[i]); sh != k.Shard || (sh > 0 && n != k.Shards) {
					r.Unreadable = append(r.Unreadable, fmt.Sprintf("order %s is in shard %d, not in the shard its id names", kv[i], k.Shard))
				}
				if want := k.Order(n, kv[i]); h != want {
					r.Unreadable = append(r.Unreadable, fmt.Sprintf("order %s is in %s, not in its bucket %s", kv[i], h, want))
				}
				r.Records[kv[i]] = rec
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	d, err := c.Redis.ZCard(ctx, k.Deadlines).Result()
	r.Deadlines += d
	if err != nil {
		return fmt.Errorf("zcard %s: %w", k.Deadlines, err)
	}
	for _, h := range k.Hashes(reservation.UserBuckets, n) {
		users, err := c.Redis.HGetAll(ctx, h).Result()
		if err != nil {
			return fmt.Errorf("hgetall %s: %w", h, err)
		}
		for u, s := range users {
			e, err := reservation.ParseUser(s)
			if err != nil {
				r.Unreadable = append(r.Unreadable, fmt.Sprintf("%s has a bad entry %q for user %s", h, s, u))
				continue
			}
			if want := k.User(n, u); h != want {
				r.Unreadable = append(r.Unreadable, fmt.Sprintf("user %s is in %s, not in its bucket %s", u, h, want))
			}
			if e.Held != 0 {
				r.Users[u] = e.Held
			}
		}
	}
	return nil
}
