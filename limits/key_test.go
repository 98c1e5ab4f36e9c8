package limits

import (
	"bytes"
	"math/rand"
	"net/textproto"
	"strings"
	"testing"
)

type hdrs map[string]string

func (h hdrs) Peek(k string) []byte {
	v, ok := h[textproto.CanonicalMIMEHeaderKey(k)]
	if !ok {
		return nil
	}
	return []byte(v)
}

func keyOf(t testing.TB, r *Rule, req *Request) string {
	t.Helper()
	id, ok := AppendIdentity(nil, r, req)
	if !ok {
		t.Fatalf("rule %s skipped the request", r.Name)
	}
	return string(AppendKey(nil, "rg", r, id))
}

func TestKeyLayout(t *testing.T) {
	tests := []struct {
		name string
		rule Rule
		req  Request
		want string
	}{
		{"global", Rule{Name: "global", Algorithm: FixedWindow}, Request{}, "rg:{global:}:fw2"},
		{"ip", Rule{Name: "per-ip", Key: []KeyPart{{Kind: KeyIP}}, Algorithm: GCRA},
			Request{IP: []byte("203.0.113.7")}, "rg:{per-ip:203.0.113.7}:gc2"},
		{"ipv6", Rule{Name: "per-ip", Key: []KeyPart{{Kind: KeyIP}}, Algorithm: TokenBucket},
			Request{IP: []byte("2001:db8::1")}, "rg:{per-ip:2001:db8::1}:tb2"},
		{"user and route", Rule{Name: "u", Key: []KeyPart{{Kind: KeyUser}, {Kind: KeyRoute}}, Algorithm: SlidingLog},
			Request{User: []byte("alice"), Route: []byte("/api/x")}, "rg:{u:alice|/api/x}:sl2"},
		{"anonymous user falls back to ip", Rule{Name: "u", Key: []KeyPart{{Kind: KeyUser}}, Algorithm: SlidingWindow},
			Request{IP: []byte("10.0.0.1")}, "rg:{u:=10.0.0.1}:sw2"},
		{"hostile user escaped", Rule{Name: "u", Key: []KeyPart{{Kind: KeyUser}}, Algorithm: FixedWindow},
			Request{User: []byte("a}:b{c d|e%")}, "rg:{u:a%7D:b%7Bc%20d%7Ce%25}:fw2"},
		{"header", Rule{Name: "plan", Key: []KeyPart{{Kind: KeyHeader, Header: "X-Plan"}, {Kind: KeyMethod}, {Kind: KeyHost}}, Algorithm: FixedWindow},
			Request{Headers: hdrs{"X-Plan": "free"}, Method: []byte("GET"), Host: []byte("api.example.com")}, "rg:{plan:free|GET|api.example.com}:fw2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := keyOf(t, &tt.rule, &tt.req); got != tt.want {
				t.Fatalf("key %q, want %q", got, tt.want)
			}
		})
	}
}

func TestAnonymousSkip(t *testing.T) {
	r := &Rule{Name: "u", Key: []KeyPart{{Kind: KeyUser}}, Anonymous: AnonymousSkip}
	if _, ok := AppendIdentity(nil, r, &Request{IP: []byte("1.2.3.4")}); ok {
		t.Fatal("anonymous request not skipped with anonymous: skip")
	}
	if _, ok := AppendIdentity(nil, r, &Request{User: []byte("bob")}); !ok {
		t.Fatal("request with a user skipped")
	}
}

// hashTagOf returns what Redis Cluster hashes: the bytes between the first
// '{' and the first '}' after it.
func hashTagOf(key string) string {
	i := strings.IndexByte(key, '{')
	j := strings.IndexByte(key[i+1:], '}')
	return key[i+1 : i+1+j]
}

func TestKeysAreInjectiveBoundedAndTagged(t *testing.T) {
	rule := &Rule{Name: "multi", Key: []KeyPart{{Kind: KeyUser}, {Kind: KeyHeader, Header: "X-Tenant"}}, Algorithm: FixedWindow}
	alphabet := []byte("ab:{}|%=#- \x00\xff\n/.é")
	rng := rand.New(rand.NewSource(1))
	randVal := func() string {
		n := rng.Intn(12)
		if rng.Intn(50) == 0 {
			n = 8 << 10 // 8 KB header values
		}
		var b bytes.Buffer
		for i := 0; i < n; i++ {
			b.WriteByte(alphabet[rng.Intn(len(alphabet))])
		}
		return b.String()
	}
	seen := map[string][2]string{}
	for i := 0; i < 20000; i++ {
		user, tenant := randVal(), randVal()
		req := &Request{User: []byte(user), IP: []byte("192.0.2.1"), Headers: hdrs{"X-Tenant": tenant}}
		key := keyOf(t, rule, req)
		if len(key) > MaxKeyLen {
			t.Fatalf("key of %d bytes > %d: %q", len(key), MaxKeyLen, key)
		}
		if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 {
			t.Fatalf("key %q has a broken hash tag", key)
		}
		if !strings.HasPrefix(hashTagOf(key), "multi:") {
			t.Fatalf("hash tag of %q does not start with the rule", key)
		}
		for _, c := range []byte(key) {
			if c < 0x21 || c > 0x7e {
				t.Fatalf("key %q has byte %#x", key, c)
			}
		}
		// one identity: the values as counted, trimmed (TrimValue)
		id := [2]string{string(TrimValue([]byte(user))), string(TrimValue([]byte(tenant)))}
		if prev, ok := seen[key]; ok && prev != id {
			t.Fatalf("collision: %q and %q both give %q", prev, id, key)
		}
		seen[key] = id
	}
	// A user literally named like an anonymous fallback never shares its key.
	r := &Rule{Name: "u", Key: []KeyPart{{Kind: KeyUser}}}
	anon := keyOf(t, r, &Request{IP: []byte("1.2.3.4")})
	named := keyOf(t, r, &Request{User: []byte("=1.2.3.4"), IP: []byte("9.9.9.9")})
	ipNamed := keyOf(t, r, &Request{User: []byte("1.2.3.4"), IP: []byte("9.9.9.9")})
	if anon == named || anon == ipNamed {
		t.Fatalf("anonymous key %q collides with a named user", anon)
	}
	// Hashed identities cannot collide with literal ones: '#' is always escaped.
	long := strings.Repeat("x", 200)
	hashed := keyOf(t, r, &Request{User: []byte(long)})
	fake := keyOf(t, r, &Request{User: []byte(hashTagOf(hashed)[len("u:"):])})
	if hashed == fake {
		t.Fatalf("literal user %q reproduces hashed key %q", hashTagOf(hashed), hashed)
	}
}

func FuzzKey(f *testing.F) {
	f.Add("alice", "free", "/api")
	f.Add("}{", "|", "%")
	f.Add(strings.Repeat("é", 100), "\x00", "")
	rule := &Rule{Name: "f", Key: []KeyPart{{Kind: KeyUser}, {Kind: KeyHeader, Header: "X-Plan"}, {Kind: KeyRoute}}, Algorithm: GCRA}
	f.Fuzz(func(t *testing.T, user, plan, route string) {
		req := &Request{User: []byte(user), IP: []byte("::1"), Route: []byte(route), Headers: hdrs{"X-Plan": plan}}
		key := keyOf(t, rule, req)
		if len(key) > MaxKeyLen || strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 {
			t.Fatalf("bad key %q", key)
		}
	})
}

// TestHeaderValueProblem: values /auth never counts as sent are named,
// everything else (a tab inside, bytes above 0x7f) passes.
func TestHeaderValueProblem(t *testing.T) {
	for v, want := range map[string]string{
		"":             "",
		"acme":         "",
		"a b\tc":       "",
		"caf\xc3\xa9":  "",
		"voil\xc3\xa0": "",
		"a\u00a0b":     "",
		" acme":        "white space",
		"acme\t":       "white space",
		"acme\u00a0":   "white space",
		"\u3000acme":   "white space",
		"acme\xa0":     "white space",
		"a\x00b":       "control byte 0x00",
		"a\x1fb":       "control byte 0x1f",
		"a\x7fb":       "control byte 0x7f",
	} {
		got := HeaderValueProblem(v)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("HeaderValueProblem(%q) = %q, want one with %q", v, got, want)
		}
	}
}

// TestTrimValue: the white space applications trim from a header value is
// trimmed here too, so a padded API key is the same quota; characters that
// merely end in the bytes of a white space (à is C3 A0, NBSP in Latin-1
// is A0) and white space inside stay.
func TestTrimValue(t *testing.T) {
	for v, want := range map[string]string{
		"":                          "",
		"k":                         "k",
		" \tk\t ":                   "k",
		"k\u00a0":                   "k", // NBSP, UTF-8
		"k\xa0":                     "k", // NBSP, Latin-1
		"k\x85":                     "k", // NEL, Latin-1
		"\u0085k":                   "k", // NEL, UTF-8
		"\xa0\xa0k\xa0 \u3000":      "k",
		"k\u2000\u200a\u2028\u2029": "k",
		"\u202fk\u205f":             "k",
		"\u1680k\u180e":             "k",
		"\ufeffk\u200b":             "k", // BOM and zero-width space
		"k\x0b\x1c\x1f\x7f":         "k", // control bytes (Python's strip, Java's trim)
		"\u00a0":                    "",
		"k\u00a0x":                  "k\u00a0x",
		"voil\u00e0":                "voil\u00e0", // ends C3 A0: a letter
		"k\u00c5":                   "k\u00c5",    // ends C3 85
		"\u00a0\u00e0":              "\u00e0",
		"\xe0\xa0":                  "\xe0", // not UTF-8: the A0 is Latin-1's
		"k\ufffd":                   "k\ufffd",
	} {
		if got := string(TrimValue([]byte(v))); got != want {
			t.Errorf("TrimValue(%q) = %q, want %q", v, got, want)
		}
	}
}

// TestPaddedValuesAreOneIdentity: a user or a header value padded with
// white space an application would trim is the identity it pads, for the
// key and for a rule's header match; a user of white space alone is
// anonymous.
func TestPaddedValuesAreOneIdentity(t *testing.T) {
	r := &Rule{Name: "k", Key: []KeyPart{{Kind: KeyUser}, {Kind: KeyHeader, Header: "X-Api-Key"}}, Algorithm: FixedWindow}
	want := keyOf(t, r, &Request{User: []byte("alice"), Headers: hdrs{"X-Api-Key": "k"}})
	for _, pad := range []string{"\u00a0", "\xa0", "\x85", "\u3000", "\ufeff", "\u00a0\xa0"} {
		req := &Request{User: []byte(pad + "alice" + pad), Headers: hdrs{"X-Api-Key": "k" + pad}}
		if got := keyOf(t, r, req); got != want {
			t.Errorf("padded with %q: key %q, want %q", pad, got, want)
		}
	}
	anon := keyOf(t, r, &Request{IP: []byte("192.0.2.1"), Headers: hdrs{"X-Api-Key": "k"}})
	if got := keyOf(t, r, &Request{User: []byte("\u00a0 "), IP: []byte("192.0.2.1"), Headers: hdrs{"X-Api-Key": "k"}}); got != anon {
		t.Errorf("a user of white space: key %q, want the anonymous %q", got, anon)
	}
	skip := &Rule{Name: "s", Key: []KeyPart{{Kind: KeyUser}}, Anonymous: AnonymousSkip}
	if _, ok := AppendIdentity(nil, skip, &Request{User: []byte("\u00a0")}); ok {
		t.Error("a user of white space under anonymous: skip was counted")
	}
	m := &Rule{Match: Match{Headers: []HeaderMatch{{"X-Plan", []byte("free")}}}}
	for _, v := range []string{"free", "free\u00a0", "\xa0free", "free\x85"} {
		if !m.Matches(&Request{Headers: hdrs{"X-Plan": v}}) {
			t.Errorf("X-Plan %q does not match free", v)
		}
	}
	if m.Matches(&Request{Headers: hdrs{"X-Plan": "fre\u00a0e"}}) {
		t.Error("X-Plan with white space inside matches free")
	}
}
