package storetest

import (
	"context"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

func slidingLogTimeline(t *testing.T, s Store) {
	c := limits.Check{Key: "rg:{t:sl}:sl2", Algorithm: limits.SlidingLog, Limit: 5, PeriodUS: limits.PeriodUS(time.Minute), Burst: 5}
	start := WindowStart(time.Minute)
	const us = time.Microsecond
	RunTimeline(t, s.Store, c, start, []Step{
		// t=1s
		{time.Second, 1, true, 4, 0, time.Minute},
		{0, 1, true, 3, 0, time.Minute}, // same microsecond: counted too
		// t=11s
		{10 * time.Second, 2, true, 1, 0, time.Minute},
		{0, 2, false, 1, 50 * time.Second, time.Minute}, // 1 over: the first 1s entry leaves at 61s
		{0, 1, true, 0, 0, time.Minute},
		{0, 1, false, 0, 50 * time.Second, time.Minute},
		{0, 3, false, 0, time.Minute, time.Minute}, // 3 over: 1+1 at 1s free 2, the 11s entries are needed
		{0, 6, false, 0, NeverFits, time.Minute},   // cost above the limit never fits
		{0, 0, true, 0, 0, time.Minute},            // cost 0 looks without consuming
		// t=60s: the window (0s, 60s] still holds the 1s entries
		{49 * time.Second, 1, false, 0, time.Second, 11 * time.Second},
		// t=61s-1µs
		{time.Second - us, 1, false, 0, us, 10*time.Second + us},
		// t=61s: 1s <= 61s-60s, both 1s entries left; 3 used, 2 fit
		{us, 2, true, 0, 0, time.Minute},
		// t=121s: the 11s and 61s entries are gone (61s <= 121s-60s)
		{time.Minute, 5, true, 0, 0, time.Minute},
		// t=181s: empty log, nothing to reset
		{time.Minute, 0, true, 5, 0, 0},
		{0, 6, false, 5, NeverFits, 0},
	})
}

// slidingLogSameMicrosecond: requests in one microsecond are all
// recorded (the classic bug keys members by timestamp and collapses them).
func slidingLogSameMicrosecond(t *testing.T, s Store) {
	start := WindowStart(time.Minute) + 7
	c := limits.Check{Key: "rg:{t:slsame}:sl2", Algorithm: limits.SlidingLog, Limit: 5, PeriodUS: limits.PeriodUS(time.Minute), Burst: 5}
	RunTimeline(t, s.Store, c, start, []Step{
		{0, 1, true, 4, 0, time.Minute},
		{0, 1, true, 3, 0, time.Minute},
		{0, 1, true, 2, 0, time.Minute},
		{0, 1, true, 1, 0, time.Minute},
		{0, 1, true, 0, 0, time.Minute},
		{0, 1, false, 0, time.Minute, time.Minute},
	})

	// 30 requests with mixed costs in one microsecond: more than ten share
	// a score, so Redis sorts their members "t:10" before "t:2"; nothing
	// may depend on that order.
	big := limits.Check{Key: "rg:{t:slsame30}:sl2", Algorithm: limits.SlidingLog, Limit: 40, PeriodUS: limits.PeriodUS(time.Minute), Burst: 40}
	var steps []Step
	used := int64(0)
	for i := 0; i < 30; i++ {
		cost := int64(1)
		if i%10 == 9 {
			cost = 2
		}
		used += cost
		steps = append(steps, Step{0, cost, true, 40 - used, 0, time.Minute})
	}
	steps = append(steps, Step{0, 8, false, 7, time.Minute, time.Minute})
	// 1s later the same microsecond repeats nothing: still 33 used.
	steps = append(steps, Step{time.Second, 7, true, 0, 0, time.Minute})
	RunTimeline(t, s.Store, big, start, steps)

	raw, err := s.Raw(context.Background(), big.Key)
	if err != nil {
		t.Fatal(err)
	}
	members := raw.ZSet
	if len(members) != 31 {
		t.Fatalf("%d members, want 31 (30 at one microsecond + 1)", len(members))
	}
	// Members are "<n><K>:<cost>": K the running total of the costs, n a
	// letter for K's digit count, so that member order is K order.
	memberRE := regexp.MustCompile(`^([a-p])(\d+):(\d+)$`)
	sum, prevK := int64(0), int64(0)
	for i, z := range members {
		m := memberRE.FindStringSubmatch(z.Member)
		if m == nil || int(m[1][0]-'a'+1) != len(m[2]) {
			t.Fatalf("member %q is not <digit-count letter><K>:<cost>", z.Member)
		}
		k, _ := strconv.ParseInt(m[2], 10, 64)
		cost, _ := strconv.ParseInt(m[3], 10, 64)
		if k != prevK+cost {
			t.Fatalf("member %d %q: running total %d, want %d + %d", i, z.Member, k, prevK, cost)
		}
		if want := float64(start); i == 30 {
			if z.Score != want+1e6 {
				t.Fatalf("member %q has score %v, want %v", z.Member, z.Score, want+1e6)
			}
		} else if z.Score != want {
			t.Fatalf("member %q has score %v, want %v", z.Member, z.Score, want)
		}
		prevK = k
		sum += cost
	}
	if sum != 40 {
		t.Fatalf("costs in members sum to %d, want 40", sum)
	}
}

// slidingLogNeverExceedsLimit: over a long random run, every window
// (t-P, t] ending at an admitted request holds at most L.
func slidingLogNeverExceedsLimit(t *testing.T, s Store) {
	seed := Seed(t)
	rng := rand.New(rand.NewPCG(uint64(seed), 3))
	p := limits.PeriodUS(10 * time.Second)
	c := limits.Check{Key: "rg:{t:slmax}:sl2", Algorithm: limits.SlidingLog, Limit: 7, PeriodUS: p, Burst: 7}
	n := 3000
	if s.Name == "redis" {
		n = 800
	}
	now := WindowStart(10*time.Second) + p // ahead of the wall clock: no sweep
	var admitted []logEntry
	denied := 0
	for i := 0; i < n; i++ {
		switch r := rng.IntN(10); {
		case r < 4: // same microsecond
		case r < 7:
			now += rng.Int64N(p / 20)
		default:
			now += rng.Int64N(p)
		}
		c.Cost = 1 + rng.Int64N(3)
		if r := DecideOne(t, s.Store, c, now); r.Allowed {
			admitted = append(admitted, logEntry{at: now, cost: c.Cost})
		} else {
			denied++
		}
	}
	worst, at := maxInWindow(admitted, p)
	t.Logf("%s: %d requests, %d admitted, %d denied; most in any window of %v: %d (limit %d, window ending at +%v)",
		s.Name, n, len(admitted), denied, time.Duration(p)*time.Microsecond, worst, c.Limit, time.Duration(at-admitted[0].at)*time.Microsecond)
	if worst > c.Limit {
		t.Fatalf("sliding_log admitted %d within one window, limit %d", worst, c.Limit)
	}
	if denied == 0 {
		t.Fatal("nothing was denied: the run did not exercise the limit")
	}
}

func slidingLogTTL(t *testing.T, s Store) {
	p := 10 * time.Second
	c := limits.Check{Key: "rg:{t:slttl}:sl2", Algorithm: limits.SlidingLog, Limit: 5, PeriodUS: limits.PeriodUS(p), Burst: 5, Cost: 1}
	now := time.Now().UnixMicro()
	if r := DecideOne(t, s.Store, c, now); !r.Allowed {
		t.Fatalf("first request denied: %+v", r)
	}
	ttl, ok := s.TTL(c.Key)
	if !ok || ttl <= 0 || ttl > p {
		t.Fatalf("ttl %v (present %v), want in (0, %v]", ttl, ok, p)
	}
	// A denied request creates no key, whether the cost never fits or
	// the (empty) log is simply full for it.
	d := limits.Check{Key: "rg:{t:slttl2}:sl2", Algorithm: limits.SlidingLog, Limit: 1, PeriodUS: limits.PeriodUS(p), Burst: 1, Cost: 2}
	if r := DecideOne(t, s.Store, d, now); r.Allowed {
		t.Fatal("cost 2 over limit 1 allowed")
	}
	if _, ok := s.TTL(d.Key); ok {
		t.Fatal("a denied request created a key")
	}
	// A zero-cost look records nothing either.
	d.Cost = 0
	if r := DecideOne(t, s.Store, d, now); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("cost 0 look: %+v", r)
	}
	if _, ok := s.TTL(d.Key); ok {
		t.Fatal("a zero-cost look created a key")
	}
}

// slidingDeniedByOtherRuleConsumesNothing: when another rule of the
// same request denies, neither sliding algorithm records anything (the memory
// twin's next state is a copy, never written into the stored log).
func slidingDeniedByOtherRuleConsumesNothing(t *testing.T, s Store) {
	now := WindowStart(time.Hour) + limits.PeriodUS(time.Hour) + 5
	for _, algo := range []limits.Algorithm{limits.SlidingLog, limits.SlidingWindow} {
		sliding := limits.Check{Key: "rg:{both:" + string(algo) + "}:" + algo.Suffix(), Algorithm: algo, Limit: 10,
			PeriodUS: limits.PeriodUS(time.Hour), Burst: 10, Cost: 2}
		tight := limits.Check{Key: "rg:{tight:" + string(algo) + "}:fw", Algorithm: limits.FixedWindow, Limit: 1,
			PeriodUS: limits.PeriodUS(time.Hour), Burst: 1, Cost: 1}
		res := make([]limits.Result, 2)
		for i := 0; i < 6; i++ {
			ok, err := s.Store.Decide(context.Background(), &limits.Batch{Checks: []limits.Check{sliding, tight}, NowUS: now + int64(i)}, res)
			if err != nil {
				t.Fatal(err)
			}
			if ok != (i == 0) {
				t.Fatalf("%s request %d: admitted=%v", algo, i, ok)
			}
			if i > 0 && (!res[0].Allowed || res[0].Remaining != 8) {
				t.Fatalf("%s request %d denied by the other rule: sliding verdict %+v, want allowed with 8 left (nothing consumed)", algo, i, res[0])
			}
		}
		if r, err := s.PeekAt(sliding, now+10); err != nil || r.Remaining != 8 {
			t.Fatalf("%s: remaining %d (%v) after 1 admitted and 5 denied, want 8", algo, r.Remaining, err)
		}
	}
}

// logEntry is one admitted request of a timeline: when, and its cost.
type logEntry struct{ at, cost int64 }

// maxInWindow returns the largest sum of costs over (t-p, t] for t an
// admitted time (where every maximum is reached), and that t.
func maxInWindow(admitted []logEntry, p int64) (worst, at int64) {
	lo, sum := 0, int64(0)
	for hi := range admitted {
		sum += admitted[hi].cost
		for admitted[lo].at <= admitted[hi].at-p {
			sum -= admitted[lo].cost
			lo++
		}
		// Requests later in the same microsecond belong to this window too.
		if hi+1 < len(admitted) && admitted[hi+1].at == admitted[hi].at {
			continue
		}
		if sum > worst {
			worst, at = sum, admitted[hi].at
		}
	}
	return worst, at
}
