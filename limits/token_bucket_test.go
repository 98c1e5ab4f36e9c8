package limits

import (
	"testing"
	"time"
)

// A bucket of 5 refilled at one token per second, starting full.
func TestTokenBucketTimeline(t *testing.T) {
	STForEach(t, func(t *testing.T, s STStore) {
		c := Check{Key: "rg:{t:tb}:tb", Algorithm: TokenBucket, Limit: 1, PeriodUS: PeriodUS(time.Second), Burst: 5}
		ms := time.Millisecond
		STRunTimeline(t, s.Store, c, time.Now().UnixMicro(), []STStep{
			{0, 1, true, 4, 0, 1 * time.Second}, // reset = time until full again
			{0, 1, true, 3, 0, 2 * time.Second},
			{0, 3, true, 0, 0, 5 * time.Second},
			{0, 1, false, 0, time.Second, 5 * time.Second},
			{0, 0, true, 0, 0, 5 * time.Second},                           // cost 0 looks without consuming
			{500 * ms, 1, false, 0, 500 * ms, 4500 * ms},                  // half a token
			{500 * ms, 1, true, 0, 0, 5 * time.Second},                    // one whole token
			{2500 * ms, 2, true, 0, 0, 4500 * ms},                         // 2.5 refilled, 2 taken, the half kept
			{0, 6, false, 0, STNeverFits, 4500 * ms},                      // cost above the burst never fits
			{1200 * ms, 0, true, 1, 0, 3300 * ms},                         // 0.5 + 1.2 s refilled: 1 token and 0.7 of the next
			{3300*ms - time.Microsecond, 0, true, 4, 0, time.Microsecond}, // 1 µs short of full
			{time.Microsecond, 0, true, 5, 0, 0},                          // complete refill, exactly on time
			{0, 5, true, 0, 0, 5 * time.Second},
			{time.Hour, 5, true, 0, 0, 5 * time.Second}, // long idle: full, never more than B
			{0, 1, false, 0, time.Second, 5 * time.Second},
		})
		fresh := c
		fresh.Key = "rg:{t:tb6}:tb"
		STRunTimeline(t, s.Store, fresh, time.Now().UnixMicro(), []STStep{
			{0, 6, false, 5, STNeverFits, 0}, // a fresh bucket is full, and 6 never fit in 5
			{0, 5, true, 0, 0, 5 * time.Second},
		})
	})
}

// T = 10/3 s is not a whole number of µs. The refill is counted exactly, but
// an admission keeps only the whole µs earned towards the next token: the
// 0.67 µs below are given up, so the bucket admits 1 µs later than the exact
// maths would (step 3) and never earlier. gcra with the same rule loses
// nothing (TestGCRAFractionalInterval).
func TestTokenBucketFractionalRefill(t *testing.T) {
	STForEach(t, func(t *testing.T, s STStore) {
		c := Check{Key: "rg:{t:tb3}:tb", Algorithm: TokenBucket, Limit: 3, PeriodUS: PeriodUS(10 * time.Second), Burst: 2}
		us := time.Microsecond
		STRunTimeline(t, s.Store, c, time.Now().UnixMicro(), []STStep{
			{0, 2, true, 0, 0, 6666667 * us},
			{3333334 * us, 1, true, 0, 0, 6666667 * us}, // 1 token + 0.67 µs earned; the 0.67 µs dropped
			{3333333 * us, 1, false, 0, us, 3333334 * us},
			{us, 1, true, 0, 0, 6666667 * us},
		})
	})
}

func TestTokenBucketTTL(t *testing.T) {
	STForEach(t, func(t *testing.T, s STStore) {
		gtCheckTTL(t, s, TokenBucket)
	})
}

func TestTokenBucketStandaloneScript(t *testing.T) {
	gtStandalone(t, "token_bucket.lua", "rg:{demo:1.2.3.4}:tb")
}
