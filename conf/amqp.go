package conf

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ParseAMQPURLs parses the broker addresses of [rabbitmq] url (and
// SECKILL_AMQP_URL): one URL, several comma-separated URLs, or one URL
// naming several hosts, which share its credentials, vhost and query:
//
//	amqp://guest:guest@127.0.0.1:5672/
//	amqp://guest:guest@10.0.0.1:5672/shop,amqp://guest:guest@10.0.0.2:5672/shop
//	amqp://guest:guest@10.0.0.1:5672,10.0.0.2:5672,10.0.0.3:5672/shop
//
// (the forms mix: a piece without a scheme is one more host of the URL
// before it). It returns one URL per address, in the order given, each
// amqp:// or amqps:// with a host; a duplicate address is an error.
func ParseAMQPURLs(raw string) ([]string, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, fmt.Errorf("no broker address (want amqp://user:pass@host:port/vhost, several separated by commas)")
	}
	// Group the pieces: a piece with a scheme starts a URL, the pieces after
	// it without one are more hosts of it.
	var groups [][]string
	for _, piece := range strings.Split(raw, ",") {
		piece = strings.TrimSpace(piece)
		if piece == "" {
			return nil, fmt.Errorf("empty address in %q (a stray comma?)", Redact(raw))
		}
		if strings.Contains(piece, "://") {
			groups = append(groups, []string{piece})
			continue
		}
		if len(groups) == 0 {
			return nil, fmt.Errorf("%q: the first address must be a URL (amqp://user:pass@host:port/vhost), got %q", Redact(raw), piece)
		}
		g := groups[len(groups)-1]
		groups[len(groups)-1] = append(g, piece)
	}
	var out []string
	seen := map[string]bool{}
	for _, g := range groups {
		urls, err := expandHosts(g)
		if err != nil {
			return nil, err
		}
		for _, u := range urls {
			p, err := url.Parse(u)
			switch {
			case err != nil:
				// Not url.Error's text: it quotes the URL with its password.
				var ue *url.Error
				if errors.As(err, &ue) {
					err = ue.Err
				}
				return nil, fmt.Errorf("%q is not a URL: %v", Redact(u), err)
			case p.Scheme != "amqp" && p.Scheme != "amqps":
				return nil, fmt.Errorf("scheme must be amqp or amqps, got %q in %q", p.Scheme, Redact(u))
			case p.Host == "":
				return nil, fmt.Errorf("must name a host, got %q", Redact(u))
			}
			key := p.Scheme + "://" + p.Host + p.EscapedPath()
			if seen[key] {
				return nil, fmt.Errorf("%s is listed twice", key)
			}
			seen[key] = true
			out = append(out, u)
		}
	}
	return out, nil
}

// expandHosts turns ["amqp://u:p@h1:1", "h2:2", "h3:3/vh?x=y"] (one URL
// split at its commas) into one URL per host, each with the first piece's
// scheme and credentials and the last piece's vhost and query.
func expandHosts(g []string) ([]string, error) {
	if len(g) == 1 {
		return g, nil
	}
	first, last := g[0], g[len(g)-1]
	scheme, rest, _ := strings.Cut(first, "://")
	userinfo, firstHost := "", rest
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		userinfo, firstHost = rest[:i+1], rest[i+1:]
	}
	if strings.ContainsAny(firstHost, "/?") {
		return nil, fmt.Errorf("%q: a URL followed by more hosts ends at its host (put the vhost after the last host: amqp://user:pass@h1:5672,h2:5672/vhost)", Redact(first))
	}
	hosts := []string{firstHost}
	for _, h := range g[1 : len(g)-1] {
		if strings.Contains(h, "@") {
			return nil, fmt.Errorf("credentials go before the first host only (a comma in a password is written %%2C)")
		}
		if strings.ContainsAny(h, "/?") {
			return nil, fmt.Errorf("%q: a host in the middle of the list must be host:port only", h)
		}
		hosts = append(hosts, h)
	}
	lastHost, tail := last, ""
	if i := strings.IndexAny(last, "/?"); i >= 0 {
		lastHost, tail = last[:i], last[i:]
	}
	if strings.Contains(lastHost, "@") {
		// Not quoted: it may hold a password cut at a comma.
		return nil, fmt.Errorf("credentials go before the first host only (a comma in a password is written %%2C)")
	}
	hosts = append(hosts, lastHost)
	out := make([]string, len(hosts))
	for i, h := range hosts {
		if h == "" {
			return nil, fmt.Errorf("%q: empty host", Redact(strings.Join(g, ",")))
		}
		out[i] = scheme + "://" + userinfo + h + tail
	}
	return out, nil
}

// Redact hides the password of each URL in s (a list of URLs too), for
// logs and errors.
func Redact(s string) string {
	pieces := strings.Split(s, ",")
	for i, piece := range pieces {
		u, err := url.Parse(strings.TrimSpace(piece))
		if err != nil {
			// Unparsable: cut what may be a password (after the
			// scheme's user name, up to the last @).
			if _, rest, ok := strings.Cut(piece, "://"); ok {
				if at := strings.LastIndex(rest, "@"); at >= 0 {
					if colon := strings.Index(rest[:at], ":"); colon >= 0 {
						pieces[i] = piece[:len(piece)-len(rest)] + rest[:colon+1] + "xxxxx" + rest[at:]
					}
				}
			}
			continue
		}
		if u.User == nil {
			continue
		}
		if _, has := u.User.Password(); has {
			pieces[i] = u.Redacted()
		}
	}
	return strings.Join(pieces, ",")
}

// AMQPURLs is the list of broker addresses: urls when the file gives it,
// else url (parsed as by ParseAMQPURLs). After validation it is never empty.
func (r RabbitMQ) AMQPURLs() []string {
	if len(r.URLs) > 0 {
		var out []string
		for _, u := range r.URLs {
			us, _ := ParseAMQPURLs(u)
			out = append(out, us...)
		}
		return out
	}
	out, _ := ParseAMQPURLs(r.URL)
	return out
}

// AMQPURL is the list of broker addresses as one string of comma-separated
// URLs, the form of SECKILL_AMQP_URL (for child processes and tools).
func (r RabbitMQ) AMQPURL() string { return strings.Join(r.AMQPURLs(), ",") }
