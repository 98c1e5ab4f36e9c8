package adaptive

import (
	"testing"
	"time"
)

// TestNextCooldownDoesNotHoldAReduction: a raise granted while the backend
// was idle must not outlive an overload reading for the whole cooldown.
// The raise is visible to every client (RateLimit-Policy q=150 instead of
// q=100), so a client that waits for it and then floods gets the raised
// limit for up to `cooldown` while the signal already says "overloaded".
// Measured against a running rategate (cooldown 20s, interval 1s): the limit
// stayed 150 for 20.6 s after the signal went from 10 to 90 (table: below
// 50 x1.5, below 80 x1, above x0.5), then fell to 50. The cooldown should
// damp raises (flapping up); a reduction is the protective direction, as
// the return to 1 of a failing signal already is not held back.
func TestNextCooldownDoesNotHoldAReduction(t *testing.T) {
	s := cpu() // cooldown 10s
	t0 := time.Unix(1_700_000_000, 0)
	st := s.Next(Initial(), t0, 60, nil) // x1 (step 1)
	st = s.Next(st, t0.Add(20*time.Second), 10, nil)
	if st.Factor != 1.5 {
		t.Fatalf("idle: factor %g, want 1.5", st.Factor)
	}
	// One second after the raise the backend is overloaded.
	st = s.Next(st, t0.Add(21*time.Second), 95, nil)
	if st.Factor != 0.8 {
		t.Fatalf("overloaded 1s after a raise: factor %g (step %d), want 0.8 at once: the cooldown (%v) holds the raise "+
			"while the signal says overload", st.Factor, st.Step, s.Cooldown)
	}
}
