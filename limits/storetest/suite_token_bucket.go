package storetest

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// A bucket of 5 refilled at one token per second, starting full.
func tokenBucketTimeline(t *testing.T, s Store) {
	c := limits.Check{Key: "rg:{t:tb}:tb", Algorithm: limits.TokenBucket, Limit: 1, PeriodUS: limits.PeriodUS(time.Second), Burst: 5}
	ms := time.Millisecond
	RunTimeline(t, s.Store, c, time.Now().UnixMicro(), []Step{
		{0, 1, true, 4, 0, 1 * time.Second}, // reset = time until full again
		{0, 1, true, 3, 0, 2 * time.Second},
		{0, 3, true, 0, 0, 5 * time.Second},
		{0, 1, false, 0, time.Second, 5 * time.Second},
		{0, 0, true, 0, 0, 5 * time.Second},                           // cost 0 looks without consuming
		{500 * ms, 1, false, 0, 500 * ms, 4500 * ms},                  // half a token
		{500 * ms, 1, true, 0, 0, 5 * time.Second},                    // one whole token
		{2500 * ms, 2, true, 0, 0, 4500 * ms},                         // 2.5 refilled, 2 taken, the half kept
		{0, 6, false, 0, NeverFits, 4500 * ms},                        // cost above the burst never fits
		{1200 * ms, 0, true, 1, 0, 3300 * ms},                         // 0.5 + 1.2 s refilled: 1 token and 0.7 of the next
		{3300*ms - time.Microsecond, 0, true, 4, 0, time.Microsecond}, // 1 µs short of full
		{time.Microsecond, 0, true, 5, 0, 0},                          // complete refill, exactly on time
		{0, 5, true, 0, 0, 5 * time.Second},
		{time.Hour, 5, true, 0, 0, 5 * time.Second}, // long idle: full, never more than B
		{0, 1, false, 0, time.Second, 5 * time.Second},
	})
	fresh := c
	fresh.Key = "rg:{t:tb6}:tb"
	RunTimeline(t, s.Store, fresh, time.Now().UnixMicro(), []Step{
		{0, 6, false, 5, NeverFits, 0}, // a fresh bucket is full, and 6 never fit in 5
		{0, 5, true, 0, 0, 5 * time.Second},
	})
}

// T = 10/3 s is not a whole number of µs. The refill is counted exactly, but
// an admission keeps only the whole µs earned towards the next token: the
// 0.67 µs below are given up, so the bucket admits 1 µs later than the exact
// maths would (step 3) and never earlier. gcra with the same rule loses
// nothing (TestGCRAFractionalInterval).
func tokenBucketFractionalRefill(t *testing.T, s Store) {
	c := limits.Check{Key: "rg:{t:tb3}:tb", Algorithm: limits.TokenBucket, Limit: 3, PeriodUS: limits.PeriodUS(10 * time.Second), Burst: 2}
	us := time.Microsecond
	RunTimeline(t, s.Store, c, time.Now().UnixMicro(), []Step{
		{0, 2, true, 0, 0, 6666667 * us},
		{3333334 * us, 1, true, 0, 0, 6666667 * us}, // 1 token + 0.67 µs earned; the 0.67 µs dropped
		{3333333 * us, 1, false, 0, us, 3333334 * us},
		{us, 1, true, 0, 0, 6666667 * us},
	})
}

func tokenBucketTTL(t *testing.T, s Store) {
	gtCheckTTL(t, s, limits.TokenBucket)
}
