package limits

import (
	"testing"
	"time"
)

// TestSlidingWindowFloatConvention pins the documented double expression
// est = prev * (1 - elapsed/P) + curr on both stores. With prev 15 at
// elapsed = P/3 it gives 15 * 0.66666666666666674 = 10.000000000000002, one
// ulp above the real 10, so remaining is floor(15 - 10.000000000000002 - k)
// = 4 - k, and the fifth request is denied by that ulp and fits 1µs later;
// prev * (P - elapsed) / P would give exactly 10, one more remaining and
// allow it. Whichever expression is used, Lua and Go must use the same one.
func TestSlidingWindowFloatConvention(t *testing.T) {
	if got := swEstimate(15, 0, 20_000_000, 60_000_000); got != 10.000000000000002 {
		t.Fatalf("swEstimate(15, 0, P/3, P) = %.17g, want 10.000000000000002", got)
	}
	STForEach(t, func(t *testing.T, s STStore) {
		c := Check{Key: "rg:{t:swfloat}:sw", Algorithm: SlidingWindow, Limit: 15, PeriodUS: PeriodUS(time.Minute), Burst: 15}
		const us = time.Microsecond
		STRunTimeline(t, s.Store, c, STWindowStart(time.Minute), []STStep{
			{time.Second, 15, true, 0, 0, 119 * time.Second},
			// Next window, 20s in.
			{79 * time.Second, 1, true, 3, 0, 100 * time.Second},
			{0, 1, true, 2, 0, 100 * time.Second},
			{0, 1, true, 1, 0, 100 * time.Second},
			{0, 1, true, 0, 0, 100 * time.Second},
			{0, 1, false, 0, us, 100 * time.Second},   // 14.000000000000002 + 1 > 15
			{us, 1, true, 0, 0, 100*time.Second - us}, // 9.99999975 + 4 + 1
		})
	})
}
