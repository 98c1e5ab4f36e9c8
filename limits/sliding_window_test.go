package limits

import (
	"testing"
	"time"
)

func TestSlidingWindowTimeline(t *testing.T) {
	STForEach(t, func(t *testing.T, s STStore) {
		c := Check{Key: "rg:{t:sw}:sw", Algorithm: SlidingWindow, Limit: 50, PeriodUS: PeriodUS(time.Minute), Burst: 50}
		start := STWindowStart(time.Minute)
		const us = time.Microsecond
		var steps []STStep
		// Window w: 42 requests at 30s. No previous window, so est = curr;
		// the state matters until the end of w+1 (reset 90s).
		for k := int64(1); k <= 42; k++ {
			adv := time.Duration(0)
			if k == 1 {
				adv = 30 * time.Second
			}
			steps = append(steps, STStep{adv, 1, true, 50 - k, 0, 90 * time.Second})
		}
		// Window w+1, 15s in: prev 42 weighs 0.75, est = 31.5 + curr, so
		// after the k-th request remaining = floor(50 - 31.5 - k) = 18 - k.
		for k := int64(1); k <= 18; k++ {
			adv := time.Duration(0)
			if k == 1 {
				adv = 45 * time.Second
			}
			steps = append(steps, STStep{adv, 1, true, 18 - k, 0, 105 * time.Second})
		}
		steps = append(steps,
			// Cloudflare's example: 42*0.75 + 18 = 49.5, and 49.5 + 1 > 50.
			// It fits once 42*(1 - e/60s) <= 31, e >= 60s*11/42 = 15.7142857s.
			STStep{0, 1, false, 0, 714286 * us, 105 * time.Second},
			STStep{0, 0, true, 0, 0, 105 * time.Second},             // cost 0 looks: 49.5 <= 50
			STStep{0, 51, false, 0, STNeverFits, 105 * time.Second}, // above the limit
			// At e = 15.714286s: est = 48.9999998, so 1 fits, floor(0.0000002) = 0 left.
			STStep{714286 * us, 1, true, 0, 0, 105*time.Second - 714286*us},
			// Cost 2 needs 42*(1 - e/60s) <= 29: e >= 18.5714286s.
			STStep{0, 2, false, 0, 2857143 * us, 105*time.Second - 714286*us},
			// e = 59s: est = 42/60 + 19 = 19.7. Cost 31 needs prev's weight
			// at 0, which this window never reaches; in w+2, prev = 19 and
			// 19 + 31 <= 50 at once: retry = 1s.
			STStep{59*time.Second - 15714286*us, 31, false, 30, time.Second, 61 * time.Second},
			// Cost 50 needs 0 in both terms: only window w+3 is empty.
			STStep{0, 50, false, 30, 61 * time.Second, 61 * time.Second},
			// Window w+2 start: est = 19 + 0; 19 + 31 = 50 fits exactly.
			STStep{time.Second, 31, true, 0, 0, 2 * time.Minute},
			STStep{0, 0, true, 0, 0, 2 * time.Minute},
			// Window w+4: the w+2 state is two windows old, so prev = curr = 0.
			STStep{2 * time.Minute, 50, true, 0, 0, 2 * time.Minute},
			// Window w+5, 30s in: only prev = 50 at weight 0.5 is left, gone
			// at the end of this window.
			STStep{90 * time.Second, 0, true, 25, 0, 30 * time.Second},
			// Cost 26 needs 50*(1 - e/60s) <= 24: e >= 31.2s.
			STStep{0, 26, false, 25, 1200 * time.Millisecond, 30 * time.Second},
			STStep{1200 * time.Millisecond, 26, true, 0, 0, 2*time.Minute - 31200*time.Millisecond},
		)
		STRunTimeline(t, s.Store, c, start, steps)
	})
}

func TestSlidingWindowTTL(t *testing.T) {
	STForEach(t, func(t *testing.T, s STStore) {
		p := 10 * time.Second
		c := Check{Key: "rg:{t:swttl}:sw", Algorithm: SlidingWindow, Limit: 5, PeriodUS: PeriodUS(p), Burst: 5, Cost: 1}
		now := time.Now().UnixMicro()
		r := STDecideOne(t, s.Store, c, now)
		if !r.Allowed {
			t.Fatalf("first request denied: %+v", r)
		}
		ttl, ok := s.TTL(c.Key)
		if !ok {
			t.Fatal("key has no TTL")
		}
		// The key lives until the end of the next window, which is the
		// reset: its count is that window's prev.
		reset := time.Duration(r.ResetUS) * time.Microsecond
		if ttl <= 0 || ttl > reset+time.Millisecond || ttl > 2*p {
			t.Fatalf("ttl %v, want in (0, min(%v, 2P)]", ttl, reset)
		}
		d := Check{Key: "rg:{t:swttl2}:sw", Algorithm: SlidingWindow, Limit: 1, PeriodUS: PeriodUS(p), Burst: 1, Cost: 2}
		if r := STDecideOne(t, s.Store, d, now); r.Allowed {
			t.Fatal("cost 2 over limit 1 allowed")
		}
		if _, ok := s.TTL(d.Key); ok {
			t.Fatal("a denied request created a key")
		}
		d.Cost = 0
		if r := STDecideOne(t, s.Store, d, now); !r.Allowed || r.Remaining != 1 || r.ResetUS != 0 {
			t.Fatalf("cost 0 look on an empty key: %+v", r)
		}
		if _, ok := s.TTL(d.Key); ok {
			t.Fatal("a zero-cost look created a key")
		}
	})
}

func TestSlidingWindowStandaloneScript(t *testing.T) {
	const s = int64(time.Second / time.Microsecond)
	p := 60 * s
	start := STWindowStart(time.Minute)
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
