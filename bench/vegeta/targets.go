// Command targets writes vegeta targets (JSON lines, `vegeta attack
// -format=json`) for the seckill purchase path: n purchases, each from a
// random user of a pool with a fresh Idempotency-Key.
//
//	go run ./bench/vegeta -url http://127.0.0.1:8080 -activity 42 -users 20000 -n 200000 |
//	  vegeta attack -format=json -rate 5000/s -duration 10s -lazy | vegeta report
//
// vegeta reads targets lazily (-lazy), so a large -n costs nothing up front.
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// target is one line of vegeta's JSON target format.
type target struct {
	Method string              `json:"method"`
	URL    string              `json:"url"`
	Body   string              `json:"body,omitempty"` // base64
	Header map[string][]string `json:"header"`
}

func main() {
	base := flag.String("url", "http://127.0.0.1:8080", "target base URL (a proxy)")
	activity := flag.Int64("activity", 1, "activity id")
	users := flag.Int("users", 20000, "distinct X-User-ID values")
	n := flag.Int("n", 100000, "number of targets (0: endless)")
	quantity := flag.Int("quantity", 1, "units per purchase")
	flag.Parse()
	if err := write(os.Stdout, strings.TrimRight(*base, "/"), *activity, *users, *n, *quantity); err != nil {
		fmt.Fprintln(os.Stderr, "targets:", err)
		os.Exit(1)
	}
}

func write(w io.Writer, base string, activity int64, users, n, quantity int) error {
	if users < 1 || quantity < 1 || n < 0 {
		return fmt.Errorf("users and quantity must be positive, n not negative")
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	url := fmt.Sprintf("%s/api/v1/activities/%d/purchase", base, activity)
	body := base64.StdEncoding.EncodeToString([]byte(`{"quantity":` + strconv.Itoa(quantity) + `}`))
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := 0; n == 0 || i < n; i++ {
		t := target{Method: http.MethodPost, URL: url, Body: body, Header: map[string][]string{
			"Content-Type":    {"application/json"},
			"X-User-ID":       {"u" + strconv.Itoa(rand.IntN(users))},
			"Idempotency-Key": {"vegeta-" + run + "-" + strconv.Itoa(i)},
		}}
		if err := enc.Encode(&t); err != nil {
			return err // a closed pipe ends an endless stream
		}
	}
	return bw.Flush()
}
