package limits

import (
	"regexp"
	"strconv"
	"testing"
	"time"
)

// Benchmarks of rule matching and key building, the limiter's stages
// before the store (the whole decision is BenchmarkLimiterMemory and
// BenchmarkRedisDecide in bench/):
//
//	go test -run '^$' -bench 'Match|KeyBuild' -benchmem ./limits/

// byteHdrs is a header set that peeks without allocating, as fasthttp's
// RequestHeader does (the tests' hdrs converts each value).
type byteHdrs map[string][]byte

func (h byteHdrs) Peek(k string) []byte { return h[k] }

// BenchmarkMatch evaluates 30 rules of every match kind against one
// request; 3 of them match.
func BenchmarkMatch(b *testing.B) {
	var rules []*Rule
	for i := range 30 {
		m := Match{PathPrefix: "/other" + strconv.Itoa(i) + "/"}
		switch {
		case i == 0:
			m = Match{PathPrefix: "/api/", Methods: []string{"GET", "POST"}}
		case i == 1:
			m = Match{PathRegex: regexp.MustCompile(`^/api/items/[0-9]+$`), Host: "api.example.com"}
		case i == 2:
			m = Match{Headers: []HeaderMatch{{"X-Plan", []byte("free")}}}
		case i%3 == 0:
			m.Methods = []string{"DELETE"}
		}
		rules = append(rules, &Rule{Name: "r" + strconv.Itoa(i), Match: m})
	}
	req := &Request{Method: []byte("GET"), Route: []byte("/api/items/42"), Host: []byte("api.example.com"), Headers: byteHdrs{"X-Plan": []byte("free")}}
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		for _, r := range rules {
			if r.Matches(req) {
				n++
			}
		}
		if n != 3 {
			b.Fatalf("%d rules match, want 3", n)
		}
	}
}

// BenchmarkKeyBuild builds and interns the keys of a three-part identity
// (user, route, a header) for rotating users, as the limiter does.
func BenchmarkKeyBuild(b *testing.B) {
	r := &Rule{Name: "per-tenant", Key: []KeyPart{{Kind: KeyUser}, {Kind: KeyRoute}, {Kind: KeyHeader, Header: "X-Tenant"}},
		Algorithm: FixedWindow, Limit: 10, Period: time.Minute, Burst: 10, Cost: 1}
	users := make([][]byte, 1000)
	for i := range users {
		users[i] = []byte("user:" + strconv.Itoa(i) + "@example.com")
	}
	req := &Request{Route: []byte("/api/items/{id}"), Headers: byteHdrs{"X-Tenant": []byte("acme corp")}}
	keys := newKeyIntern()
	var ident, key []byte
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		req.User = users[i%len(users)]
		i++
		ident, _ = AppendIdentity(ident[:0], r, req)
		key = AppendKey(key[:0], "rg", r, ident)
		_ = keys.get(key)
	}
}
