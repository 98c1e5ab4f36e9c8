package handler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestRateLimitListsBounded: a client chooses how many rules its request
// matches, and NGINX reads rategate's answer head into 4 KiB by default: a
// head past that is a 502 to NGINX, which the shipped configs let through
// (and which makes NGINX take the instance for down). With 40 matching
// rules of 64-character names, RateLimit-Policy and RateLimit stay within
// maxListBytes each, list the same rules in rule order, and always name
// the rule with the least remaining quota and the one that denied.
func TestRateLimitListsBounded(t *testing.T) {
	var rules []*limits.Rule
	name := func(i int) string { return fmt.Sprintf("r%02d-%s", i, strings.Repeat("x", 60)) }
	for i := range 40 {
		limit := int64(1_000_000_000)
		if i == 37 {
			limit = 1 // the least remaining, then the denier
		}
		rules = append(rules, rule(name(i), limit, time.Hour, limits.KeyIP))
	}
	ts := pinned(t, Options{}, rules...)
	for n, want := range []struct {
		status int
		must   []int
	}{{204, []int{37}}, {429, []int{37}}} {
		r := ts.auth(t, std("192.0.2.7")...)
		equal(t, want.status, r.status, "request %d", n+1)
		pol, list := r.headers["ratelimit-policy"], r.headers["ratelimit"]
		head := 0
		for k, v := range r.headers {
			head += len(k) + len(v) + 4
		}
		if len(pol) > maxListBytes || len(list) > maxListBytes || head > 3000 {
			t.Fatalf("request %d: RateLimit-Policy %d bytes, RateLimit %d, head %d: want at most %d, %d and 3000",
				n+1, len(pol), len(list), head, maxListBytes, maxListBytes)
		}
		var polNames, listNames []string
		for _, item := range strings.Split(pol, ", ") {
			polNames = append(polNames, item[:strings.IndexByte(item, ';')])
		}
		for _, item := range strings.Split(list, ", ") {
			listNames = append(listNames, item[:strings.IndexByte(item, ';')])
		}
		equal(t, strings.Join(polNames, " "), strings.Join(listNames, " "), "request %d: the two lists name the same rules", n+1)
		if len(polNames) < 8 || len(polNames) == 40 {
			t.Errorf("request %d: %d items; want as many as fit (8 or more), not all 40", n+1, len(polNames))
		}
		for _, i := range want.must {
			if !strings.Contains(pol, `"`+name(i)+`"`) || !strings.Contains(list, `"`+name(i)+`"`) {
				t.Errorf("request %d: rule %d missing: %s", n+1, i, list)
			}
		}
		for j := 1; j < len(polNames); j++ {
			if polNames[j-1] >= polNames[j] {
				t.Errorf("request %d: items out of rule order: %s", n+1, pol)
			}
		}
	}
}

// TestRateLimitListsKeepBoth: when the rule that denied is not the one
// with the least remaining quota, both are listed, past a full budget.
func TestRateLimitListsKeepBoth(t *testing.T) {
	var d limits.Decision
	for i := range 40 {
		r := rule(fmt.Sprintf("r%02d-%s", i, strings.Repeat("y", 60)), 1000, time.Hour, limits.KeyIP)
		res := limits.Result{Allowed: true, Remaining: 500, ResetUS: 3_600_000_000}
		switch i {
		case 30: // denied a cost of 600 with 500 left
			res.Allowed, res.RetryUS = false, 1_000_000
		case 36:
			res.Remaining = 7
		}
		d.Verdicts = append(d.Verdicts, limits.Verdict{Rule: r, Cost: 1, Result: res})
	}
	d.Denier = 30
	var s scratch
	pol, list := s.appendLists(nil, &d, 36)
	if len(pol) > maxListBytes || len(list) > maxListBytes {
		t.Fatalf("%d and %d bytes, want at most %d each", len(pol), len(list), maxListBytes)
	}
	for _, i := range []int{30, 36} {
		n := fmt.Sprintf(`"r%02d-`, i)
		if !strings.Contains(string(pol), n) || !strings.Contains(string(list), n) {
			t.Errorf("rule %d missing:\n%s\n%s", i, pol, list)
		}
	}
	if !strings.Contains(string(list), `"r00-`) {
		t.Errorf("the first rules, which fit, are missing: %s", list)
	}
}
