package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/seckill/seckill/internal/ordermsg"
)

// MaxQuantity bounds quantity before Redis is asked (ordermsg's own bound).
const MaxQuantity = 1_000_000

// MaxStock keeps stock exact in Redis's Lua numbers (doubles).
const MaxStock = 1<<53 - 1

// fieldKind says what a field's JSON value must be.
type fieldKind int

const (
	kindInt fieldKind = iota
	kindString
)

// strictObject decodes body as exactly one JSON object whose members are all
// in fields, each at most once and of its kind; integers must be written as
// integers (no fraction, no exponent). Nothing may follow the object.
func strictObject(body []byte, fields map[string]fieldKind) (ints map[string]int64, strs map[string]string, err error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, errors.New("body must be a JSON object")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, errors.New("body must be a JSON object")
	}
	ints, strs = map[string]int64{}, map[string]string{}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("malformed JSON: %v", err)
		}
		name, _ := tok.(string)
		kind, known := fields[name]
		if !known {
			return nil, nil, fmt.Errorf("unknown field %q", name)
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("field %q given twice", name)
		}
		seen[name] = true
		val, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("malformed JSON: %v", err)
		}
		switch kind {
		case kindInt:
			n, ok := val.(json.Number)
			if !ok {
				return nil, nil, fmt.Errorf("%s must be an integer", name)
			}
			v, err := parseIntLiteral(string(n))
			if err != nil {
				return nil, nil, fmt.Errorf("%s %v", name, err)
			}
			ints[name] = v
		case kindString:
			str, ok := val.(string)
			if !ok {
				return nil, nil, fmt.Errorf("%s must be a string", name)
			}
			strs[name] = str
		}
	}
	if tok, err = dec.Token(); err != nil {
		return nil, nil, fmt.Errorf("malformed JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '}' {
		return nil, nil, errors.New("malformed JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, nil, errors.New("data after the JSON object")
	}
	return ints, strs, nil
}

// parseIntLiteral accepts a JSON number written as an integer.
func parseIntLiteral(s string) (int64, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && !(i == 0 && c == '-') {
			return 0, errors.New("must be an integer")
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errors.New("is out of range")
	}
	return v, nil
}

// parseQuantity reads a purchase body: empty (quantity 1) or {"quantity": n}
// with n in 1..MaxQuantity (the activity's own limit is checked in Redis).
func parseQuantity(body []byte) (int64, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return 1, nil
	}
	ints, _, err := strictObject(body, map[string]fieldKind{"quantity": kindInt})
	if err != nil {
		return 0, err
	}
	q, ok := ints["quantity"]
	if !ok {
		return 1, nil
	}
	if q < 1 || q > MaxQuantity {
		return 0, fmt.Errorf("quantity must be between 1 and the activity's per-user limit, got %d", q)
	}
	return q, nil
}

// Spec fields of an admin body.
type spec struct {
	Stock, PerUserLimit int64
	StartsAt, EndsAt    time.Time
	// StockShards: 0 when not given (a new activity takes the configured
	// default, an existing one keeps its count).
	StockShards int
}

var specFields = map[string]fieldKind{
	"stock": kindInt, "per_user_limit": kindInt, "starts_at": kindString, "ends_at": kindString,
	"stock_shards": kindInt,
}

// optionalSpec lists the fields of an admin body that may be left out.
var optionalSpec = map[string]bool{"stock_shards": true}

// parseSpec reads an admin body: every field but stock_shards required.
func parseSpec(body []byte) (spec, error) {
	ints, strs, err := strictObject(body, specFields)
	if err != nil {
		return spec{}, err
	}
	for name, kind := range specFields {
		_, hasInt := ints[name]
		_, hasStr := strs[name]
		if !optionalSpec[name] && ((kind == kindInt && !hasInt) || (kind == kindString && !hasStr)) {
			return spec{}, fmt.Errorf("field %q is required", name)
		}
	}
	s := spec{Stock: ints["stock"], PerUserLimit: ints["per_user_limit"]}
	if s.Stock < 0 || s.Stock > MaxStock {
		return spec{}, fmt.Errorf("stock must be between 0 and %d, got %d", int64(MaxStock), s.Stock)
	}
	if s.PerUserLimit < 1 || s.PerUserLimit > MaxQuantity {
		return spec{}, fmt.Errorf("per_user_limit must be between 1 and %d, got %d", MaxQuantity, s.PerUserLimit)
	}
	if k, ok := ints["stock_shards"]; ok {
		if k < 1 || k > ordermsg.MaxShards {
			return spec{}, fmt.Errorf("stock_shards must be between 1 and %d, got %d", ordermsg.MaxShards, k)
		}
		s.StockShards = int(k)
	}
	if s.StartsAt, err = time.Parse(time.RFC3339Nano, strs["starts_at"]); err != nil {
		return spec{}, fmt.Errorf("starts_at must be an RFC 3339 time, got %q", strs["starts_at"])
	}
	if s.EndsAt, err = time.Parse(time.RFC3339Nano, strs["ends_at"]); err != nil {
		return spec{}, fmt.Errorf("ends_at must be an RFC 3339 time, got %q", strs["ends_at"])
	}
	// DATETIME(3) holds years 1000..9999; Redis holds milliseconds.
	for name, t := range map[string]time.Time{"starts_at": s.StartsAt, "ends_at": s.EndsAt} {
		if y := t.UTC().Year(); y < 1970 || y > 9999 {
			return spec{}, fmt.Errorf("%s must be between 1970 and 9999", name)
		}
	}
	if !s.StartsAt.Truncate(time.Millisecond).Before(s.EndsAt.Truncate(time.Millisecond)) {
		return spec{}, errors.New("starts_at must be before ends_at")
	}
	return s, nil
}

// parseID reads a positive 64-bit activity id written in plain decimal.
func parseID(s string) (int64, bool) {
	if s == "" || len(s) > 19 || s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	return id, err == nil && id > 0
}

// parseWait reads ?wait=: a Go duration ("5s", "500ms") or whole seconds.
// The service bounds it; here it only has to be a non-negative duration.
func parseWait(b []byte) (time.Duration, bool) {
	if len(b) == 0 || len(b) > 32 {
		return 0, false
	}
	if n, err := strconv.ParseUint(string(b), 10, 32); err == nil {
		return time.Duration(n) * time.Second, true
	}
	d, err := time.ParseDuration(string(b))
	if err != nil || d < 0 {
		return 0, false
	}
	return d, true
}
