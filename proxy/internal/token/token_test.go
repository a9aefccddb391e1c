package token

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/seckill/seckill/conf"
)

// now is the verifiers' clock in these tests.
var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

type keys struct {
	hs          []byte
	rsa, rsa2   *rsa.PrivateKey
	ec, ec2     *ecdsa.PrivateKey
	rsaPEM      []byte // public
	ecPEM       []byte // public
	dir         string
	hsFile      string
	rsaFile     string
	ecFile      string
	smallRSAPEM []byte
}

var (
	keysOnce sync.Once
	testKeys keys
)

func pubPEM(t testing.TB, pub any) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func testKeyset(t testing.TB) *keys {
	keysOnce.Do(func() {
		k := &testKeys
		var err error
		k.hs = []byte("0123456789abcdef0123456789abcdef-hs")
		if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			t.Fatal(err)
		}
		if k.rsa2, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			t.Fatal(err)
		}
		if k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
		if k.ec2, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
		small, err := rsa.GenerateKey(rand.Reader, 1024)
		if err != nil {
			t.Fatal(err)
		}
		k.rsaPEM, k.ecPEM, k.smallRSAPEM = pubPEM(t, &k.rsa.PublicKey), pubPEM(t, &k.ec.PublicKey), pubPEM(t, &small.PublicKey)
		d, err := os.MkdirTemp("", "token-test-")
		if err != nil {
			t.Fatal(err)
		}
		k.dir = d
		k.hsFile, k.rsaFile, k.ecFile = filepath.Join(d, "hs"), filepath.Join(d, "rsa.pem"), filepath.Join(d, "ec.pem")
		for f, b := range map[string][]byte{k.hsFile: append(append([]byte{}, k.hs...), '\n'), k.rsaFile: k.rsaPEM, k.ecFile: k.ecPEM} {
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	})
	return &testKeys
}

func TestMain(m *testing.M) {
	code := m.Run()
	if testKeys.dir != "" {
		_ = os.RemoveAll(testKeys.dir)
	}
	os.Exit(code)
}

func verifier(t testing.TB, c conf.JWT) *Verifier {
	t.Helper()
	if c.Header == "" && c.Cookie == "" {
		c.Header = "Authorization"
	}
	if c.Claim == "" {
		c.Claim = "sub"
	}
	v, err := newVerifier(c, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func sign(t testing.TB, m jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claims(extra ...any) jwt.MapClaims {
	c := jwt.MapClaims{"sub": "user-1", "iss": "shop", "aud": "seckill",
		"exp": now.Add(time.Hour).Unix(), "iat": now.Add(-time.Minute).Unix()}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == nil {
			delete(c, extra[i].(string))
		} else {
			c[extra[i].(string)] = extra[i+1]
		}
	}
	return c
}

func TestVerify(t *testing.T) {
	k := testKeyset(t)
	hs := verifier(t, conf.JWT{Alg: "HS256", KeyFile: k.hsFile, Issuer: "shop", Audience: "seckill", Leeway: conf.D(30 * time.Second)})
	rs := verifier(t, conf.JWT{Alg: "RS256", KeyFile: k.rsaFile, Issuer: "shop", Audience: "seckill"})
	es := verifier(t, conf.JWT{Alg: "ES256", KeyFile: k.ecFile})
	uid := verifier(t, conf.JWT{Alg: "HS256", KeyFile: k.hsFile, Claim: "uid"})

	good := sign(t, jwt.SigningMethodHS256, k.hs, claims())
	parts := strings.Split(good, ".")
	forged, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claims()).SignedString(jwt.UnsafeAllowNoneSignatureType)
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"admin","exp":9999999999}`)) + "." + parts[2]

	for _, tc := range []struct {
		name string
		v    *Verifier
		tok  string
		user string // "" : refused
		err  error
	}{
		{"HS256 valid", hs, good, "user-1", nil},
		{"RS256 valid", rs, sign(t, jwt.SigningMethodRS256, k.rsa, claims()), "user-1", nil},
		{"ES256 valid", es, sign(t, jwt.SigningMethodES256, k.ec, claims()), "user-1", nil},
		{"other claim", uid, sign(t, jwt.SigningMethodHS256, k.hs, claims("uid", "u.2_x-3")), "u.2_x-3", nil},
		{"numeric claim", uid, sign(t, jwt.SigningMethodHS256, k.hs, claims("uid", 12345)), "12345", nil},
		{"expired within leeway", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("exp", now.Add(-20*time.Second).Unix())), "user-1", nil},

		{"expired", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("exp", now.Add(-time.Minute).Unix())), "", ErrInvalid},
		{"expired, no leeway", rs, sign(t, jwt.SigningMethodRS256, k.rsa, claims("exp", now.Add(-time.Second).Unix())), "", ErrInvalid},
		{"no exp", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("exp", nil)), "", ErrInvalid},
		{"not yet valid", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("nbf", now.Add(time.Minute).Unix())), "", ErrInvalid},
		{"nbf within leeway", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("nbf", now.Add(20*time.Second).Unix())), "user-1", nil},
		{"wrong issuer", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("iss", "evil")), "", ErrInvalid},
		{"no issuer", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("iss", nil)), "", ErrInvalid},
		{"wrong audience", rs, sign(t, jwt.SigningMethodRS256, k.rsa, claims("aud", "other-service")), "", ErrInvalid},
		{"audience list without ours", rs, sign(t, jwt.SigningMethodRS256, k.rsa, claims("aud", []string{"a", "b"})), "", ErrInvalid},
		{"audience list with ours", rs, sign(t, jwt.SigningMethodRS256, k.rsa, claims("aud", []string{"a", "seckill"})), "user-1", nil},

		{"alg none", hs, forged, "", ErrInvalid},
		{"alg none against RS", rs, forged, "", ErrInvalid},
		// The classic confusion: HS256 keyed with the RSA public key, which
		// the attacker has.
		{"HS256 with the RSA public key", rs, sign(t, jwt.SigningMethodHS256, k.rsaPEM, claims()), "", ErrInvalid},
		{"HS256 with the EC public key", es, sign(t, jwt.SigningMethodHS256, k.ecPEM, claims()), "", ErrInvalid},
		{"RS256 to an HS verifier", hs, sign(t, jwt.SigningMethodRS256, k.rsa, claims()), "", ErrInvalid},
		{"HS512 same secret", hs, sign(t, jwt.SigningMethodHS512, k.hs, claims()), "", ErrInvalid},
		{"PS256 same RSA key", rs, sign(t, jwt.SigningMethodPS256, k.rsa, claims()), "", ErrInvalid},
		{"ES384-less: ES256 to RS verifier", rs, sign(t, jwt.SigningMethodES256, k.ec, claims()), "", ErrInvalid},

		{"wrong HS secret", hs, sign(t, jwt.SigningMethodHS256, []byte("another-secret-of-32-bytes-------"), claims()), "", ErrInvalid},
		{"wrong RSA key", rs, sign(t, jwt.SigningMethodRS256, k.rsa2, claims()), "", ErrInvalid},
		{"wrong EC key", es, sign(t, jwt.SigningMethodES256, k.ec2, claims()), "", ErrInvalid},
		{"tampered payload", hs, tampered, "", ErrInvalid},
		{"signature of another token", hs, parts[0] + "." + parts[1] + "." + strings.Split(sign(t, jwt.SigningMethodHS256, k.hs, claims("sub", "x")), ".")[2], "", ErrInvalid},

		{"empty", hs, "", "", ErrMissing},
		{"one part", hs, "abc", "", ErrInvalid},
		{"two parts", hs, parts[0] + "." + parts[1], "", ErrInvalid},
		{"four parts", hs, good + ".x", "", ErrInvalid},
		{"not base64", hs, "%%%." + parts[1] + "." + parts[2], "", ErrInvalid},
		{"padded base64", hs, parts[0] + "." + parts[1] + "==." + parts[2], "", ErrInvalid},
		{"header not JSON", hs, base64.RawURLEncoding.EncodeToString([]byte("alg")) + "." + parts[1] + "." + parts[2], "", ErrInvalid},
		{"payload an array", hs, sign(t, jwt.SigningMethodHS256, k.hs, nil), "", ErrInvalid},
		{"oversized", hs, good + strings.Repeat("A", 9<<10), "", ErrInvalid},

		{"no user claim", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("sub", nil)), "", ErrClaim},
		{"user claim with a space", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("sub", "a b")), "", ErrClaim},
		{"user claim too long", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("sub", strings.Repeat("a", 65))), "", ErrClaim},
		{"user claim an object", hs, sign(t, jwt.SigningMethodHS256, k.hs, claims("sub", map[string]any{"id": 1})), "", ErrClaim},
		{"user claim a fraction", uid, sign(t, jwt.SigningMethodHS256, k.hs, claims("uid", 1.5)), "", ErrClaim},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, err := tc.v.Verify([]byte(tc.tok))
			if tc.user != "" {
				if err != nil || user != tc.user {
					t.Fatalf("Verify = %q, %v; want %q", user, err, tc.user)
				}
				return
			}
			if err == nil {
				t.Fatalf("Verify accepted it as %q", user)
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("Verify error %v; want %v", err, tc.err)
			}
		})
	}
}

func TestNewRefusesWeakKeys(t *testing.T) {
	k := testKeyset(t)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		c    conf.JWT
		want string
	}{
		{"short HS secret", conf.JWT{Alg: "HS256", KeyFile: write("short", []byte("0123456789abcdef0123456789abcde\n"))}, "at least 32 bytes"},
		{"missing file", conf.JWT{Alg: "HS256", KeyFile: filepath.Join(dir, "none")}, "proxy.identity.jwt.key_file"},
		{"RS256 with a secret", conf.JWT{Alg: "RS256", KeyFile: k.hsFile}, "PEM RSA public key"},
		{"RS256 with an EC key", conf.JWT{Alg: "RS256", KeyFile: k.ecFile}, "PEM RSA public key"},
		{"ES256 with an RSA key", conf.JWT{Alg: "ES256", KeyFile: k.rsaFile}, "PEM ECDSA public key"},
		{"RSA 1024", conf.JWT{Alg: "RS256", KeyFile: write("small.pem", k.smallRSAPEM)}, "needs at least 2048"},
		{"alg none", conf.JWT{Alg: "none", KeyFile: k.hsFile}, "proxy.identity.jwt.alg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.Header, tc.c.Claim = "Authorization", "sub"
			_, err := New(tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error %v; want %q", err, tc.want)
			}
		})
	}
}

func TestExtract(t *testing.T) {
	k := testKeyset(t)
	h := verifier(t, conf.JWT{Alg: "HS256", KeyFile: k.hsFile})
	x := verifier(t, conf.JWT{Alg: "HS256", KeyFile: k.hsFile, Header: "X-Token"})
	c := verifier(t, conf.JWT{Alg: "HS256", KeyFile: k.hsFile, Cookie: "session"})
	for _, tc := range []struct {
		name string
		v    *Verifier
		s    Source
		want string
	}{
		{"bearer", h, Source{Header: []byte("Bearer abc.def.ghi")}, "abc.def.ghi"},
		{"bearer any case, spaces", h, Source{Header: []byte("  bEaReR   abc.def.ghi  ")}, "abc.def.ghi"},
		{"Authorization needs the scheme", h, Source{Header: []byte("abc.def.ghi")}, ""},
		{"basic", h, Source{Header: []byte("Basic dXNlcjpwYXNz")}, ""},
		{"bearer empty", h, Source{Header: []byte("Bearer ")}, ""},
		{"two tokens", h, Source{Header: []byte("Bearer a.b.c, Bearer d.e.f")}, ""},
		{"space inside", h, Source{Header: []byte("Bearer a.b c")}, ""},
		{"other header bare", x, Source{Header: []byte("abc.def.ghi")}, "abc.def.ghi"},
		{"other header bearer", x, Source{Header: []byte("Bearer abc.def.ghi")}, "abc.def.ghi"},
		{"header ignored for cookie", c, Source{Header: []byte("Bearer a.b.c")}, ""},
		{"cookie", c, Source{Cookie: [][]byte{[]byte("a=1; session=abc.def.ghi; b=2")}}, "abc.def.ghi"},
		{"cookie quoted", c, Source{Cookie: [][]byte{[]byte(`session="abc.def.ghi"`)}}, "abc.def.ghi"},
		{"cookie second line", c, Source{Cookie: [][]byte{[]byte("a=1"), []byte("session=t")}}, "t"},
		{"cookie name is exact", c, Source{Cookie: [][]byte{[]byte("xsession=t; Session=u")}}, ""},
		{"cookie empty", c, Source{Cookie: [][]byte{[]byte("session=")}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(tc.v.Extract(tc.s)); got != tc.want {
				t.Fatalf("Extract = %q, want %q", got, tc.want)
			}
		})
	}
}

// FuzzExtract: whatever the header and cookie bytes, extraction never
// panics, returns a part of its input, and never a value with white space,
// a comma, a semicolon or a quote in it (so it cannot smuggle a second
// value).
func FuzzExtract(f *testing.F) {
	for _, s := range []string{"Bearer a.b.c", "bearer  x", "Bearer", "Basic x", " Bearer a b", "session=a.b.c; x=1", `session="q"`, "session", ";;=;"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, got := range [][]byte{Bearer(in, true), Bearer(in, false), CookieValue(in, []byte("session"))} {
			if got == nil {
				continue
			}
			if len(got) == 0 || !strings.Contains(string(in), string(got)) {
				t.Fatalf("extracted %q from %q", got, in)
			}
			if strings.ContainsAny(string(got), " \t;,\"") {
				t.Fatalf("extracted %q (separator inside) from %q", got, in)
			}
		}
	})
}

// FuzzVerify: no input but the one signed token verifies — mutations of it
// (re-encodings, extra parts, swapped segments) are all refused.
func FuzzVerify(f *testing.F) {
	k := testKeyset(f)
	v := verifier(f, conf.JWT{Alg: "HS256", KeyFile: k.hsFile, Issuer: "shop", Audience: "seckill"})
	good := sign(f, jwt.SigningMethodHS256, k.hs, claims())
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claims()).SignedString(jwt.UnsafeAllowNoneSignatureType)
	for _, s := range []string{good, none, "a.b.c", good + "=", strings.ToUpper(good)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, tok []byte) {
		user, err := v.Verify(tok)
		if err == nil && string(tok) != good {
			t.Fatalf("verified %q as %q", tok, user)
		}
		if err == nil && user != "user-1" {
			t.Fatalf("good token gave user %q", user)
		}
	})
}

// BenchmarkVerify is the signature and claims check of one token (a cache
// miss); BenchmarkServeJWT in package edge has the whole request path.
func BenchmarkVerify(b *testing.B) {
	k := testKeyset(b)
	for _, tc := range []struct {
		alg string
		m   jwt.SigningMethod
		key any
		f   string
	}{
		{"HS256", jwt.SigningMethodHS256, k.hs, k.hsFile},
		{"RS256", jwt.SigningMethodRS256, k.rsa, k.rsaFile},
		{"ES256", jwt.SigningMethodES256, k.ec, k.ecFile},
	} {
		b.Run(tc.alg, func(b *testing.B) {
			v := verifier(b, conf.JWT{Alg: tc.alg, KeyFile: tc.f})
			tok := []byte(sign(b, tc.m, tc.key, claims()))
			b.ReportAllocs()
			for b.Loop() {
				// Uncached: what a token's first request costs.
				if _, err := v.verify(tok, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
