package room

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"os"
	"sync"
	"time"
)

// A ticket is what a client carries between polls: its place in a room's
// line, or its admission. It is signed (HMAC-SHA256, truncated to 16
// bytes) so a client cannot make one up or change one; it names the room
// and a hash of the identity it was issued to, so it is worth nothing in
// another room or to another client. The line itself lives in Redis: a
// ticket only saves the proxy a Redis call per poll, and a client that
// drops it gets its identity's place back from Redis.
//
// Wire form: base64url (no padding) of version(1) kind(1) key id(4)
// room(8) identity(8) place(8) arrival ms(8) expiry ms(8), then the MAC.

// Ticket kinds.
const (
	KindPlace     byte = 'P' // a place in line (0: the pre-queue)
	KindAdmission byte = 'A' // admitted until Expires
)

const (
	ticketVersion = 1
	payloadLen    = 1 + 1 + 4 + 8 + 8 + 8 + 8 + 8
	macLen        = 16
	ticketLen     = payloadLen + macLen
	// MaxTicketBytes bounds what is decoded: a longer value is refused
	// unread.
	MaxTicketBytes = (ticketLen*8 + 5) / 6
)

// Ticket is a decoded ticket.
type Ticket struct {
	Kind     byte
	Room     uint64 // RoomHash of the room
	Identity uint64 // IdentityHash of the client
	Place    int64
	Arrival  int64 // ms, when the place was given (Redis time)
	Expires  int64 // ms
}

// Reasons a ticket is refused (the bad-ticket metric's label).
const (
	ReasonMalformed     = "malformed"
	ReasonSignature     = "bad_signature" // forged or modified
	ReasonUnknownKey    = "unknown_key"   // signed with a key no longer (or never) accepted
	ReasonExpired       = "expired"
	ReasonOtherRoom     = "other_room"
	ReasonOtherIdentity = "other_identity"
	ReasonStale         = "stale" // a place the line has passed
)

// TicketError is why a ticket was refused.
type TicketError struct{ Reason string }

func (e *TicketError) Error() string { return "ticket: " + e.Reason }

func refuse(reason string) error { return &TicketError{Reason: reason} }

// Reason returns the reason of a ticket error ("" for nil).
func Reason(err error) string {
	var te *TicketError
	if errors.As(err, &te) {
		return te.Reason
	}
	if err != nil {
		return ReasonMalformed
	}
	return ""
}

// hash64 is the first 8 bytes of SHA-256 of tag and s: stable across
// instances and builds (tickets cross instances). Built on the stack for
// the usual lengths: it runs on every poll.
func hash64(tag, s string) uint64 {
	var buf [160]byte
	b := append(append(buf[:0], tag...), s...)
	h := sha256.Sum256(b)
	return binary.BigEndian.Uint64(h[:8])
}

// RoomHash identifies a room in its tickets.
func RoomHash(name string) uint64 { return hash64("room\x00", name) }

// IdentityHash identifies a client in its tickets.
func IdentityHash(id string) uint64 { return hash64("id\x00", id) }

type key struct {
	id     uint32
	secret []byte
	until  time.Time // zero: current
	// macs pools the key's HMAC states: hmac.New costs more than the MAC
	// of a ticket.
	macs *sync.Pool
}

func newKey(id uint32, secret []byte) key {
	return key{id: id, secret: secret, macs: &sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}}
}

// mac appends the ticket MAC of payload to dst.
func (k key) mac(dst, payload []byte) []byte {
	m := k.macs.Get().(hash.Hash)
	m.Reset()
	m.Write(payload)
	var sum [sha256.Size]byte
	out := append(dst, m.Sum(sum[:0])[:macLen]...)
	k.macs.Put(m)
	return out
}

// Keyring holds the signing key and, for a grace period after a rotation,
// the one before it.
type Keyring struct {
	mu       sync.RWMutex
	cur      key
	prev     key
	hasPrev  bool
	fileName string
}

// MinKeyBytes is the shortest ticket key accepted.
const MinKeyBytes = 32

// LoadKeyring reads the key file.
func LoadKeyring(path string) (*Keyring, error) {
	k, err := readKey(path)
	if err != nil {
		return nil, err
	}
	return &Keyring{cur: k, fileName: path}, nil
}

func readKey(path string) (key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return key{}, err
	}
	b = bytes.TrimSpace(b)
	if len(b) < MinKeyBytes {
		return key{}, fmt.Errorf("%s holds %d bytes, needs at least %d (e.g. openssl rand -hex 32)", path, len(b), MinKeyBytes)
	}
	h := sha256.Sum256(b)
	return newKey(binary.BigEndian.Uint32(h[:4]), b), nil
}

// Rotate reads path again; when it holds a new key, that key signs from
// now on and the previous one is still accepted until now + grace. The
// same key again changes nothing (a SIGHUP that touched other settings).
func (r *Keyring) Rotate(path string, grace time.Duration, now time.Time) error {
	k, err := readKey(path)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fileName = path
	if k.id == r.cur.id && bytes.Equal(k.secret, r.cur.secret) {
		return nil
	}
	r.prev, r.hasPrev = r.cur, grace > 0
	r.prev.until = now.Add(grace)
	r.cur = k
	return nil
}

// Sign encodes t with the current key.
func (r *Keyring) Sign(t Ticket) string {
	r.mu.RLock()
	k := r.cur
	r.mu.RUnlock()
	var buf [ticketLen]byte
	p := buf[:payloadLen]
	p[0], p[1] = ticketVersion, t.Kind
	binary.BigEndian.PutUint32(p[2:], k.id)
	binary.BigEndian.PutUint64(p[6:], t.Room)
	binary.BigEndian.PutUint64(p[14:], t.Identity)
	binary.BigEndian.PutUint64(p[22:], uint64(t.Place))
	binary.BigEndian.PutUint64(p[30:], uint64(t.Arrival))
	binary.BigEndian.PutUint64(p[38:], uint64(t.Expires))
	k.mac(buf[:payloadLen], p)
	return b64.EncodeToString(buf[:])
}

// Parse decodes and verifies a ticket at now (ms): its signature, its key
// and its expiry. The room and identity are the caller's to compare.
func (r *Keyring) Parse(s []byte, now time.Time) (Ticket, error) {
	if len(s) != MaxTicketBytes {
		return Ticket{}, refuse(ReasonMalformed)
	}
	var buf [ticketLen + 2]byte
	n, err := b64.Decode(buf[:], s)
	if err != nil || n != ticketLen {
		return Ticket{}, refuse(ReasonMalformed)
	}
	p := buf[:payloadLen]
	if p[0] != ticketVersion || (p[1] != KindPlace && p[1] != KindAdmission) {
		return Ticket{}, refuse(ReasonMalformed)
	}
	kid := binary.BigEndian.Uint32(p[2:])
	r.mu.RLock()
	var k key
	switch {
	case kid == r.cur.id:
		k = r.cur
	case r.hasPrev && kid == r.prev.id && now.Before(r.prev.until):
		k = r.prev
	}
	r.mu.RUnlock()
	if k.secret == nil {
		return Ticket{}, refuse(ReasonUnknownKey)
	}
	var sum [macLen]byte
	if !hmac.Equal(k.mac(sum[:0], p), buf[payloadLen:ticketLen]) {
		return Ticket{}, refuse(ReasonSignature)
	}
	t := Ticket{
		Kind:     p[1],
		Room:     binary.BigEndian.Uint64(p[6:]),
		Identity: binary.BigEndian.Uint64(p[14:]),
		Place:    int64(binary.BigEndian.Uint64(p[22:])),
		Arrival:  int64(binary.BigEndian.Uint64(p[30:])),
		Expires:  int64(binary.BigEndian.Uint64(p[38:])),
	}
	if t.Place < 0 || t.Expires <= now.UnixMilli() {
		if t.Place < 0 {
			return Ticket{}, refuse(ReasonMalformed)
		}
		return Ticket{}, refuse(ReasonExpired)
	}
	return t, nil
}

// b64 is strict: the unused low bits of the last character must be zero,
// so one ticket has one spelling (a changed character is a changed ticket).
var b64 = base64.RawURLEncoding.Strict()
