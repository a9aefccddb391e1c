package edge

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

// A real browser in line: headless Chromium (its profile, so its cookie,
// kept across loads) opens the shop through the proxy while 100 API
// clients that arrived first wait ahead of it and poll as told. Each load
// shows the waiting page with fewer people ahead than the one before, the
// first with at least 50; once the line reaches it, a load gets the shop's
// own page. Screenshots of the first waiting page and of the shop are kept
// in out/test-artifacts/room-browser (servicetest.ArtifactDir).
func TestRoomInABrowser(t *testing.T) {
	t.Parallel()
	chromium := servicetest.NewChromium(t)
	s := newRoomSetup(t, conf.WaitingRoom{AdmitPerSecond: 10, MaxActive: 100_000})
	s.start(t, 2)
	cs := s.clients()
	const before = 100
	var wg sync.WaitGroup
	for i := range before {
		r := roomAsk(t, cs[i%2], "POST", purchasePath(roomAct), clientIP(i), "")
		if r.status != 429 || r.ticket == "" {
			t.Fatalf("client %d: %d (ticket %q), want 429 with a ticket", i, r.status, r.ticket)
		}
		wg.Go(func() {
			time.Sleep(time.Duration(max(r.retryAfter, 1)) * time.Second)
			politeClient(t, cs, clientIP(i), i+1, r.ticket)
		})
	}
	defer wg.Wait()

	art := servicetest.ArtifactDir(t, "room-browser")
	url := "http://" + s.pxs[0].addr + "/api/v1/activities/" + strconv.Itoa(roomAct) + "/"
	aheadRE := regexp.MustCompile(`id="ahead">(\d+)<`)
	var aheads []int
	deadline := time.Now().Add(60 * time.Second)
	for {
		dom := string(chromium.Run("--dump-dom", url))
		if strings.Contains(dom, `<h1 id="shop">shop</h1>`) {
			break
		}
		m := aheadRE.FindStringSubmatch(dom)
		if m == nil {
			t.Fatalf("load %d: neither the waiting page nor the shop: %.600s", len(aheads)+1, dom)
		}
		n, _ := strconv.Atoi(m[1])
		if len(aheads) == 0 {
			if n < 50 {
				t.Fatalf("first load: %d ahead, want at least 50 (100 arrived first)", n)
			}
			chromium.Run("--screenshot="+filepath.Join(art, "1-waiting.png"), "--window-size=800,600", url)
		} else if last := aheads[len(aheads)-1]; n >= last {
			t.Fatalf("load %d: %d ahead after %d: the line did not move (%v)", len(aheads)+1, n, last, aheads)
		}
		aheads = append(aheads, n)
		if time.Now().After(deadline) {
			t.Fatalf("not admitted within a minute; ahead at each load: %v", aheads)
		}
		time.Sleep(time.Second) // the page's own refresh is Retry-After (1 s near the front)
	}
	if len(aheads) < 3 {
		t.Fatalf("admitted after %d waiting loads, want at least 3 to see the line move: %v", len(aheads), aheads)
	}
	chromium.Run("--screenshot="+filepath.Join(art, "2-shop.png"), "--window-size=800,600", url)
	t.Logf("people ahead at each load: %v; then the shop (screenshots in %s)", aheads, art)
}
