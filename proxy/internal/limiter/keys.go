package limiter

import (
	"crypto/sha256"
	"encoding/hex"
)

// maxKeyInput bounds the header or cookie value hashed into a client key;
// longer values are cut (a value that long is not an identity worth telling
// apart from its first 4 KiB).
const maxKeyInput = 4096

// appendClientKey appends the client key of a per-client window: "a:<addr>"
// for the address, or "h:"/"c:" and the first 16 bytes (hex) of
// SHA-256(name, 0, value) for a header or cookie. Hashing keeps secrets such
// as bearer tokens out of Redis, bounds the key's length, and keeps braces out
// of the hash tag; the prefixes keep a header value from posing as an address.
// A missing or empty header or cookie falls back to the address, and so
// does one nobody vouches for (Request.Trusted, Request.Verified).
func appendClientKey(dst []byte, w *Window, req Request) []byte {
	var v []byte
	if w.Source != FromAddress && req.Header != nil && (req.Trusted || req.Verified.covers(w)) {
		if w.Source == FromHeader {
			v = req.Header.PeekBytes(w.Name)
		} else {
			v = req.Header.CookieBytes(w.Name)
		}
	}
	if len(v) == 0 {
		dst = append(dst, "a:"...)
		return append(dst, req.Addr...)
	}
	if len(v) > maxKeyInput {
		v = v[:maxKeyInput]
	}
	// Hash name, 0, value without a heap buffer.
	var buf [64 + 1 + maxKeyInput]byte
	n := copy(buf[:], w.Name)
	buf[n] = 0
	n++
	n += copy(buf[n:], v)
	sum := sha256.Sum256(buf[:n])
	if w.Source == FromHeader {
		dst = append(dst, "h:"...)
	} else {
		dst = append(dst, "c:"...)
	}
	return hex.AppendEncode(dst, sum[:16])
}
