package room

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writeKey(t testing.TB, dir, name, key string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	keyA = "0123456789abcdef0123456789abcdef-A"
	keyB = "0123456789abcdef0123456789abcdef-B"
)

func testRing(t testing.TB) (*Keyring, string) {
	t.Helper()
	p := writeKey(t, t.TempDir(), "k", keyA)
	kr, err := LoadKeyring(p)
	if err != nil {
		t.Fatal(err)
	}
	return kr, p
}

func TestTicketRoundTrip(t *testing.T) {
	kr, _ := testRing(t)
	now := time.UnixMilli(1_700_000_000_000)
	in := Ticket{Kind: KindPlace, Room: RoomHash("r"), Identity: IdentityHash("a:1"), Place: 42, Arrival: now.UnixMilli(), Expires: now.Add(time.Minute).UnixMilli()}
	s := kr.Sign(in)
	if len(s) != MaxTicketBytes {
		t.Fatalf("ticket is %d bytes, want %d", len(s), MaxTicketBytes)
	}
	out, err := kr.Parse([]byte(s), now)
	if err != nil || out != in {
		t.Fatalf("parse = %+v, %v; want %+v", out, err, in)
	}
}

// Every way to tamper with a ticket is refused with its reason: a bit
// flipped anywhere (payload or MAC), a forged one signed with another key,
// an expired one, garbage of every length.
func TestTicketRefused(t *testing.T) {
	kr, _ := testRing(t)
	now := time.UnixMilli(1_700_000_000_000)
	good := Ticket{Kind: KindAdmission, Room: 1, Identity: 2, Place: 3, Arrival: 4, Expires: now.Add(time.Second).UnixMilli()}
	s := kr.Sign(good)
	raw, _ := base64.RawURLEncoding.DecodeString(s)
	for i := range raw {
		for bit := 0; bit < 8; bit++ {
			b := append([]byte(nil), raw...)
			b[i] ^= 1 << bit
			if _, err := kr.Parse([]byte(base64.RawURLEncoding.EncodeToString(b)), now); err == nil {
				t.Fatalf("byte %d bit %d flipped: accepted", i, bit)
			}
		}
	}
	other, _ := LoadKeyring(writeKey(t, t.TempDir(), "o", keyB))
	if _, err := kr.Parse([]byte(other.Sign(good)), now); Reason(err) != ReasonUnknownKey {
		t.Errorf("signed with another key: %v, want %s", err, ReasonUnknownKey)
	}
	if _, err := kr.Parse([]byte(s), now.Add(time.Second)); Reason(err) != ReasonExpired {
		t.Errorf("at its expiry: %v, want %s", err, ReasonExpired)
	}
	for _, bad := range []string{"", "x", s[:len(s)-1], s + "A", "!" + s[1:], string(make([]byte, MaxTicketBytes))} {
		if _, err := kr.Parse([]byte(bad), now); Reason(err) != ReasonMalformed {
			t.Errorf("%q: %v, want %s", bad, err, ReasonMalformed)
		}
	}
	// A MAC copied onto another payload (the same key id) is a forgery.
	forged := append([]byte(nil), raw...)
	forged[22+7]++ // place 3 -> 4
	if _, err := kr.Parse([]byte(base64.RawURLEncoding.EncodeToString(forged)), now); Reason(err) != ReasonSignature {
		t.Errorf("place changed: %v, want %s", err, ReasonSignature)
	}
}

// A rotated key signs from then on; tickets of the one before are accepted
// for the grace period only; the same key again changes nothing.
func TestKeyRotation(t *testing.T) {
	kr, path := testRing(t)
	now := time.UnixMilli(1_700_000_000_000)
	tk := Ticket{Kind: KindPlace, Place: 1, Expires: now.Add(time.Hour).UnixMilli()}
	old := kr.Sign(tk)
	if err := kr.Rotate(path, time.Minute, now); err != nil {
		t.Fatal(err)
	}
	if _, err := kr.Parse([]byte(old), now); err != nil {
		t.Fatalf("same key again: %v", err)
	}
	writeKey(t, filepath.Dir(path), "k", keyB)
	if err := kr.Rotate(path, time.Minute, now); err != nil {
		t.Fatal(err)
	}
	if kr.Sign(tk) == old {
		t.Fatal("new key does not sign")
	}
	if _, err := kr.Parse([]byte(old), now.Add(59*time.Second)); err != nil {
		t.Errorf("old key within grace: %v", err)
	}
	if _, err := kr.Parse([]byte(old), now.Add(61*time.Second)); Reason(err) != ReasonUnknownKey {
		t.Errorf("old key after grace: %v, want %s", err, ReasonUnknownKey)
	}
	writeKey(t, filepath.Dir(path), "k", "short")
	if err := kr.Rotate(path, time.Minute, now); err == nil {
		t.Error("short key accepted")
	}
}

// FuzzTicketParse: no input panics the parser, and whatever it accepts
// re-encodes to itself (nothing but a signed ticket is accepted).
func FuzzTicketParse(f *testing.F) {
	kr, _ := testRing(f)
	now := time.UnixMilli(1_700_000_000_000)
	f.Add([]byte(kr.Sign(Ticket{Kind: KindPlace, Place: 7, Expires: now.Add(time.Hour).UnixMilli()})))
	f.Add([]byte(kr.Sign(Ticket{Kind: KindAdmission, Room: 9, Expires: now.Add(time.Hour).UnixMilli()})))
	f.Add([]byte(""))
	f.Add([]byte("AAAA"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tk, err := kr.Parse(b, now)
		if err != nil {
			if Reason(err) == "" {
				t.Fatalf("error without a reason: %v", err)
			}
			return
		}
		if s := kr.Sign(tk); s != string(b) {
			t.Fatalf("accepted %q, which re-signs as %q", b, s)
		}
	})
}
