package rls

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"

	rlc "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// found is what lookup learned of a descriptor: its limit and the tree
// nodes its entries matched (for the key and the metric label).
type found struct {
	lim   *Limit
	nodes [maxDepth]*node
	wild  uint64 // bit i: entry i matched through a wildcard
}

// lookup finds a descriptor's limit as the reference server's GetLimit
// does: per entry, "key_value" first, then a wildcard value, then "key"
// (any value); the limit counts only when found at the last entry. nil:
// no limit applies.
func (top *node) lookup(entries []*rlc.RateLimitDescriptor_Entry, f *found) *Limit {
	n := top
	for i, e := range entries {
		next := n.children[e.Key+"_"+e.Value]
		if next == nil && len(n.wild) > 0 {
			kv := e.Key + "_" + e.Value
			for _, w := range n.wild {
				if match(w.parts, kv) {
					next = n.children[w.key]
					f.wild |= 1 << i
					break
				}
			}
		}
		if next == nil {
			next = n.children[e.Key]
		}
		if next == nil {
			return nil
		}
		f.nodes[i] = next
		if i == len(entries)-1 {
			f.lim = next.limit
			return next.limit
		}
		if len(next.children) == 0 {
			return nil
		}
		n = next
	}
	return nil
}

// appendKey appends the store key of a descriptor's window:
// "<prefix>{rls:<domain>:<32 hex>}", the hex the first 16 bytes of SHA-256
// over the entries, each key and value length-prefixed (so no two entry
// lists meet). The value is the request's, or the wildcard's own pattern
// for a share_threshold level (all values it matches share one window).
// Hashing bounds the key and keeps braces of values out of the hash tag;
// "rls:" keeps these windows apart from the HTTP rules' ("rl:").
func appendKey(dst []byte, prefix, domain string, entries []*rlc.RateLimitDescriptor_Entry, f *found) []byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	put := func(s string) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	for i, e := range entries {
		put(e.Key)
		// A tag byte keeps a pattern apart from any literal value.
		if f != nil && f.wild&(1<<i) != 0 && f.nodes[i].share {
			put("p" + f.nodes[i].name)
			continue
		}
		put("v" + e.Value)
	}
	var sum [sha256.Size]byte
	dst = append(dst, prefix...)
	dst = append(dst, "{rls:"...)
	dst = append(dst, domain...)
	dst = append(dst, ':')
	dst = hex.AppendEncode(dst, h.Sum(sum[:0])[:16])
	return append(dst, '}')
}

// label is a descriptor's metric label: the path of the limit in the file
// ("domain.key_value.key"); with detailed_metric every level names the
// request's value, with value_to_metric that level does.
func label(domain string, entries []*rlc.RateLimitDescriptor_Entry, f *found) string {
	if !f.lim.Detailed {
		plain := true
		for i := range entries {
			if f.nodes[i] != nil && f.nodes[i].valueToMetric {
				plain = false
				break
			}
		}
		if plain {
			return f.lim.path
		}
	}
	var b strings.Builder
	b.WriteString(domain)
	for i, e := range entries {
		b.WriteByte('.')
		nd := f.nodes[i]
		// Label values must be UTF-8 (gRPC already checks proto3 strings).
		e := &rlc.RateLimitDescriptor_Entry{Key: strings.ToValidUTF8(e.Key, "?"), Value: strings.ToValidUTF8(e.Value, "?")}
		if f.lim.Detailed || nd.valueToMetric {
			b.WriteString(e.Key + "_" + e.Value)
			continue
		}
		b.WriteString(nd.name)
	}
	return b.String()
}

// overrideLabel names a window Envoy's own limit override set: the
// descriptor's keys, as the reference server does.
func overrideLabel(domain string, entries []*rlc.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte('.')
		b.WriteString(strings.ToValidUTF8(e.Key, "?"))
	}
	return b.String()
}
