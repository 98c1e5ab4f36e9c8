package app

import (
	"fmt"
	"testing"
	"time"
)

// TestRuleOverrideEndsAtItsTTL: a rule override's "ttl" ends it by itself
// (docs/operations.md). Identity overrides stop applying at their
// expires_at on every request; a rule override kept applying until the
// manager's next periodic re-read (every 500 ms), so a tenfold override
// with a 200 ms ttl admitted ten times the file's limit for up to half a
// second after it ended.
func TestRuleOverrideEndsAtItsTTL(t *testing.T) {
	s := newStack(t, `rules:
  - name: r
    key: [ip]
    algorithm: fixed_window
    limit: 2
    period: 1h
`, "redis")
	worst := 0
	for round := range 3 {
		var v struct {
			Override struct {
				ExpiresAt time.Time `json:"expires_at"`
			} `json:"override"`
		}
		s.api("PUT", "/v1/rules/r/override", `{"factor":50,"ttl":"200ms"}`, 200, &v)
		if v.Override.ExpiresAt.IsZero() {
			t.Fatalf("no expires_at in the answer")
		}
		// just past the end (20 ms: a timer's lateness on a busy machine)
		time.Sleep(time.Until(v.Override.ExpiresAt) + 20*time.Millisecond)
		ip := fmt.Sprintf("203.0.113.%d", 10+round)
		admitted := 0
		for range 20 {
			if code := s.ask("X-Original-URI", "/x", "X-Real-IP", ip); code == 204 {
				admitted++
			}
		}
		if admitted > worst {
			worst = admitted
		}
		t.Logf("round %d: %d of 20 admitted just after the override's ttl; limit in force %d", round, admitted, s.limiter.Rule("r").Limit)
	}
	if worst > 2 {
		t.Errorf("after a rule override's ttl ended, %d of 20 requests of one client were admitted; the file's limit is 2", worst)
	}
}
