package conf

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// Duration is a time.Duration written as a string in TOML ("250ms", "2s").
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q (want e.g. \"250ms\", \"2s\")", b)
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// D is shorthand for building a Duration in code.
func D(v time.Duration) Duration { return Duration{v} }

func checkPositive(p *problems, key string, d Duration) {
	if d.Duration <= 0 {
		p.add(key, "must be a positive duration, got %q", d.String())
	}
}

func checkNonNegative(p *problems, key string, d Duration) {
	if d.Duration < 0 {
		p.add(key, "must not be negative, got %q", d.String())
	}
}

func checkRange(p *problems, key string, v, lo, hi int) {
	if v < lo || v > hi {
		p.add(key, "must be between %d and %d, got %d", lo, hi, v)
	}
}

func checkListen(p *problems, key, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		p.add(key, "must be host:port, got %q", addr)
		return
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		p.add(key, "invalid port in %q", addr)
	}
	if host != "" && net.ParseIP(host) == nil && host != "localhost" {
		p.add(key, "host must be an IP address or localhost, got %q", host)
	}
}

func keyIndex(key string, i int) string { return key + "[" + strconv.Itoa(i) + "]" }
