package conf

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseAMQPURLs(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"amqp://guest:guest@127.0.0.1:5672/", []string{"amqp://guest:guest@127.0.0.1:5672/"}},
		{"amqp://u:p@h1:1/vh, amqp://u:p@h2:2/vh", []string{"amqp://u:p@h1:1/vh", "amqp://u:p@h2:2/vh"}},
		{"amqp://u:p@h1:1,h2:2,h3:3/vh", []string{"amqp://u:p@h1:1/vh", "amqp://u:p@h2:2/vh", "amqp://u:p@h3:3/vh"}},
		{"amqps://u:p@h1:1,h2:2/vh?heartbeat=5", []string{"amqps://u:p@h1:1/vh?heartbeat=5", "amqps://u:p@h2:2/vh?heartbeat=5"}},
		{"amqp://h1:1,h2:2", []string{"amqp://h1:1", "amqp://h2:2"}},
		// Mixed: a full URL, then a multi-host one.
		{"amqp://a:b@x:1/,amqp://c:d@y:2,z:3/v", []string{"amqp://a:b@x:1/", "amqp://c:d@y:2/v", "amqp://c:d@z:3/v"}},
	}
	for _, tc := range cases {
		got, err := ParseAMQPURLs(tc.in)
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseAMQPURLsRejects(t *testing.T) {
	cases := []struct{ in, want string }{
		{"", "no broker address"},
		{"h1:1,amqp://h2:2/", "the first address must be a URL"},
		{"amqp://h1:1/,,amqp://h2:2/", "empty address"},
		{"amqp://u:p@h1:1/vh,h2:2/vh", "put the vhost after the last host"},
		{"amqp://u:p@h1:1,u:p@h2:2/", "credentials go before the first host only"},
		{"amqp://h1:1,h2:2/a,h3:3/", "must be host:port only"},
		{"http://h1:1/", "scheme must be amqp or amqps"},
		{"amqp://h1:1/,amqp://h1:1/", "amqp://h1:1/ is listed twice"},
		{"amqp://u:secret@h1:1,h1:1/", "listed twice"},
		{"amqp://u:sec,ret@h1:1/", "a comma in a password is written %2C"},
		{"amqp://u:sec,ret@h1:1,h2:2/", "a comma in a password is written %2C"},
		{"amqp:///vh", "must name a host"},
		{"amqp://u:secret@h:x/", "invalid port"},
	}
	for _, tc := range cases {
		_, err := ParseAMQPURLs(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one mentioning %q", tc.in, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows the password: %v", tc.in, err)
		}
	}
}

func TestRabbitMQAddressKeys(t *testing.T) {
	c, err := Parse("[rabbitmq]\nurls = [\"amqp://u:p@h1:1/vh\", \"amqp://u:p@h2:2,h3:3/vh\"]", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.RabbitMQ.AMQPURLs(), []string{"amqp://u:p@h1:1/vh", "amqp://u:p@h2:2/vh", "amqp://u:p@h3:3/vh"}; !reflect.DeepEqual(got, want) {
		t.Errorf("urls: %q, want %q", got, want)
	}
	c, err = Parse("[rabbitmq]\nurl = \"amqp://u:p@h1:1,h2:2/vh\"", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.RabbitMQ.AMQPURL(); got != "amqp://u:p@h1:1/vh,amqp://u:p@h2:2/vh" {
		t.Errorf("url with two hosts: %q", got)
	}
	// The variable replaces the file's list.
	env := func(k string) string {
		if k == EnvAMQPURL {
			return "amqp://e:f@h9:9,h8:8/"
		}
		return ""
	}
	c, err = Parse("[rabbitmq]\nurls = [\"amqp://u:p@h1:1/vh\"]", env)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.RabbitMQ.AMQPURLs(), []string{"amqp://e:f@h9:9/", "amqp://e:f@h8:8/"}; !reflect.DeepEqual(got, want) {
		t.Errorf("%s over urls: %q, want %q", EnvAMQPURL, got, want)
	}
	for doc, want := range map[string]string{
		"[rabbitmq]\nurl = \"amqp://h:1/\"\nurls = [\"amqp://h:2/\"]": "rabbitmq.urls: is the same setting as rabbitmq.url",
		"[rabbitmq]\nurls = [\"amqp://h:1/\", \"ftp://h:2/\"]":        "rabbitmq.urls[1]: scheme must be amqp",
		"[rabbitmq]\nurls = [\"amqp://h:1/\", \"amqp://h:1/\"]":       "rabbitmq.urls[1]:",
		"[rabbitmq]\nurl = \"amqp://127.0.0.1:p1,127.0.0.1:p2/\"":     "rabbitmq.url:",
	} {
		if _, err := Parse(doc, noEnv); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", doc, err, want)
		}
	}
}

// FuzzParseAMQPURLs: any input is parsed or refused without a panic; what is
// accepted is a list of distinct amqp(s) URLs with a host each, and that
// list written back comma-separated parses to itself (SECKILL_AMQP_URL for
// child processes: RabbitMQ.AMQPURL).
func FuzzParseAMQPURLs(f *testing.F) {
	for _, s := range []string{
		"amqp://guest:guest@127.0.0.1:5672/",
		"amqp://u:p@h1:1,h2:2,h3:3/vh",
		"amqps://u:p@h1:1/vh?heartbeat=5,amqp://h2:2/",
		"h1:1,amqp://x/", "amqp://a@b@c:1,d:2/", ",", "amqp://h:1/%zz",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		urls, err := ParseAMQPURLs(raw)
		if err != nil {
			return
		}
		if len(urls) == 0 {
			t.Fatalf("%q: accepted with no address", raw)
		}
		again, err := ParseAMQPURLs(strings.Join(urls, ","))
		if err != nil {
			t.Fatalf("%q: its own list %q is refused: %v", raw, urls, err)
		}
		if !reflect.DeepEqual(again, urls) {
			t.Fatalf("%q: %q parses to %q", raw, urls, again)
		}
	})
}
