package app

import (
	"context"
	"fmt"
	"testing"

	"github.com/rategate/rategate/limits"
)

// TestLeasedResetOfAnOverriddenIdentity: an admin reset
// (DELETE /v1/keys/{rule}) of a leased gcra / token_bucket key whose
// identity has its own, higher numbers (an identity override). The reset
// ran with the rule's numbers, not the identity's: lease.lua's reset
// wrote what the live slices hold as a backlog (gcra: live x T) or level
// (token_bucket: burst - live) in the rule's terms, and the identity's next
// take converted that record to its own numbers, where the rule's 6 s per
// unit is 100 of the identity's units: the identity stayed exhausted after
// the "unban" (0 of 100 admitted). The admin API now resets under the
// identity's numbers.
//
// Docs: algorithms.md (Leases, Rule changes) "An admin reset (DELETE
// /v1/keys/...) of a leased key resets everything but what live slices
// hold, which stays counted (their holders may spend it), and the
// resetting instance returns its own"; scaling.md: at most two slices per
// key, each at most 1/8 of the burst. So after the reset at least
// 1000 - 2 x 125 = 750 of the identity's 1000 are available.
func TestLeasedResetOfAnOverriddenIdentity(t *testing.T) {
	for _, sc := range []struct {
		alg   string
		lease bool
	}{{"gcra", true}, {"token_bucket", true}, {"gcra", false}} {
		t.Run(fmt.Sprintf("%s/lease=%t", sc.alg, sc.lease), func(t *testing.T) {
			yaml := fmt.Sprintf(`rules:
  - name: api
    key: [user]
    algorithm: %s
    limit: 10
    period: 1m
    burst: 10
    lease: %t
`, sc.alg, sc.lease)
			s := newStack(t, yaml, "redis")
			s.api("PUT", "/v1/rules/api/identities?user=acme", `{"limit":1000,"burst":1000}`, 200, nil)
			decide := func(n int) int {
				admitted := 0
				for range n {
					var d limits.Decision
					if err := s.limiter.Decide(context.Background(), &limits.Request{User: []byte("acme")}, &d); err != nil {
						t.Fatal(err)
					}
					if d.Admitted {
						admitted++
					}
				}
				return admitted
			}
			// 900 of its 1000: the instance holds a live slice with units left.
			if got := decide(900); got != 900 {
				t.Fatalf("acme (own limit 1000): %d of 900 admitted, want 900", got)
			}
			s.api("DELETE", "/v1/keys/api?user=acme", "", 200, nil)
			got := decide(100)
			if got < 100 {
				_, view := call(t, s.admin, "GET", "/v1/keys/api?user=acme", "")
				t.Fatalf("after the admin reset, acme (own limit and burst 1000, 900 used, so 100 were still its own before the reset; at most 2 live slices of 125 stay counted) had %d of 100 admitted, want 100; key view after: %s",
					got, grepLines(view, `"remaining"`)+grepLines(view, `"reset_seconds"`)+grepLines(view, `"l":`))
			}
		})
	}
}
