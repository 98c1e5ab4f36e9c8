package memstore

import (
	"testing"
)

// TestSlidingWindowFloatConvention pins the documented double expression
// est = prev * (1 - elapsed/P) + curr: with prev 15 at elapsed = P/3 it
// gives 15 * 0.66666666666666674 = 10.000000000000002, one ulp above the
// real 10 (the suite's test of the same name runs the timeline this implies
// on every store).
func TestSlidingWindowFloatConvention(t *testing.T) {
	if got := swEstimate(15, 0, 20_000_000, 60_000_000); got != 10.000000000000002 {
		t.Fatalf("swEstimate(15, 0, P/3, P) = %.17g, want 10.000000000000002", got)
	}
}
