package token

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/seckill/seckill/conf"
)

// The cache serves a verified token again without a signature check, but
// never past its exp (plus leeway), never a token that failed, and never
// more than its bound.
func TestCache(t *testing.T) {
	k := testKeyset(t)
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	v, err := newVerifier(conf.JWT{Header: "Authorization", Alg: "HS256", KeyFile: k.hsFile, Claim: "sub", Leeway: conf.D(10 * time.Second)},
		func() time.Time { return time.Unix(0, clock.Load()) })
	if err != nil {
		t.Fatal(err)
	}
	tok := []byte(sign(t, jwt.SigningMethodHS256, k.hs, claims("exp", now.Add(time.Minute).Unix())))
	if u, err := v.Verify(tok); err != nil || u != "user-1" {
		t.Fatalf("first Verify = %q, %v", u, err)
	}
	// Take the key away: only the cache can still answer.
	v.key = []byte("a-different-key-a-different-key-!!")
	if u, err := v.Verify(tok); err != nil || u != "user-1" {
		t.Fatalf("cached Verify = %q, %v", u, err)
	}
	clock.Store(now.Add(time.Minute + 9*time.Second).UnixNano())
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("within the leeway after exp: %v", err)
	}
	clock.Store(now.Add(time.Minute + 10*time.Second).UnixNano())
	if u, err := v.Verify(tok); err == nil {
		t.Fatalf("expired token served from the cache as %q", u)
	}

	// A failure is not remembered: with the right key back, the same bytes
	// verify (they failed only for the key).
	clock.Store(now.UnixNano())
	other := []byte(sign(t, jwt.SigningMethodHS256, k.hs, claims("sub", "user-2")))
	if _, err := v.Verify(other); err == nil {
		t.Fatal("verified with the wrong key")
	}
	v.key = k.hs
	if u, err := v.Verify(other); err != nil || u != "user-2" {
		t.Fatalf("after a failure: %q, %v", u, err)
	}

	c := newCache()
	until := now.Add(time.Hour)
	for i := range 3 * cacheShards * cachePerShard {
		c.put([]byte(fmt.Sprintf("tok-%d", i)), "u", until, now)
	}
	n := 0
	for i := range c.shards {
		n += len(c.shards[i].m)
	}
	if n > cacheShards*cachePerShard {
		t.Fatalf("cache holds %d entries, bound %d", n, cacheShards*cachePerShard)
	}
}
