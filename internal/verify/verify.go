// Package verify is the one checker of the invariants I1–I5
// (docs/invariants.md) for a sale after its queue drained. bin/bench, the
// end-to-end tests and the fault-injection suite all report through it.
//
// It has two halves: Checker reads a State from MySQL (the truth) and Redis
// (the accelerator) and never repairs anything; Evaluate turns a State and
// what the clients were answered (Input) into a Verdict, without touching a
// service, so that broken states can be fed to it in unit tests. Drainer
// waits until there is nothing left to settle.
package verify

import (
	"fmt"
	"sort"
	"strings"

	"github.com/seckill/seckill/internal/reservation"
)

// Accepted is one 202 answer a client saw: the order id it was given for a
// user's Idempotency-Key. Replays (the same key answered again) appear once
// per answer; that is expected and checked for consistency.
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

// Answer is the final answer to one purchase attempt.
type Answer struct {
	Status int    // HTTP status
	Code   string // "code" of an error body
}

// Input is what the run knows about the sale it ran.
type Input struct {
	ActivityID int64
	// Stock and Limit as the sale was created; 0 takes MySQL's values.
	Stock, Limit int64
	Accepted     []Accepted
	// API, when set, is checked against the final state (I5).
	API *APIState
	// AfterSale, when set, is the answer to a purchase made after the drain
	// (I5: 409 sold_out exactly when no unit is left).
	AfterSale *Answer
	// Ledger is set when Accepted holds every 202 the clients were given and
	// every other attempt got a definite answer (503, 409, ...), as a test's
	// crowd records: then units sold must equal the units of the confirmed
	// orders answered 202 — a unit sold beyond them was sold on behalf of an
	// attempt told "503, nothing kept".
	Ledger bool
	// RedisLost is set when the run deleted Redis data on purpose (a FLUSHDB
	// fault): records of orders settled before the loss are gone for good
	// and MySQL answers for them; every record still present must agree.
	RedisLost bool
}

// Problem is one broken promise, named so that a test or a reader can tell
// them apart without parsing prose.
type Problem struct {
	Invariant string `json:"invariant"` // "I1".."I5", or "setup"
	Name      string `json:"name"`      // one of the Problem* names
	Detail    string `json:"detail"`
}

func (p Problem) String() string { return p.Invariant + " " + p.Name + ": " + p.Detail }

// Problem names. Each counter of the verdict line has at least one.
const (
	ProblemActivityMissing = "activity_missing"   // setup: MySQL has no such sale
	ProblemSaleMismatch    = "sale_mismatch"      // setup: MySQL's sale is not the one created
	ProblemOversold        = "oversold"           // I1: confirmed units beyond stock
	ProblemStockRow        = "stock_row"          // I1: MySQL's activity row does not balance
	ProblemOverLimit       = "over_limit"         // I2: a user holds more than the limit
	ProblemPurchasesDrift  = "purchases_drift"    // I2: purchases disagrees with confirmed orders
	ProblemDuplicateKey    = "duplicate_key"      // I3: one (user, key) produced two orders in MySQL
	ProblemKeyTwoOrders    = "key_two_order_ids"  // I3: one (user, key) was answered with two order ids
	ProblemOrderTwoKeys    = "order_two_purchase" // I3: one order id was given to two purchases
	ProblemLost            = "lost"               // I4: a 202 order is not decided in MySQL
	ProblemMisrecorded     = "misrecorded"        // I4: a 202 order is in MySQL wrongly (user, reason)
	ProblemPending         = "pending"            // I4: reservations left after the drain
	ProblemRedisMissing    = "redis_missing"      // I5: the sale is missing in Redis
	ProblemRedisDrift      = "redis_drift"        // I5: Redis counters disagree with MySQL
	ProblemRecordDrift     = "record_drift"       // I5: order records disagree with MySQL
	ProblemUserDrift       = "user_drift"         // I5: per-user units disagree with MySQL
	ProblemFalseSoldOut    = "false_sold_out"     // I5: "sold out" while units are left
	ProblemMissedSoldOut   = "missed_sold_out"    // I5: no "sold out" although nothing is left
	ProblemAPIDrift        = "api_drift"          // I5: the API's counters disagree with MySQL/Redis
	ProblemUnreadable      = "unreadable"         // a Redis value the checker cannot parse
	ProblemSoldUnanswered  = "sold_unanswered"    // ledger: units sold that no 202 names (a 503 kept something)
)

// Verdict is the outcome; the counters are the fields of the verdict line.
type Verdict struct {
	OK         bool      `json:"ok"`
	Sold       int64     `json:"sold"`
	Stock      int64     `json:"stock"`
	Oversold   int64     `json:"oversold"`
	OverLimit  int64     `json:"over_limit"`
	Duplicates int64     `json:"duplicates"`
	Lost       int64     `json:"lost"`
	Pending    int64     `json:"pending"`
	Problems   []Problem `json:"problems,omitempty"`
	// Reasons are the problems as text, in the same order.
	Reasons []string `json:"reasons,omitempty"`
	// Facts beside the verdict, for the report.
	ConfirmedOrders int64            `json:"confirmed_orders"`
	FailedOrders    int64            `json:"failed_orders"`
	FailReasons     map[string]int64 `json:"failed_reasons,omitempty"`
	AcceptedOrders  int64            `json:"accepted_orders"`
	Notes           []string         `json:"notes,omitempty"`
}

// Line is the verdict line `make demo` ends with.
func (v Verdict) Line() string {
	word := "ok"
	if !v.OK {
		word = "FAIL"
	}
	return fmt.Sprintf("verdict: %s sold=%d/%d oversold=%d over_limit=%d duplicates=%d lost=%d pending=%d",
		word, v.Sold, v.Stock, v.Oversold, v.OverLimit, v.Duplicates, v.Lost, v.Pending)
}

// Has reports whether a problem of that name was found.
func (v Verdict) Has(name string) bool {
	for _, p := range v.Problems {
		if p.Name == name {
			return true
		}
	}
	return false
}

func (v *Verdict) fail(inv, name, format string, args ...any) {
	p := Problem{Invariant: inv, Name: name, Detail: fmt.Sprintf(format, args...)}
	v.Problems = append(v.Problems, p)
	v.Reasons = append(v.Reasons, p.String())
}

// State is what the checker read about one sale.
type State struct {
	MySQL MySQLState
	Redis RedisState
}

// MySQLState is the truth: the activity row, its orders and per-user totals.
type MySQLState struct {
	Found                     bool
	Total, Stock, Sold, Limit int64
	Orders                    []Order
	// Purchases are the purchases table's non-zero per-user units.
	Purchases map[string]int64
	// Elsewhere counts accepted order ids missing here but present under
	// another activity (still lost for this sale; the count says where).
	Elsewhere int
}

// Order is one row of the orders table.
type Order struct {
	ID, User, Status, Reason, Key string
	Quantity                      int64
}

// RedisState is the accelerator's view of the sale.
type RedisState struct {
	Found                       bool
	Total, Sold, Pending, Limit int64
	Records                     map[string]reservation.Record
	// Deadlines is the size of the deadline index (tracked reservations).
	Deadlines int64
	// Users are the per-user units held (non-zero entries).
	Users      map[string]int64
	Unreadable []string
}

// maxListed bounds how many examples one problem names.
const maxListed = 5

// released is the failure reason of an order given back after a failed
// publish: its client was answered 503 and its key forgotten, so a retry with
// the same key is a new attempt, not a duplicate (docs/purchase-path.md).
const released = "released"

// Evaluate judges a State against what the clients were answered.
//
// I4's rule: an accepted order counts as decided only when MySQL holds it,
// confirmed or failed with a reason. A record that says "failed" only in
// Redis is not enough: Redis may lose it (a flush, a failover, the archive of
// a finished sale), and then the client's 202 names an order nobody can find.
func Evaluate(st State, in Input) Verdict {
	var v Verdict
	my, rd := st.MySQL, st.Redis
	v.Stock, v.FailReasons = in.Stock, map[string]int64{}
	if v.Stock == 0 {
		v.Stock = my.Total
	}
	limit := in.Limit
	if limit == 0 {
		limit = my.Limit
	}
	checkSale(&v, my, in, limit)
	for _, u := range rd.Unreadable {
		v.fail("I5", ProblemUnreadable, "%s", u)
	}

	confirmed, perUser, byID := tallyOrders(&v, my.Orders)
	v.Sold = confirmed
	checkStock(&v, my, confirmed)
	checkLimit(&v, my, perUser, limit)
	checkDuplicates(&v, my.Orders, in.Accepted)
	checkDecided(&v, my, rd, in.Accepted, byID)
	checkPending(&v, rd)
	checkConvergence(&v, my, rd, byID, in.RedisLost)
	checkAnswers(&v, my, in, confirmed)
	if in.Ledger {
		checkLedger(&v, in.Accepted, byID, confirmed)
	}
	v.OK = len(v.Problems) == 0
	return v
}

func checkSale(v *Verdict, my MySQLState, in Input, limit int64) {
	if !my.Found {
		v.fail("setup", ProblemActivityMissing, "activity %d is not in MySQL", in.ActivityID)
		return
	}
	if my.Total != v.Stock {
		v.fail("setup", ProblemSaleMismatch, "MySQL total_stock is %d, the sale was created with %d", my.Total, v.Stock)
	}
	if my.Limit != limit {
		v.fail("setup", ProblemSaleMismatch, "MySQL per_user_limit is %d, the sale was created with %d", my.Limit, limit)
	}
}

func tallyOrders(v *Verdict, orders []Order) (int64, map[string]int64, map[string]Order) {
	var units int64
	perUser := map[string]int64{}
	byID := make(map[string]Order, len(orders))
	for _, o := range orders {
		byID[o.ID] = o
		switch o.Status {
		case "confirmed":
			v.ConfirmedOrders++
			units += o.Quantity
			perUser[o.User] += o.Quantity
		case "failed":
			v.FailedOrders++
			v.FailReasons[o.Reason]++
		}
	}
	return units, perUser, byID
}

// checkStock is I1: confirmed units (and MySQL's own counter) ≤ stock, and
// the guard row balances.
func checkStock(v *Verdict, my MySQLState, confirmed int64) {
	if top := max(confirmed, my.Sold); top > v.Stock {
		v.Oversold = top - v.Stock
		v.fail("I1", ProblemOversold, "%d units confirmed (activities.sold %d) for a stock of %d", confirmed, my.Sold, v.Stock)
	}
	if !my.Found {
		return
	}
	if my.Stock+my.Sold != my.Total || my.Stock < 0 {
		v.fail("I1", ProblemStockRow, "MySQL activity row: stock %d + sold %d != total_stock %d", my.Stock, my.Sold, my.Total)
	}
	if my.Sold != confirmed {
		v.fail("I1", ProblemStockRow, "MySQL activities.sold %d, confirmed orders sum to %d", my.Sold, confirmed)
	}
}

// checkLimit is I2, by orders and by the purchases table.
func checkLimit(v *Verdict, my MySQLState, perUser map[string]int64, limit int64) {
	over := map[string]int64{}
	for u, n := range perUser {
		if n > limit {
			over[u] = n
		}
	}
	for u, n := range my.Purchases {
		if n > limit && n > over[u] {
			over[u] = n
		}
	}
	if len(over) > 0 {
		v.OverLimit = int64(len(over))
		s := make([]string, 0, len(over))
		for u, n := range over {
			s = append(s, fmt.Sprintf("%s holds %d", u, n))
		}
		sort.Strings(s)
		v.fail("I2", ProblemOverLimit, "over the per-user limit of %d: %s", limit, list(s))
	}
	if d := diffCounts(perUser, my.Purchases); len(d) > 0 {
		v.fail("I2", ProblemPurchasesDrift, "purchases table disagrees with confirmed orders for %d users (orders/purchases): %s", len(d), list(d))
	}
}

// checkDuplicates is I3: a key that produced two orders in MySQL, a key that
// was answered with two order ids (or with another than MySQL holds for it),
// an order id given to two purchases.
func checkDuplicates(v *Verdict, orders []Order, accepted []Accepted) {
	byKey := map[string][]string{}
	for _, o := range orders {
		if o.Key != "" && !(o.Status == "failed" && o.Reason == released) {
			k := o.User + ":" + o.Key
			byKey[k] = append(byKey[k], o.ID)
		}
	}
	var dup []string
	for _, k := range sortedKeys(byKey) {
		if ids := byKey[k]; len(ids) > 1 {
			sort.Strings(ids)
			dup = append(dup, k+" -> "+strings.Join(ids, ","))
		}
	}
	if len(dup) > 0 {
		v.Duplicates += int64(len(dup))
		v.fail("I3", ProblemDuplicateKey, "idempotency keys that produced two or more orders in MySQL: %s", list(dup))
	}

	answered := map[string]string{} // user:key -> first order id answered
	owner := map[string]string{}    // order id -> user:key
	var twoIDs, twoKeys []string
	for _, a := range accepted {
		k := a.UserID + ":" + a.Key
		if a.Key != "" {
			if prev, ok := answered[k]; ok && prev != a.OrderID {
				twoIDs = append(twoIDs, k+" -> "+prev+","+a.OrderID)
			} else if !ok {
				answered[k] = a.OrderID
				if ids := byKey[k]; len(ids) == 1 && ids[0] != a.OrderID {
					twoIDs = append(twoIDs, k+" answered "+a.OrderID+", MySQL holds "+ids[0])
				}
			}
		}
		if prev, ok := owner[a.OrderID]; ok && prev != k {
			twoKeys = append(twoKeys, a.OrderID+" <- "+prev+" and "+k)
		} else if !ok {
			owner[a.OrderID] = k
		}
	}
	if len(twoIDs) > 0 {
		v.Duplicates += int64(len(twoIDs))
		v.fail("I3", ProblemKeyTwoOrders, "a retried Idempotency-Key got a different order id: %s", list(twoIDs))
	}
	if len(twoKeys) > 0 {
		v.Duplicates += int64(len(twoKeys))
		v.fail("I3", ProblemOrderTwoKeys, "one order id was given to different purchases: %s", list(twoKeys))
	}
	v.AcceptedOrders = int64(len(owner))
}

// checkDecided is I4: every accepted order is in MySQL, for its user,
// confirmed or failed with a reason.
func checkDecided(v *Verdict, my MySQLState, rd RedisState, accepted []Accepted, byID map[string]Order) {
	seen := map[string]bool{}
	var missing, redisOnly, wrong []string
	for _, a := range accepted {
		if seen[a.OrderID] {
			continue
		}
		seen[a.OrderID] = true
		o, ok := byID[a.OrderID]
		switch {
		case !ok:
			if rec, found := rd.Records[a.OrderID]; found && rec.State == reservation.Failed {
				redisOnly = append(redisOnly, fmt.Sprintf("%s (failed %q in Redis only)", a.OrderID, rec.Reason))
			} else {
				missing = append(missing, a.OrderID)
			}
		case o.User != a.UserID:
			wrong = append(wrong, fmt.Sprintf("%s (user %s, accepted for %s)", a.OrderID, o.User, a.UserID))
		case o.Status == "failed" && o.Reason == "":
			wrong = append(wrong, a.OrderID+" (failed without a reason)")
		case o.Status != "failed" && o.Status != "confirmed":
			wrong = append(wrong, fmt.Sprintf("%s (status %q)", a.OrderID, o.Status))
		}
	}
	sort.Strings(missing)
	sort.Strings(redisOnly)
	sort.Strings(wrong)
	if len(missing) > 0 {
		v.Lost += int64(len(missing))
		msg := fmt.Sprintf("accepted (202) orders missing in MySQL: %s", list(missing))
		if my.Elsewhere > 0 {
			msg += fmt.Sprintf(" (%d of them under another activity)", my.Elsewhere)
		}
		v.fail("I4", ProblemLost, "%s", msg)
	}
	if len(redisOnly) > 0 {
		v.Lost += int64(len(redisOnly))
		v.fail("I4", ProblemLost, "accepted (202) orders decided only in Redis, which may lose them: %s", list(redisOnly))
	}
	if len(wrong) > 0 {
		v.Lost += int64(len(wrong))
		v.fail("I4", ProblemMisrecorded, "accepted orders recorded wrongly in MySQL: %s", list(wrong))
	}
}

// checkLedger is the client's contract: units sold = units of the confirmed
// orders some client was answered 202 for.
func checkLedger(v *Verdict, accepted []Accepted, byID map[string]Order, confirmed int64) {
	named := map[string]bool{}
	var units int64
	for _, a := range accepted {
		if named[a.OrderID] {
			continue
		}
		named[a.OrderID] = true
		if o, ok := byID[a.OrderID]; ok && o.Status == "confirmed" {
			units += o.Quantity
		}
	}
	if units == confirmed {
		return
	}
	var extra []string
	for id, o := range byID {
		if o.Status == "confirmed" && !named[id] {
			extra = append(extra, fmt.Sprintf("%s of %s (key %q)", id, o.User, o.Key))
		}
	}
	sort.Strings(extra)
	v.fail("ledger", ProblemSoldUnanswered, "%d units sold, the confirmed orders answered 202 hold %d; confirmed without a 202: %s",
		confirmed, units, list(extra))
}

// checkPending is I4's second half: nothing reserved is left after the drain.
func checkPending(v *Verdict, rd RedisState) {
	var open []string
	for _, id := range sortedKeys(rd.Records) {
		if s := rd.Records[id].State; s == reservation.Pending || s == reservation.Claimed {
			open = append(open, id+"="+s.String())
		}
	}
	v.Pending = max(int64(len(open)), rd.Deadlines, rd.Pending)
	if v.Pending > 0 {
		v.fail("I4", ProblemPending, "reservations still pending after the drain: meta pending %d, %d records P/C (%s), %d deadlines",
			rd.Pending, len(open), list(open), rd.Deadlines)
	}
}

// checkConvergence is I5: Redis agrees with MySQL on the sale's counters,
// each order's state and each user's units.
func checkConvergence(v *Verdict, my MySQLState, rd RedisState, byID map[string]Order, redisLost bool) {
	if !rd.Found {
		v.fail("I5", ProblemRedisMissing, "the sale is missing in Redis")
		return
	}
	if my.Found && (rd.Total != my.Total || rd.Sold != my.Sold || rd.Limit != my.Limit) {
		v.fail("I5", ProblemRedisDrift, "Redis total %d sold %d limit %d, MySQL total_stock %d sold %d limit %d",
			rd.Total, rd.Sold, rd.Limit, my.Total, my.Sold, my.Limit)
	}
	var drift []string
	missingRecs := 0
	for _, id := range sortedKeys(byID) {
		o := byID[id]
		rec, ok := rd.Records[id]
		switch {
		case !ok && redisLost:
			missingRecs++
		case !ok:
			drift = append(drift, id+" "+o.Status+" in MySQL, no record in Redis")
		case rec.State == reservation.Pending || rec.State == reservation.Claimed:
			// counted as pending
		case rec.State.Public() != o.Status:
			drift = append(drift, fmt.Sprintf("%s %s in MySQL, %s in Redis", id, o.Status, rec.State.Public()))
		}
	}
	for _, id := range sortedKeys(rd.Records) {
		if _, ok := byID[id]; !ok && rd.Records[id].State == reservation.Confirmed {
			drift = append(drift, id+" confirmed in Redis, absent in MySQL")
		}
	}
	if len(drift) > 0 {
		v.fail("I5", ProblemRecordDrift, "order states disagree between Redis and MySQL for %d orders: %s", len(drift), list(drift))
	}
	if missingRecs > 0 {
		v.Notes = append(v.Notes, fmt.Sprintf("%d MySQL orders have no Redis record (Redis lost them; MySQL decides)", missingRecs))
	}
	if v.Pending == 0 {
		if d := diffCounts(rd.Users, my.Purchases); len(d) > 0 {
			v.fail("I5", ProblemUserDrift, "per-user units disagree between Redis and MySQL for %d users (Redis/MySQL): %s", len(d), list(d))
		}
	}
}

// checkAnswers is I5 seen by clients: "sold out" only while no unit is left,
// and once nothing is left, "sold out".
func checkAnswers(v *Verdict, my MySQLState, in Input, confirmed int64) {
	left := v.Stock - confirmed
	if a := in.API; a != nil {
		switch {
		case a.State == "sold_out" && left > 0 && v.Pending == 0:
			v.fail("I5", ProblemFalseSoldOut, "the API says sold_out while %d units are left and none is pending", left)
		case a.State == "open" && left == 0 && v.Pending == 0:
			v.fail("I5", ProblemMissedSoldOut, "the API says open although all %d units are sold", v.Stock)
		}
		if a.Sold != confirmed || a.Pending != v.Pending || (my.Found && a.Available != my.Stock) {
			v.fail("I5", ProblemAPIDrift, "the API reports sold %d pending %d available %d; MySQL/Redis have sold %d pending %d left %d",
				a.Sold, a.Pending, a.Available, confirmed, v.Pending, my.Stock)
		}
	}
	if a := in.AfterSale; a != nil {
		soldOut := a.Status == 409 && a.Code == "sold_out"
		switch {
		case soldOut && left > 0 && v.Pending == 0:
			v.fail("I5", ProblemFalseSoldOut, "a purchase after the drain got 409 sold_out while %d units are left", left)
		case !soldOut && left == 0:
			v.fail("I5", ProblemMissedSoldOut, "a purchase after the sale sold out got %d %s, want 409 sold_out", a.Status, a.Code)
		}
	}
}

// diffCounts lists the users whose counts differ, as "user a/b".
func diffCounts(a, b map[string]int64) []string {
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

func list(s []string) string {
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
