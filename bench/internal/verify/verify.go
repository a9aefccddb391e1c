// Package verify checks the invariants of DESIGN.md §3 (I1–I5) for one sale,
// directly against MySQL (the truth) and Redis (the accelerator), after the
// queue has drained. It reads only; it never repairs anything.
package verify

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/salesdb"
)

// Accepted is one 202 answer the load generator saw: the order id it was
// given for a user's Idempotency-Key. Replays (the same key answered again)
// appear once per answer; that is expected and checked for consistency.
type Accepted struct {
	OrderID string `json:"order_id"`
	UserID  string `json:"user_id"`
	Key     string `json:"idempotency_key"`
}

// APIState is what GET /api/v1/activities/{id} answered after the drain.
type APIState struct {
	State     string `json:"state"`
	Available int64  `json:"available"`
	Pending   int64  `json:"pending"`
	Sold      int64  `json:"sold"`
	Stock     int64  `json:"stock"`
}

// Input is what the run knows about the sale it ran.
type Input struct {
	ActivityID int64
	// Stock and Limit as the sale was created; 0 takes MySQL's values.
	Stock, Limit int64
	Accepted     []Accepted
	// API, when set, is checked against the final state (I5: "sold out" only
	// while no unit is left).
	API *APIState
}

// Verdict is the outcome; the counters are the fields of the verdict line.
type Verdict struct {
	OK         bool     `json:"ok"`
	Sold       int64    `json:"sold"`
	Stock      int64    `json:"stock"`
	Oversold   int64    `json:"oversold"`
	OverLimit  int64    `json:"over_limit"`
	Duplicates int64    `json:"duplicates"`
	Lost       int64    `json:"lost"`
	Pending    int64    `json:"pending"`
	Reasons    []string `json:"reasons,omitempty"`
	// Facts beside the verdict, for the report.
	ConfirmedOrders int64            `json:"confirmed_orders"`
	FailedOrders    int64            `json:"failed_orders"`
	FailReasons     map[string]int64 `json:"failed_reasons,omitempty"`
	AcceptedOrders  int64            `json:"accepted_orders"`
	Notes           []string         `json:"notes,omitempty"`
}

// Line is the verdict line of DESIGN.md §5.
func (v Verdict) Line() string {
	word := "ok"
	if !v.OK {
		word = "FAIL"
	}
	return fmt.Sprintf("verdict: %s sold=%d/%d oversold=%d over_limit=%d duplicates=%d lost=%d pending=%d",
		word, v.Sold, v.Stock, v.Oversold, v.OverLimit, v.Duplicates, v.Lost, v.Pending)
}

func (v *Verdict) fail(format string, args ...any) {
	v.Reasons = append(v.Reasons, fmt.Sprintf(format, args...))
}

// maxListed bounds how many examples one reason names.
const maxListed = 5

// Checker reads one stack's MySQL database and Redis key space.
type Checker struct {
	DB     *sql.DB
	Redis  redis.Cmdable
	Prefix string // [redis] key_prefix
}

// Check verifies I1–I5 for in.ActivityID. An error means the check could not
// be made (a service unreachable), not that the sale is broken.
func (c *Checker) Check(ctx context.Context, in Input) (Verdict, error) {
	var v Verdict
	act, err := c.activity(ctx, in.ActivityID)
	if err != nil {
		return v, err
	}
	v.Stock = in.Stock
	if v.Stock == 0 {
		v.Stock = act.total
	}
	limit := in.Limit
	if limit == 0 {
		limit = act.limit
	}
	if !act.found {
		v.fail("activity %d is not in MySQL", in.ActivityID)
	} else {
		if act.total != v.Stock {
			v.fail("MySQL total_stock is %d, the sale was created with %d", act.total, v.Stock)
		}
		if act.limit != limit {
			v.fail("MySQL per_user_limit is %d, the sale was created with %d", act.limit, limit)
		}
		if act.stock+act.sold != act.total || act.stock < 0 {
			v.fail("MySQL activity row is inconsistent: stock %d + sold %d != total_stock %d", act.stock, act.sold, act.total)
		}
	}

	orders, err := c.orders(ctx, in.ActivityID)
	if err != nil {
		return v, err
	}
	v.FailReasons = map[string]int64{}
	confirmedUnits := int64(0)
	perUser := map[string]int64{}
	byKey := map[string][]string{}
	for _, o := range orders {
		switch o.status {
		case "confirmed":
			v.ConfirmedOrders++
			confirmedUnits += o.qty
			perUser[o.user] += o.qty
		case "failed":
			v.FailedOrders++
			v.FailReasons[o.reason]++
		}
		// An order released after a failed publish was answered 503 (nothing
		// kept), so the client's retry with the same key is a new attempt.
		if o.key != "" && !(o.status == "failed" && o.reason == "released") {
			k := o.user + "\x00" + o.key
			byKey[k] = append(byKey[k], o.id)
		}
	}
	v.Sold = confirmedUnits

	// I1 no oversell: confirmed units (and MySQL's own counter) ≤ stock.
	top := max(confirmedUnits, act.sold)
	if top > v.Stock {
		v.Oversold = top - v.Stock
		v.fail("oversold: %d units confirmed (activities.sold %d) for a stock of %d", confirmedUnits, act.sold, v.Stock)
	}
	if act.found && act.sold != confirmedUnits {
		v.fail("MySQL disagrees with itself: activities.sold %d, confirmed orders sum to %d", act.sold, confirmedUnits)
	}

	// I2 per-user limit, by orders and by the purchases table.
	purchases, err := c.purchases(ctx, in.ActivityID)
	if err != nil {
		return v, err
	}
	over := map[string]int64{}
	for u, n := range perUser {
		if n > limit {
			over[u] = n
		}
	}
	for u, n := range purchases {
		if n > limit && n > over[u] {
			over[u] = n
		}
	}
	if len(over) > 0 {
		v.OverLimit = int64(len(over))
		v.fail("over the per-user limit of %d: %s", limit, listMap(over))
	}
	if d := diffMaps(perUser, purchases); len(d) > 0 {
		v.fail("purchases table disagrees with confirmed orders for %d users: %s", len(d), listStrings(d))
	}

	// I3 no duplicates: a key that produced two orders in MySQL, a key that was
	// answered with two order ids, an order id given to two keys.
	var dupKeys []string
	for k, ids := range byKey {
		if len(ids) > 1 {
			sort.Strings(ids)
			dupKeys = append(dupKeys, strings.Replace(k, "\x00", ":", 1)+" -> "+strings.Join(ids, ","))
		}
	}
	if len(dupKeys) > 0 {
		v.Duplicates += int64(len(dupKeys))
		v.fail("idempotency keys that produced two or more orders in MySQL: %s", listStrings(dupKeys))
	}
	keyToOrder := map[string]string{}
	orderToKey := map[string]string{}
	var keyConflicts, orderConflicts []string
	accepted := map[string]Accepted{}
	for _, a := range in.Accepted {
		k := a.UserID + ":" + a.Key
		if prev, ok := keyToOrder[k]; ok && prev != a.OrderID {
			keyConflicts = append(keyConflicts, k+" -> "+prev+","+a.OrderID)
		} else if !ok {
			keyToOrder[k] = a.OrderID
		}
		if prev, ok := orderToKey[a.OrderID]; ok && prev != k {
			orderConflicts = append(orderConflicts, a.OrderID+" <- "+prev+" and "+k)
		} else if !ok {
			orderToKey[a.OrderID] = k
		}
		if _, ok := accepted[a.OrderID]; !ok {
			accepted[a.OrderID] = a
		}
	}
	if len(keyConflicts) > 0 {
		v.Duplicates += int64(len(keyConflicts))
		v.fail("a retried Idempotency-Key got a different order id: %s", listStrings(keyConflicts))
	}
	if len(orderConflicts) > 0 {
		v.Duplicates += int64(len(orderConflicts))
		v.fail("one order id was given to different purchases: %s", listStrings(orderConflicts))
	}
	v.AcceptedOrders = int64(len(accepted))

	// I4 nothing lost: every accepted order is in MySQL, for its user and
	// activity, confirmed or failed with a reason.
	byID := make(map[string]order, len(orders))
	for _, o := range orders {
		byID[o.id] = o
	}
	var missing []string
	var elsewhere []string
	for _, id := range sortedKeys(accepted) {
		a := accepted[id]
		o, ok := byID[id]
		if !ok {
			missing = append(missing, id)
			continue
		}
		if o.user != a.UserID {
			elsewhere = append(elsewhere, fmt.Sprintf("%s (user %s, accepted for %s)", id, o.user, a.UserID))
			continue
		}
		if o.status == "failed" && o.reason == "" {
			elsewhere = append(elsewhere, id+" (failed without a reason)")
		}
	}
	if len(missing) > 0 {
		// Maybe written under another activity: say so, it is still lost here.
		other, err := c.otherActivity(ctx, in.ActivityID, missing)
		if err != nil {
			return v, err
		}
		v.Lost += int64(len(missing))
		msg := fmt.Sprintf("accepted (202) orders missing in MySQL: %s", listStrings(missing))
		if other > 0 {
			msg += fmt.Sprintf(" (%d of them under another activity)", other)
		}
		v.fail("%s", msg)
	}
	if len(elsewhere) > 0 {
		v.Lost += int64(len(elsewhere))
		v.fail("accepted orders recorded wrongly in MySQL: %s", listStrings(elsewhere))
	}

	// Redis: pending and convergence (I4, I5).
	if err := c.checkRedis(ctx, in.ActivityID, act, confirmedUnits, purchases, byID, &v); err != nil {
		return v, err
	}

	// I5, seen from the API: "sold out" only while no unit is left.
	if in.API != nil {
		left := v.Stock - confirmedUnits
		if in.API.State == "sold_out" && left > 0 && v.Pending == 0 {
			v.fail("the API says sold_out while %d units are left and none is pending", left)
		}
		if in.API.Sold != confirmedUnits || in.API.Pending != v.Pending {
			v.fail("the API reports sold %d pending %d, MySQL/Redis have sold %d pending %d",
				in.API.Sold, in.API.Pending, confirmedUnits, v.Pending)
		}
	}
	v.OK = len(v.Reasons) == 0
	return v, nil
}

func (c *Checker) checkRedis(ctx context.Context, id int64, act activity, confirmed int64,
	purchases map[string]int64, byID map[string]order, v *Verdict) error {
	k := reservation.KeysFor(c.Prefix, id)
	store := reservation.New(c.Redis, c.Prefix)
	sale, found, err := store.Sale(ctx, id)
	if err != nil {
		return err
	}
	var pendingRecs []string
	stateMismatch := []string{}
	missingRecs := 0
	recs := map[string]reservation.Record{}
	var cursor uint64
	for {
		kv, next, err := c.Redis.HScan(ctx, k.Orders, cursor, "", 1000).Result()
		if err != nil {
			return fmt.Errorf("scan %s: %w", k.Orders, err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			rec, err := reservation.ParseRecord(kv[i], kv[i+1])
			if err != nil {
				v.fail("unreadable reservation record: %v", err)
				continue
			}
			recs[kv[i]] = rec
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	for _, oid := range sortedKeys(recs) {
		rec := recs[oid]
		switch rec.State {
		case reservation.Pending, reservation.Claimed:
			pendingRecs = append(pendingRecs, oid+"="+rec.State.String())
		}
		o, ok := byID[oid]
		switch {
		case !ok && (rec.State == reservation.Confirmed):
			stateMismatch = append(stateMismatch, oid+" confirmed in Redis, absent in MySQL")
		case ok && o.status == "confirmed" && rec.State == reservation.Failed:
			stateMismatch = append(stateMismatch, oid+" confirmed in MySQL, failed in Redis")
		case ok && o.status == "failed" && rec.State == reservation.Confirmed:
			stateMismatch = append(stateMismatch, oid+" failed in MySQL, confirmed in Redis")
		}
	}
	for oid := range byID {
		if _, ok := recs[oid]; !ok {
			missingRecs++
		}
	}
	deadlines, err := c.Redis.ZCard(ctx, k.Deadlines).Result()
	if err != nil {
		return fmt.Errorf("zcard %s: %w", k.Deadlines, err)
	}
	v.Pending = max(int64(len(pendingRecs)), deadlines)
	if found {
		v.Pending = max(v.Pending, sale.Pending)
	}
	if v.Pending > 0 {
		v.fail("reservations still pending after the drain: meta pending %d, %d records P/C (%s), %d deadlines",
			sale.Pending, len(pendingRecs), listStrings(pendingRecs), deadlines)
	}
	if !found {
		v.fail("the sale is missing in Redis (%s)", k.Meta)
		return nil
	}
	// I5 convergence.
	if sale.Total != act.total {
		v.fail("Redis total %d, MySQL total_stock %d", sale.Total, act.total)
	}
	if sale.Sold != confirmed || sale.Sold != act.sold {
		v.fail("Redis sold %d, MySQL sold %d (confirmed orders %d)", sale.Sold, act.sold, confirmed)
	}
	if sale.Limit != act.limit {
		v.fail("Redis per-user limit %d, MySQL %d", sale.Limit, act.limit)
	}
	if len(stateMismatch) > 0 {
		v.fail("order states disagree between Redis and MySQL: %s", listStrings(stateMismatch))
	}
	users, err := c.Redis.HGetAll(ctx, k.Users).Result()
	if err != nil {
		return fmt.Errorf("hgetall %s: %w", k.Users, err)
	}
	held := make(map[string]int64, len(users))
	for u, s := range users {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			v.fail("Redis %s has a bad count %q for user %s", k.Users, s, u)
			continue
		}
		if n != 0 {
			held[u] = n
		}
	}
	if v.Pending == 0 {
		if d := diffMaps(held, purchases); len(d) > 0 {
			v.fail("per-user units disagree between Redis and MySQL for %d users: %s", len(d), listStrings(d))
		}
	}
	if missingRecs > 0 {
		v.Notes = append(v.Notes, fmt.Sprintf("%d MySQL orders have no Redis record (Redis lost them; MySQL decides)", missingRecs))
	}
	return nil
}

type activity struct {
	found                     bool
	total, stock, sold, limit int64
}

func (c *Checker) activity(ctx context.Context, id int64) (activity, error) {
	var a activity
	err := c.DB.QueryRowContext(ctx,
		"SELECT total_stock, stock, sold, per_user_limit FROM activities WHERE id = ?", id).
		Scan(&a.total, &a.stock, &a.sold, &a.limit)
	if errors.Is(err, sql.ErrNoRows) {
		return a, nil
	}
	if err != nil {
		return a, fmt.Errorf("read activity %d: %w", id, err)
	}
	a.found = true
	return a, nil
}

type order struct {
	id, user, status, reason, key string
	qty                           int64
}

func (c *Checker) orders(ctx context.Context, id int64) ([]order, error) {
	rows, err := c.DB.QueryContext(ctx,
		"SELECT order_id, user_id, quantity, status, COALESCE(reason, ''), COALESCE(idempotency_key, '') FROM orders WHERE activity_id = ?", id)
	if err != nil {
		return nil, fmt.Errorf("read orders of activity %d: %w", id, err)
	}
	defer rows.Close()
	var out []order
	for rows.Next() {
		var o order
		if err := rows.Scan(&o.id, &o.user, &o.qty, &o.status, &o.reason, &o.key); err != nil {
			return nil, fmt.Errorf("read orders of activity %d: %w", id, err)
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read orders of activity %d: %w", id, err)
	}
	return out, nil
}

func (c *Checker) purchases(ctx context.Context, id int64) (map[string]int64, error) {
	users, err := salesdb.Users(ctx, c.DB, id)
	if err != nil {
		return nil, err
	}
	for u, n := range users {
		if n == 0 {
			delete(users, u)
		}
	}
	return users, nil
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

func diffMaps(a, b map[string]int64) []string {
	var d []string
	for k, x := range a {
		if y := b[k]; x != y {
			d = append(d, fmt.Sprintf("%s %d/%d", k, x, y))
		}
	}
	for k, y := range b {
		if _, ok := a[k]; !ok && y != 0 {
			d = append(d, fmt.Sprintf("%s 0/%d", k, y))
		}
	}
	sort.Strings(d)
	return d
}

func listMap(m map[string]int64) string {
	s := make([]string, 0, len(m))
	for k, n := range m {
		s = append(s, fmt.Sprintf("%s holds %d", k, n))
	}
	sort.Strings(s)
	return listStrings(s)
}

func listStrings(s []string) string {
	if len(s) <= maxListed {
		return strings.Join(s, "; ")
	}
	return strings.Join(s[:maxListed], "; ") + fmt.Sprintf("; and %d more", len(s)-maxListed)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
