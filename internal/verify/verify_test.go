package verify

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/seckill/seckill/internal/reservation"
)

// healthy is a finished sale as the workers leave it: 10 units, limit 2;
// u1..u5 bought one unit each, u6 two, u7's order failed (expired); nothing
// pending; u1's key was answered twice (a replay).
func healthy() (State, Input) {
	st := State{
		MySQL: MySQLState{Found: true, Total: 10, Stock: 3, Sold: 7, Limit: 2, Purchases: map[string]int64{}},
		Redis: RedisState{Found: true, Total: 10, Sold: 7, Limit: 2,
			Records: map[string]reservation.Record{}, Users: map[string]int64{}},
	}
	in := Input{ActivityID: 42, Stock: 10, Limit: 2}
	add := func(id, user, key string, qty int64, status, reason string) {
		st.MySQL.Orders = append(st.MySQL.Orders, Order{ID: id, User: user, Key: key, Quantity: qty, Status: status, Reason: reason})
		state := reservation.Failed
		if status == "confirmed" {
			state = reservation.Confirmed
			st.MySQL.Purchases[user] += qty
			st.Redis.Users[user] += qty
		}
		st.Redis.Records[id] = reservation.Record{OrderID: id, State: state, Quantity: qty, UserID: user, Reason: reason}
		in.Accepted = append(in.Accepted, Accepted{OrderID: id, UserID: user, Key: key})
	}
	for i := 1; i <= 5; i++ {
		add(fmt.Sprintf("o%d", i), fmt.Sprintf("u%d", i), fmt.Sprintf("k%d", i), 1, "confirmed", "")
	}
	add("o6", "u6", "k6", 2, "confirmed", "")
	add("o7", "u7", "k7", 1, "failed", "expired")
	in.Accepted = append(in.Accepted, Accepted{OrderID: "o1", UserID: "u1", Key: "k1"})
	in.API = &APIState{State: "open", Stock: 10, Sold: 7, Available: 3}
	return st, in
}

// confirm adds a confirmed order everywhere a worker would write it.
func confirm(st *State, in *Input, id, user, key string, qty int64) {
	st.MySQL.Orders = append(st.MySQL.Orders, Order{ID: id, User: user, Key: key, Quantity: qty, Status: "confirmed"})
	st.MySQL.Purchases[user] += qty
	st.MySQL.Sold += qty
	st.MySQL.Stock -= qty
	st.Redis.Sold += qty
	st.Redis.Users[user] += qty
	st.Redis.Records[id] = reservation.Record{OrderID: id, State: reservation.Confirmed, Quantity: qty, UserID: user}
	in.Accepted = append(in.Accepted, Accepted{OrderID: id, UserID: user, Key: key})
	in.API.Sold += qty
	in.API.Available -= qty
}

// Each broken state is named: the test asserts the exact set of problem
// names and the counters of the verdict line.
func TestEvaluateNamesBrokenStates(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(st *State, in *Input)
		names  []string
		// counters of the verdict line
		sold, oversold, overLimit, duplicates, lost, pending int64
	}{{
		name:   "healthy",
		break_: func(*State, *Input) {},
		sold:   7,
	}, {
		name: "oversell",
		break_: func(st *State, in *Input) {
			// Four more units past the guard: 11 of 10, the row below zero.
			for i := 8; i <= 11; i++ {
				confirm(st, in, fmt.Sprintf("o%d", i), fmt.Sprintf("u%d", i), fmt.Sprintf("k%d", i), 1)
			}
			in.API.State = "sold_out"
		},
		names: []string{ProblemOversold, ProblemStockRow},
		sold:  11, oversold: 1,
	}, {
		name: "over the per-user limit",
		break_: func(st *State, in *Input) {
			confirm(st, in, "o1b", "u1", "k1b", 2)
		},
		names: []string{ProblemOverLimit},
		sold:  9, overLimit: 1,
	}, {
		name: "one key, two orders in MySQL",
		break_: func(st *State, in *Input) {
			// u2 retried k2 and got a second order (within the limit).
			confirm(st, in, "o2bis", "u2", "k2", 1)
		},
		names: []string{ProblemDuplicateKey, ProblemKeyTwoOrders},
		sold:  8, duplicates: 2,
	}, {
		name: "a retried key answered with another order id",
		break_: func(st *State, in *Input) {
			in.Accepted = append(in.Accepted, Accepted{OrderID: "o9", UserID: "u3", Key: "k3"})
			st.MySQL.Orders = append(st.MySQL.Orders, Order{ID: "o9", User: "u3", Key: "k3x", Quantity: 1, Status: "failed", Reason: "limit_exceeded"})
			st.Redis.Records["o9"] = reservation.Record{OrderID: "o9", State: reservation.Failed, Quantity: 1, UserID: "u3", Reason: "limit_exceeded"}
		},
		names: []string{ProblemKeyTwoOrders},
		sold:  7, duplicates: 1,
	}, {
		name: "one order id for two purchases",
		break_: func(st *State, in *Input) {
			in.Accepted = append(in.Accepted, Accepted{OrderID: "o4", UserID: "u9", Key: "k9"})
		},
		names: []string{ProblemOrderTwoKeys},
		sold:  7, duplicates: 1,
	}, {
		name: "a key reused after a released (503) order is no duplicate",
		break_: func(st *State, in *Input) {
			// u2's first try with k2 was released after a failed publish and
			// answered 503; its message still reached a worker. The retry with
			// k2 is a new attempt (o2), so no problem.
			st.MySQL.Orders = append(st.MySQL.Orders, Order{ID: "o2rel", User: "u2", Key: "k2", Quantity: 1, Status: "failed", Reason: "released"})
			st.Redis.Records["o2rel"] = reservation.Record{OrderID: "o2rel", State: reservation.Failed, Quantity: 1, UserID: "u2", Reason: "released"}
		},
		sold: 7,
	}, {
		name: "lost 202",
		break_: func(st *State, in *Input) {
			in.Accepted = append(in.Accepted, Accepted{OrderID: "ghost", UserID: "u9", Key: "k9"})
		},
		names: []string{ProblemLost},
		sold:  7, lost: 1,
	}, {
		name: "a 202 failed only in Redis is lost",
		break_: func(st *State, in *Input) {
			in.Accepted = append(in.Accepted, Accepted{OrderID: "o8", UserID: "u8", Key: "k8"})
			st.Redis.Records["o8"] = reservation.Record{OrderID: "o8", State: reservation.Failed, Quantity: 1, UserID: "u8", Reason: "released"}
		},
		names: []string{ProblemLost},
		sold:  7, lost: 1,
	}, {
		name: "a 202 recorded for another user, one failed without a reason",
		break_: func(st *State, in *Input) {
			st.MySQL.Orders[6].User = "u99"
			in.Accepted = append(in.Accepted, Accepted{OrderID: "o8", UserID: "u8", Key: "k8"})
			st.MySQL.Orders = append(st.MySQL.Orders, Order{ID: "o8", User: "u8", Key: "k8", Quantity: 1, Status: "failed"})
			st.Redis.Records["o8"] = reservation.Record{OrderID: "o8", State: reservation.Failed, Quantity: 1, UserID: "u8"}
		},
		names: []string{ProblemMisrecorded},
		sold:  7, lost: 2,
	}, {
		name: "pending left",
		break_: func(st *State, in *Input) {
			st.Redis.Pending = 1
			st.Redis.Users["u8"] = 1
			st.Redis.Records["o8"] = reservation.Record{OrderID: "o8", State: reservation.Pending, Quantity: 1, UserID: "u8"}
			st.Redis.Deadlines = 1
			in.API.Pending, in.API.Available = 1, 2
		},
		names: []string{ProblemPending, ProblemAPIDrift},
		sold:  7, pending: 1,
	}, {
		name: "false sold-out in the API",
		break_: func(st *State, in *Input) {
			in.API.State = "sold_out"
		},
		names: []string{ProblemFalseSoldOut},
		sold:  7,
	}, {
		name: "false sold-out answered to a purchase",
		break_: func(st *State, in *Input) {
			in.AfterSale = &Answer{Status: 409, Code: "sold_out"}
		},
		names: []string{ProblemFalseSoldOut},
		sold:  7,
	}, {
		name: "no sold-out once nothing is left",
		break_: func(st *State, in *Input) {
			confirm(st, in, "o8", "u8", "k8", 2)
			confirm(st, in, "o9", "u9", "k9", 1)
			in.AfterSale = &Answer{Status: 503, Code: "unavailable"}
		},
		names: []string{ProblemMissedSoldOut, ProblemMissedSoldOut},
		sold:  10,
	}, {
		name: "Redis and MySQL disagree",
		break_: func(st *State, in *Input) {
			st.Redis.Sold--
			st.Redis.Records["o3"] = reservation.Record{OrderID: "o3", State: reservation.Failed, Quantity: 1, UserID: "u3", Reason: "released"}
			delete(st.Redis.Users, "u3")
			delete(st.Redis.Records, "o5")
		},
		names: []string{ProblemRedisDrift, ProblemRecordDrift, ProblemUserDrift},
		sold:  7,
	}, {
		name: "records Redis lost on purpose are a note, not drift",
		break_: func(st *State, in *Input) {
			delete(st.Redis.Records, "o5")
			in.RedisLost = true
		},
		sold: 7,
	}, {
		name: "sale missing everywhere",
		break_: func(st *State, in *Input) {
			*st = State{MySQL: MySQLState{Purchases: map[string]int64{}}}
			in.Accepted, in.API = nil, nil
		},
		names: []string{ProblemActivityMissing, ProblemRedisMissing},
	}, {
		name: "purchases table drift",
		break_: func(st *State, in *Input) {
			st.MySQL.Purchases["u4"] = 2
		},
		names: []string{ProblemPurchasesDrift, ProblemUserDrift},
		sold:  7,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, in := healthy()
			c.break_(&st, &in)
			v := Evaluate(st, in)
			for _, r := range v.Reasons {
				t.Logf("  %s", r)
			}
			var got []string
			for _, p := range v.Problems {
				got = append(got, p.Name)
				if !strings.HasPrefix(p.Invariant, "I") && p.Invariant != "setup" {
					t.Errorf("problem %v has no invariant", p)
				}
			}
			want := slices.Clone(c.names)
			sort.Strings(got)
			sort.Strings(want)
			if !slices.Equal(got, want) {
				t.Errorf("problems %q, want %q", got, want)
			}
			if v.OK != (len(c.names) == 0) {
				t.Errorf("OK = %v with problems %q", v.OK, got)
			}
			counters := [6]int64{v.Sold, v.Oversold, v.OverLimit, v.Duplicates, v.Lost, v.Pending}
			if wantC := [6]int64{c.sold, c.oversold, c.overLimit, c.duplicates, c.lost, c.pending}; counters != wantC {
				t.Errorf("sold/oversold/over_limit/duplicates/lost/pending = %v, want %v", counters, wantC)
			}
			if line := v.Line(); v.OK != strings.HasPrefix(line, "verdict: ok ") {
				t.Errorf("line %q for ok=%v", line, v.OK)
			}
		})
	}
}

func TestLine(t *testing.T) {
	v := Verdict{OK: true, Sold: 1000, Stock: 1000}
	if got, want := v.Line(), "verdict: ok sold=1000/1000 oversold=0 over_limit=0 duplicates=0 lost=0 pending=0"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	v = Verdict{Sold: 1001, Stock: 1000, Oversold: 1, OverLimit: 2, Duplicates: 3, Lost: 4, Pending: 5}
	if got, want := v.Line(), "verdict: FAIL sold=1001/1000 oversold=1 over_limit=2 duplicates=3 lost=4 pending=5"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

// TestLedger: with Ledger set, a unit sold for an order no client was
// answered 202 for (its attempt got 503, "nothing kept") breaks the client's
// contract, though every invariant of the tables holds.
func TestLedger(t *testing.T) {
	st, in := healthy()
	in.Ledger = true
	if v := Evaluate(st, in); !v.OK {
		t.Fatalf("healthy sale with the ledger: %v", v.Reasons)
	}
	confirm(&st, &in, "o8", "u8", "", 1)
	in.Accepted = in.Accepted[:len(in.Accepted)-1] // the client of o8 was told 503
	v := Evaluate(st, in)
	if v.OK || !v.Has(ProblemSoldUnanswered) || len(v.Problems) != 1 || !strings.Contains(v.Reasons[0], "o8") {
		t.Fatalf("sold behind a 503: %v", v.Reasons)
	}
	in.Ledger = false
	if v := Evaluate(st, in); !v.OK {
		t.Errorf("without the ledger (a run that cannot see every answer): %v", v.Reasons)
	}
}
