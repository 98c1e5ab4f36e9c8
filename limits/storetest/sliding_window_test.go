package storetest

import (
	"testing"
	"time"
)

func TestSlidingWindowStandaloneScript(t *testing.T) {
	const s = int64(time.Second / time.Microsecond)
	p := 60 * s
	start := WindowStart(time.Minute)
	// Cloudflare's example at limit 4 instead of 50: prev 4, 45s into the
	// next window prev weighs 0.25 → est = 1 + curr.
	runStandalone(t, "sliding_window.lua", "rg:{demo:1.2.3.4}:sw", 4, p, start, []standaloneStep{
		{10 * s, 1, [4]int64{1, 3, 2*p - 10*s, 0}},
		{10 * s, 3, [4]int64{1, 0, 2*p - 10*s, 0}},
		{10 * s, 1, [4]int64{0, 0, 2*p - 10*s, 65 * s}}, // curr 4 stays all of w; in w+1, 4*(1-e/P) + 1 <= 4 at e = 15s
		{p + 45*s, 1, [4]int64{1, 2, 2*p - 45*s, 0}},    // est = 1 + 1 = 2
		{p + 45*s, 2, [4]int64{1, 0, 2*p - 45*s, 0}},    // est = 1 + 3 = 4
		{p + 45*s, 5, [4]int64{0, 0, 2*p - 45*s, -1}},
		{p + 45*s, 1, [4]int64{0, 0, 2*p - 45*s, 15 * s}}, // 4*(1-e/P) + 3 + 1 <= 4 only at e = P: w+2, where prev 3 fits
	})
}
