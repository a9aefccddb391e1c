package soldout

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// The stock-event channel carries two payload forms.
//
//   - v1, the decimal activity id ("42"): news, the sale changed (units came
//     back, stock raised, rebuilt, edited by an admin). Every script and the
//     admin API publish it; every subscriber forgets what it knew of the sale.
//   - v2, a JSON object {"v":2,"activity_id":42,"kind":"sold_out"}: a fact
//     about the sale's state, for whoever acts on it (the proxy fetches the
//     keys that hold an order, to answer keyed purchases itself; its waiting
//     rooms stop admitting and tell everyone in line, until a read of the
//     sale's stock shows units again). Kinds:
//     "sold_out" (no unit is left: the set of keys holding an order is final
//     until the next news) and "changed" (the same meaning as v1). Fields a
//     later writer adds are ignored, so a waiting room may carry more in
//     the same version; "v" grows only when a field changes its meaning,
//     and a subscriber ignores a version above the one it knows.
//
// A subscriber older than v2 logs a v2 payload as a bad activity id and
// ignores it; nothing v2 says is needed for correctness (it is a shortcut:
// news, which clears, always goes as v1).

// EventVersion is the highest event version this build reads and writes.
const EventVersion = 2

// Event kinds.
const (
	KindChanged = "changed"
	KindSoldOut = "sold_out"
)

// Event is one stock event.
type Event struct {
	V          int    `json:"v"`
	ActivityID int64  `json:"activity_id"`
	Kind       string `json:"kind"`
}

// SoldOutEvent is the v2 payload saying activity id has no unit left.
func SoldOutEvent(id int64) string {
	return `{"v":2,"activity_id":` + strconv.FormatInt(id, 10) + `,"kind":"sold_out"}`
}

// ParseEvent decodes a payload of either form. known is false for a later
// version (ignored, not an error); an unknown kind of v2 reads as
// KindChanged, the meaning that only ever makes a subscriber forget.
func ParseEvent(payload string) (ev Event, known bool, err error) {
	if len(payload) > 0 && payload[0] != '{' {
		id, ok := ParseID([]byte(payload))
		if !ok {
			return Event{}, false, fmt.Errorf("stock event: bad activity id %q", payload)
		}
		return Event{V: 1, ActivityID: id, Kind: KindChanged}, true, nil
	}
	if err := json.Unmarshal([]byte(payload), &ev); err != nil {
		return Event{}, false, fmt.Errorf("stock event %q: %w", payload, err)
	}
	if ev.V > EventVersion {
		return ev, false, nil
	}
	if ev.V != 2 || ev.ActivityID <= 0 {
		return Event{}, false, fmt.Errorf("stock event %q: want v 2 and a positive activity_id", payload)
	}
	if ev.Kind != KindSoldOut {
		ev.Kind = KindChanged
	}
	return ev, true, nil
}
