package limits

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestAppendHostOneKeyPerCaseInsensitiveHost: docs/configuration.md says a
// raw UTF-8 host in two cases is one host, "as match.host compares it"
// (strings.EqualFold), and an exception or admin override of a host lands
// on the identity's own key. AppendHost lower-cased rune by rune, and
// Unicode has letters with two lower-case forms of one capital: the final
// sigma (σας and ΣΑΣ are one word in two cases, EqualFold says so, but
// ΣΑΣ lowered is σασ), β and ϐ, θ and ϑ, µ and μ, в and ᲀ... Measured
// through the real /auth (fixed_window 3 an hour, key [host]): a block set
// with PUT /v1/rules/per-host/identities?host=σας.example left ΣΑΣ.example
// 3 of 5 requests (the rule's own limit), and σας.example and σασ.example
// counted apart (6 requests where the limit is 3).
func TestAppendHostOneKeyPerCaseInsensitiveHost(t *testing.T) {
	for _, spellings := range [][]string{
		{"σας.example", "ΣΑΣ.example", "σασ.example", "ΣΑΣ.EXAMPLE:443"},
		{"ϐeta.example", "βeta.example", "Βeta.example"},
		{"µ.example", "μ.example", "Μ.example"},
		{"ᲀ.example", "в.example", "В.example"},
	} {
		want := string(AppendHost(nil, []byte(spellings[0])))
		for _, s := range spellings[1:] {
			if !strings.EqualFold(strings.TrimSuffix(s, ":443"), spellings[0]) {
				t.Fatalf("test bug: %q and %q are not one host to match.host", s, spellings[0])
			}
			if got := string(AppendHost(nil, []byte(s))); got != want {
				t.Errorf("AppendHost(%q) = %q, AppendHost(%q) = %q: one host (strings.EqualFold, as match.host compares) counted under two keys, "+
					"and an exception or override written for one spelling misses the other", s, got, spellings[0], want)
			}
		}
	}
	// Every non-ASCII letter: the members of its case-folding orbit that
	// are not ASCII (those stay apart: the Kelvin sign is not k) give one host.
	bad := 0
	for r := rune(utf8.RuneSelf); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		want := string(AppendHost(nil, []byte(string(r))))
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < utf8.RuneSelf {
				continue
			}
			if got := string(AppendHost(nil, []byte(string(f)))); got != want {
				if bad++; bad <= 10 {
					t.Errorf("AppendHost(%q) = %q but AppendHost(%q) = %q: strings.EqualFold holds them one host", string(f), got, string(r), want)
				}
			}
		}
	}
	if bad > 10 {
		t.Errorf("... %d pairs in all", bad)
	}
}
