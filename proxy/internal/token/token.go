// Package token verifies the JWT a request carries and yields the user it
// names, so that the proxy can hand the backend an X-User-ID it verified
// itself instead of one the client typed.
//
// Verification is github.com/golang-jwt/jwt/v5 restricted to one configured
// algorithm: a token whose header names another one ("none", or HS256 signed
// with an RSA public key as the secret) is refused before any key is used.
// Expiry is required; issuer and audience are checked when configured.
package token

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/ordermsg"
)

// Errors of Verify; every failure wraps one of these.
var (
	// ErrMissing: the request carries no token where one is looked for.
	ErrMissing = errors.New("no token")
	// ErrInvalid: the token is malformed, badly signed, expired, not yet
	// valid, or for another issuer or audience.
	ErrInvalid = errors.New("invalid token")
	// ErrClaim: the token is valid but its user claim is absent or not a
	// valid user id.
	ErrClaim = errors.New("no valid user claim")
)

// MinHMACKeyBytes is the shortest HS256 secret accepted (RFC 7518 §3.2: a
// key at least as long as the hash).
const MinHMACKeyBytes = 32

// MinRSABits is the smallest RSA modulus accepted.
const MinRSABits = 2048

// Verifier checks tokens of one configuration. Safe for concurrent use.
type Verifier struct {
	header []byte // header name, or nil when the token is in a cookie
	bearer bool   // header values are "Bearer <token>"
	cookie []byte
	claim  string
	parser *jwt.Parser
	method jwt.SigningMethod
	key    any
	leeway time.Duration
	now    func() time.Time
	cache  *cache
}

// New reads the key file and builds a Verifier. Errors name the key.
func New(c conf.JWT) (*Verifier, error) { return newVerifier(c, time.Now) }

// newVerifier is New with the clock that exp and nbf are checked against.
func newVerifier(c conf.JWT, now func() time.Time) (*Verifier, error) {
	v := &Verifier{claim: c.Claim, leeway: c.Leeway.Duration, now: now, cache: newCache()}
	if c.Cookie != "" {
		v.cookie = []byte(c.Cookie)
	} else {
		v.header = []byte(c.Header)
		v.bearer = strings.EqualFold(c.Header, "Authorization")
	}
	data, err := os.ReadFile(c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("proxy.identity.jwt.key_file: %w", err)
	}
	switch c.Alg {
	case "HS256":
		v.method = jwt.SigningMethodHS256
		// A secret written with echo or an editor ends in a newline that is
		// not part of it.
		secret := bytes.TrimSuffix(bytes.TrimSuffix(data, []byte("\n")), []byte("\r"))
		if len(secret) < MinHMACKeyBytes {
			return nil, fmt.Errorf("proxy.identity.jwt.key_file: an HS256 secret needs at least %d bytes, %s holds %d", MinHMACKeyBytes, c.KeyFile, len(secret))
		}
		v.key = secret
	case "RS256":
		v.method = jwt.SigningMethodRS256
		k, err := jwt.ParseRSAPublicKeyFromPEM(data)
		if err != nil {
			return nil, fmt.Errorf("proxy.identity.jwt.key_file: RS256 needs a PEM RSA public key: %w", err)
		}
		if k.N.BitLen() < MinRSABits {
			return nil, fmt.Errorf("proxy.identity.jwt.key_file: RSA key of %d bits, needs at least %d", k.N.BitLen(), MinRSABits)
		}
		v.key = k
	case "ES256":
		v.method = jwt.SigningMethodES256
		k, err := jwt.ParseECPublicKeyFromPEM(data)
		if err != nil {
			return nil, fmt.Errorf("proxy.identity.jwt.key_file: ES256 needs a PEM ECDSA public key: %w", err)
		}
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("proxy.identity.jwt.key_file: ES256 needs a P-256 key, got %s", k.Curve.Params().Name)
		}
		v.key = k
	default:
		return nil, fmt.Errorf("proxy.identity.jwt.alg: unsupported %q", c.Alg)
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods([]string{c.Alg}),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(c.Leeway.Duration),
		jwt.WithJSONNumber(),
		jwt.WithStrictDecoding(),
		jwt.WithTimeFunc(now),
	}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if c.Audience != "" {
		opts = append(opts, jwt.WithAudience(c.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// keyFunc hands out the key only to a token of the configured algorithm's
// family (WithValidMethods already refused others; this is the second lock).
func (v *Verifier) keyFunc(t *jwt.Token) (any, error) {
	ok := false
	switch v.key.(type) {
	case []byte:
		_, ok = t.Method.(*jwt.SigningMethodHMAC)
	case *rsa.PublicKey:
		_, ok = t.Method.(*jwt.SigningMethodRSA)
	case *ecdsa.PublicKey:
		_, ok = t.Method.(*jwt.SigningMethodECDSA)
	}
	if !ok || t.Method.Alg() != v.method.Alg() {
		return nil, fmt.Errorf("algorithm %v not accepted", t.Header["alg"])
	}
	return v.key, nil
}

// Source is where a request's token may be: the configured header's value
// and the Cookie header lines (both as the request has them).
type Source struct {
	Header []byte   // value of the configured header
	Cookie [][]byte // every Cookie header line
}

// HeaderName is the header the token is read from ("" when from a cookie).
func (v *Verifier) HeaderName() []byte { return v.header }

// CookieName is the cookie the token is read from ("" when from a header).
func (v *Verifier) CookieName() []byte { return v.cookie }

// Extract returns the token of a request, or nil.
func (v *Verifier) Extract(s Source) []byte {
	if v.header != nil {
		return Bearer(s.Header, v.bearer)
	}
	for _, line := range s.Cookie {
		if t := CookieValue(line, v.cookie); len(t) > 0 {
			return t
		}
	}
	return nil
}

// Bearer returns the token of an Authorization-style value: "Bearer <t>"
// (scheme in any case, surrounding white space ignored). With requireScheme
// false a bare token is taken too. Anything but one token68 (RFC 9110
// §11.2; a JWT is one) is no token.
func Bearer(h []byte, requireScheme bool) []byte {
	h = bytes.TrimSpace(h)
	if len(h) > 7 && bytes.EqualFold(h[:7], []byte("bearer ")) {
		h = bytes.TrimLeft(h[7:], " \t")
	} else if requireScheme {
		return nil
	}
	if !token68(h) {
		return nil
	}
	return h
}

// token68 reports whether b is 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" /
// "+" / "/" ) *"=".
func token68(b []byte) bool {
	i := 0
	for ; i < len(b); i++ {
		c := b[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~+/", c) >= 0) {
			break
		}
	}
	if i == 0 {
		return false
	}
	for ; i < len(b); i++ {
		if b[i] != '=' {
			return false
		}
	}
	return true
}

// CookieValue returns the value of cookie name in one Cookie header line
// ("a=1; name=value"), without quotes, or nil.
func CookieValue(line, name []byte) []byte {
	for len(line) > 0 {
		var pair []byte
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			pair, line = line[:i], line[i+1:]
		} else {
			pair, line = line, nil
		}
		pair = bytes.TrimSpace(pair)
		eq := bytes.IndexByte(pair, '=')
		if eq <= 0 || !bytes.Equal(pair[:eq], name) {
			continue
		}
		val := pair[eq+1:]
		if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
			val = val[1 : len(val)-1]
		}
		if !token68(val) {
			return nil
		}
		return val
	}
	return nil
}

// maxTokenBytes bounds what is parsed: a larger token is refused unread.
const maxTokenBytes = 8 << 10

// Verify checks a token and returns the user claim, a valid X-User-ID (1–64
// of [A-Za-z0-9_.-]).
func (v *Verifier) Verify(tok []byte) (string, error) {
	if len(tok) == 0 {
		return "", ErrMissing
	}
	if len(tok) > maxTokenBytes {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrInvalid, maxTokenBytes)
	}
	now := v.now()
	if user, ok := v.cache.get(tok, now); ok {
		return user, nil
	}
	return v.verify(tok, now)
}

// verify is Verify without the cache lookup: the signature and claims
// checks, then the cache fill.
func (v *Verifier) verify(tok []byte, now time.Time) (string, error) {
	claims := jwt.MapClaims{}
	if _, err := v.parser.ParseWithClaims(string(tok), claims, v.keyFunc); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	user, ok := claimString(claims[v.claim])
	if !ok || !ordermsg.ValidUserID(user) {
		return "", fmt.Errorf("%w: claim %q", ErrClaim, v.claim)
	}
	if exp, err := claims.GetExpirationTime(); err == nil && exp != nil {
		v.cache.put(tok, user, exp.Add(v.leeway), now)
	}
	return user, nil
}

// claimString takes a string claim, or an integer one in decimal.
func claimString(c any) (string, bool) {
	switch x := c.(type) {
	case string:
		return x, true
	case json.Number:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return strconv.FormatInt(n, 10), true
		}
	}
	return "", false
}
