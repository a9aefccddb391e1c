// Package ratecrowd drives a crowd of distinct clients (each its own source
// address on 127.0.0.0/8) through proxy processes and judges the limiter's
// promise of docs/limiter.md from the outside: the worst sliding interval
// of every window against its limit, counted only from requests that
// certainly fell inside the interval, and the admissions against what an
// ideal exact limiter would have admitted for the same demand. Test-only:
// nothing outside e2e/ imports it.
package ratecrowd

import (
	"slices"
	"sort"
	"time"
)

// Span is the part of a request's life that holds its admission moment:
// From is when the client sent it, To when it reached the upstream (or, for
// a request whose arrival was not stamped, when the client got the answer).
// Times are offsets on the test process's monotonic clock.
type Span struct {
	From, To time.Duration
}

// Worst is the busiest interval of length W found by WorstInterval.
type Worst struct {
	N    int           // admissions certainly inside the interval
	From time.Duration // the interval is [From, From+W)
}

// WorstInterval is the largest number of spans that lie wholly inside one
// interval [a, a+w), over every a. A span inside the interval certainly had
// its admission moment inside it, whatever the moment was within the span;
// a span reaching past either end may have been admitted outside it, so it
// does not count (an arrival log alone would count a burst that queued at
// the proxy and reached the upstream together, admitted over a longer time).
// The count is therefore a lower bound of the true worst interval: more
// than the window's limit is a certain violation.
//
// The best a is some span's From (moving a right up to the next From loses
// no span that starts after a and only makes room at the end), so for each
// k in From order it counts the spans i with From_i ≥ From_k and
// To_i < From_k + w: a Fenwick tree over the ranks of To, filled from the
// latest From down. O(n log n).
func WorstInterval(spans []Span, w time.Duration) Worst {
	n := len(spans)
	if n == 0 {
		return Worst{}
	}
	s := slices.Clone(spans)
	slices.SortFunc(s, func(a, b Span) int {
		if a.From != b.From {
			return compare(a.From, b.From)
		}
		return compare(a.To, b.To)
	})
	tos := make([]time.Duration, n)
	for i := range s {
		tos[i] = s[i].To
	}
	slices.Sort(tos)
	tree := make([]int, n+1)
	add := func(i int) { // i: 1-based rank
		for ; i <= n; i += i & -i {
			tree[i]++
		}
	}
	sum := func(i int) (c int) { // spans inserted with rank ≤ i
		for ; i > 0; i -= i & -i {
			c += tree[i]
		}
		return c
	}
	var best Worst
	for k := n - 1; k >= 0; k-- {
		// Rank of s[k].To among equal values: insert at the last equal
		// rank's slot; the query counts every To < end.
		add(sort.Search(n, func(i int) bool { return tos[i] > s[k].To }))
		end := s[k].From + w
		c := sum(sort.Search(n, func(i int) bool { return tos[i] >= end }))
		if c > best.N || (c == best.N && s[k].From < best.From) {
			best = Worst{N: c, From: s[k].From}
		}
	}
	return best
}

func compare(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Ideal replays a demand through an ideal exact limiter with one per-client
// window (perIP per w) and one global window (global per w; 0: none): in the
// order the requests were sent, each is admitted when, in the last w before
// its send time, its client has fewer than perIP admissions and everyone
// together fewer than global — refused only by a full window it needs
// (docs/limiter.md, property 2), never late, no leases. That is the most
// the limits allow for this demand: for one window, admitting greedily in
// time order admits the most any schedule can (an exchange argument: an
// optimal schedule's first admission that greedy skipped can be swapped for
// greedy's earlier one without breaking any interval), and for the two
// together it is exactly what the promise says the limiter does.
//
// clients[i] and sent[i] describe request i. It returns the admissions and
// the refusals by the per-client window and by the global one (a request
// refused by both counts as per-client).
func Ideal(clients []int, sent []time.Duration, perIP, global int, w time.Duration) (admitted, byClient, byGlobal int) {
	order := make([]int, len(sent))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return sent[order[a]] < sent[order[b]] })
	own := map[int][]time.Duration{} // a client's admissions, the last perIP
	var all []time.Duration          // everyone's, oldest first
	head := 0
	for _, i := range order {
		t := sent[i]
		for head < len(all) && all[head] <= t-w {
			head++
		}
		mine := own[clients[i]]
		recent := 0
		for _, a := range mine {
			if a > t-w {
				recent++
			}
		}
		switch {
		case recent >= perIP:
			byClient++
			continue
		case global > 0 && len(all)-head >= global:
			byGlobal++
			continue
		}
		admitted++
		all = append(all, t)
		if len(mine) == perIP {
			mine = mine[1:]
		}
		own[clients[i]] = append(mine, t)
	}
	return admitted, byClient, byGlobal
}
