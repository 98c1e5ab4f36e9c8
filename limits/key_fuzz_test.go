package limits

import (
	"strings"
	"testing"
)

// FuzzKeyInjective checks the other half of the key contract that FuzzKey
// (bounded, one hash tag) does not: two different identities never share a
// key, and the same identity always gets the same one (values that differ
// only in the white space TrimValue trims are one identity). The identity has
// three parts (user, a header, the route) so that values cannot shift
// across the separators; an empty user is the anonymous "=<ip>" form.
func FuzzKeyInjective(f *testing.F) {
	f.Add("a|b", "c", "/", "a", "b|c", "/")
	f.Add("=192.0.2.1", "", "/", "", "", "/")
	f.Add("%7B", "x", "/", "{", "x", "/")
	f.Add(strings.Repeat("x", 200)+"1", "p", "/r", strings.Repeat("x", 200)+"2", "p", "/r")
	rule := &Rule{Name: "f", Key: []KeyPart{{Kind: KeyUser}, {Kind: KeyHeader, Header: "X-Plan"}, {Kind: KeyRoute}}, Algorithm: GCRA}
	f.Fuzz(func(t *testing.T, user1, plan1, route1, user2, plan2, route2 string) {
		req := func(user, plan, route string) *Request {
			return &Request{User: []byte(user), IP: []byte("192.0.2.1"), Route: []byte(route), Headers: hdrs{"X-Plan": plan}}
		}
		k1 := keyOf(t, rule, req(user1, plan1, route1))
		k2 := keyOf(t, rule, req(user2, plan2, route2))
		// one identity: the header values as counted, trimmed (TrimValue)
		trim := func(v string) string { return string(TrimValue([]byte(v))) }
		same := trim(user1) == trim(user2) && trim(plan1) == trim(plan2) && route1 == route2
		if same != (k1 == k2) {
			t.Fatalf("identities (%q,%q,%q) and (%q,%q,%q): keys %q and %q", user1, plan1, route1, user2, plan2, route2, k1, k2)
		}
		if again := keyOf(t, rule, req(user1, plan1, route1)); again != k1 {
			t.Fatalf("same identity, two keys: %q and %q", k1, again)
		}
	})
}
