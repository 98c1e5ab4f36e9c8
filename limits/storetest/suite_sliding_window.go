package storetest

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

func slidingWindowTimeline(t *testing.T, s Store) {
	c := limits.Check{Key: "rg:{t:sw}:sw", Algorithm: limits.SlidingWindow, Limit: 50, PeriodUS: limits.PeriodUS(time.Minute), Burst: 50}
	start := WindowStart(time.Minute)
	const us = time.Microsecond
	var steps []Step
	// Window w: 42 requests at 30s. No previous window, so est = curr;
	// the state matters until the end of w+1 (reset 90s).
	for k := int64(1); k <= 42; k++ {
		adv := time.Duration(0)
		if k == 1 {
			adv = 30 * time.Second
		}
		steps = append(steps, Step{adv, 1, true, 50 - k, 0, 90 * time.Second})
	}
	// Window w+1, 15s in: prev 42 weighs 0.75, est = 31.5 + curr, so
	// after the k-th request remaining = floor(50 - 31.5 - k) = 18 - k.
	for k := int64(1); k <= 18; k++ {
		adv := time.Duration(0)
		if k == 1 {
			adv = 45 * time.Second
		}
		steps = append(steps, Step{adv, 1, true, 18 - k, 0, 105 * time.Second})
	}
	steps = append(steps,
		// Cloudflare's example: 42*0.75 + 18 = 49.5, and 49.5 + 1 > 50.
		// It fits once 42*(1 - e/60s) <= 31, e >= 60s*11/42 = 15.7142857s.
		Step{0, 1, false, 0, 714286 * us, 105 * time.Second},
		Step{0, 0, true, 0, 0, 105 * time.Second},           // cost 0 looks: 49.5 <= 50
		Step{0, 51, false, 0, NeverFits, 105 * time.Second}, // above the limit
		// At e = 15.714286s: est = 48.9999998, so 1 fits, floor(0.0000002) = 0 left.
		Step{714286 * us, 1, true, 0, 0, 105*time.Second - 714286*us},
		// Cost 2 needs 42*(1 - e/60s) <= 29: e >= 18.5714286s.
		Step{0, 2, false, 0, 2857143 * us, 105*time.Second - 714286*us},
		// e = 59s: est = 42/60 + 19 = 19.7. Cost 31 needs prev's weight
		// at 0, which this window never reaches; in w+2, prev = 19 and
		// 19 + 31 <= 50 at once: retry = 1s.
		Step{59*time.Second - 15714286*us, 31, false, 30, time.Second, 61 * time.Second},
		// Cost 50 needs 0 in both terms: only window w+3 is empty.
		Step{0, 50, false, 30, 61 * time.Second, 61 * time.Second},
		// Window w+2 start: est = 19 + 0; 19 + 31 = 50 fits exactly.
		Step{time.Second, 31, true, 0, 0, 2 * time.Minute},
		Step{0, 0, true, 0, 0, 2 * time.Minute},
		// Window w+4: the w+2 state is two windows old, so prev = curr = 0.
		Step{2 * time.Minute, 50, true, 0, 0, 2 * time.Minute},
		// Window w+5, 30s in: only prev = 50 at weight 0.5 is left, gone
		// at the end of this window.
		Step{90 * time.Second, 0, true, 25, 0, 30 * time.Second},
		// Cost 26 needs 50*(1 - e/60s) <= 24: e >= 31.2s.
		Step{0, 26, false, 25, 1200 * time.Millisecond, 30 * time.Second},
		Step{1200 * time.Millisecond, 26, true, 0, 0, 2*time.Minute - 31200*time.Millisecond},
	)
	RunTimeline(t, s.Store, c, start, steps)
}

func slidingWindowTTL(t *testing.T, s Store) {
	p := 10 * time.Second
	c := limits.Check{Key: "rg:{t:swttl}:sw", Algorithm: limits.SlidingWindow, Limit: 5, PeriodUS: limits.PeriodUS(p), Burst: 5, Cost: 1}
	now := time.Now().UnixMicro()
	r := DecideOne(t, s.Store, c, now)
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
	d := limits.Check{Key: "rg:{t:swttl2}:sw", Algorithm: limits.SlidingWindow, Limit: 1, PeriodUS: limits.PeriodUS(p), Burst: 1, Cost: 2}
	if r := DecideOne(t, s.Store, d, now); r.Allowed {
		t.Fatal("cost 2 over limit 1 allowed")
	}
	if _, ok := s.TTL(d.Key); ok {
		t.Fatal("a denied request created a key")
	}
	d.Cost = 0
	if r := DecideOne(t, s.Store, d, now); !r.Allowed || r.Remaining != 1 || r.ResetUS != 0 {
		t.Fatalf("cost 0 look on an empty key: %+v", r)
	}
	if _, ok := s.TTL(d.Key); ok {
		t.Fatal("a zero-cost look created a key")
	}
}

// slidingWindowFloatConvention pins the documented double expression
// est = prev * (1 - elapsed/P) + curr on every store. With prev 15 at
// elapsed = P/3 it gives 15 * 0.66666666666666674 = 10.000000000000002, one
// ulp above the real 10, so remaining is floor(15 - 10.000000000000002 - k)
// = 4 - k, and the fifth request is denied by that ulp and fits 1µs later;
// prev * (P - elapsed) / P would give exactly 10, one more remaining and
// allow it. Whichever expression is used, Lua and Go must use the same one.
func slidingWindowFloatConvention(t *testing.T, s Store) {
	c := limits.Check{Key: "rg:{t:swfloat}:sw", Algorithm: limits.SlidingWindow, Limit: 15, PeriodUS: limits.PeriodUS(time.Minute), Burst: 15}
	const us = time.Microsecond
	RunTimeline(t, s.Store, c, WindowStart(time.Minute), []Step{
		{time.Second, 15, true, 0, 0, 119 * time.Second},
		// Next window, 20s in.
		{79 * time.Second, 1, true, 3, 0, 100 * time.Second},
		{0, 1, true, 2, 0, 100 * time.Second},
		{0, 1, true, 1, 0, 100 * time.Second},
		{0, 1, true, 0, 0, 100 * time.Second},
		{0, 1, false, 0, us, 100 * time.Second},   // 14.000000000000002 + 1 > 15
		{us, 1, true, 0, 0, 100*time.Second - us}, // 9.99999975 + 4 + 1
	})
}
