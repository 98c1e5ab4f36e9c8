package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// redis-cell's documented behaviour for CL.THROTTLE key 4 1 1 (max_burst 4,
// one per second), which gcra with L=1, P=1s, B=5 must reproduce.
func gcraTimeline(t *testing.T, s Store) {
	c := limits.Check{Key: "rg:{t:gcra}:gc", Algorithm: limits.GCRA, Limit: 1, PeriodUS: limits.PeriodUS(time.Second), Burst: 5}
	RunTimeline(t, s.Store, c, time.Now().UnixMicro(), []Step{
		{0, 1, true, 4, 0, 1 * time.Second},
		{0, 1, true, 3, 0, 2 * time.Second},
		{0, 1, true, 2, 0, 3 * time.Second},
		{0, 1, true, 1, 0, 4 * time.Second},
		{0, 1, true, 0, 0, 5 * time.Second},
		{0, 1, false, 0, time.Second, 5 * time.Second}, // sixth at t=0: retry 1 s, reset 5 s
		{0, 0, true, 0, 0, 5 * time.Second},            // cost 0 looks without consuming
		{3 * time.Second, 1, true, 2, 0, 3 * time.Second},
		{100 * time.Millisecond, 1, true, 1, 0, 3900 * time.Millisecond},
		{0, 6, false, 1, NeverFits, 3900 * time.Millisecond},              // cost above the burst never fits
		{0, 2, false, 1, 900 * time.Millisecond, 3900 * time.Millisecond}, // 2 do not fit in 1.1
		{0, 1, true, 0, 0, 4900 * time.Millisecond},
		{time.Hour, 1, true, 4, 0, time.Second}, // a TAT long past is an empty bucket
		{0, 5, false, 4, time.Second, time.Second},
	})
	fresh := c
	fresh.Key = "rg:{t:gcra6}:gc"
	RunTimeline(t, s.Store, fresh, time.Now().UnixMicro(), []Step{
		{0, 6, false, 5, NeverFits, 0}, // cost 6 > burst 5 never fits, even on a fresh key
		{0, 5, true, 0, 0, 5 * time.Second},
	})
}

// T = 1/3 s is not a whole number of µs. The TAT keeps its exact fraction: a
// burst of 3 fits, and the next request fits exactly when a third of a second
// has passed (not 1 µs earlier), as the exact maths say.
func gcraFractionalInterval(t *testing.T, s Store) {
	c := limits.Check{Key: "rg:{t:gcra3}:gc", Algorithm: limits.GCRA, Limit: 3, PeriodUS: limits.PeriodUS(time.Second), Burst: 3}
	us := time.Microsecond
	RunTimeline(t, s.Store, c, time.Now().UnixMicro(), []Step{
		{0, 1, true, 2, 0, 333334 * us}, // 333333.3 µs rounded up
		{0, 1, true, 1, 0, 666667 * us},
		{0, 1, true, 0, 0, time.Second}, // 3 * T is exactly 1 s
		{0, 1, false, 0, 333334 * us, time.Second},
		{333333 * us, 1, false, 0, us, 666667 * us}, // 0.3 µs short
		{us, 1, true, 0, 0, time.Second},            // TAT 999999.3 µs ahead
		{time.Second, 3, true, 0, 0, time.Second},   // past the TAT: a full burst again
	})
}

// After an admission the key lives no longer than the time to a full bucket;
// a denied request creates nothing.
func gcraTTL(t *testing.T, s Store) {
	gtCheckTTL(t, s, limits.GCRA)
}

// gtCheckTTL is the TTL test of gcra and token_bucket: L=5 per 10 s, B=5.
func gtCheckTTL(t *testing.T, s Store, algo limits.Algorithm) {
	t.Helper()
	c := limits.Check{Key: "rg:{t:ttl}:" + algo.Suffix(), Algorithm: algo, Limit: 5, PeriodUS: limits.PeriodUS(10 * time.Second), Burst: 5, Cost: 1}
	now := time.Now().UnixMicro()
	for i, cost := range []int64{1, 3} {
		c.Cost = cost
		r := DecideOne(t, s.Store, c, now)
		if !r.Allowed {
			t.Fatalf("request %d denied: %+v", i, r)
		}
		ttl, ok := s.TTL(c.Key)
		if !ok {
			t.Fatalf("request %d: key has no TTL", i)
		}
		// Redis keeps whole ms, rounded up.
		full := time.Duration((r.ResetUS+999)/1000) * time.Millisecond
		if ttl <= 0 || ttl > full {
			t.Fatalf("request %d: ttl %v, want in (0, %v] (the time to a full bucket, %dµs)", i, ttl, full, r.ResetUS)
		}
	}
	d := c
	d.Key = "rg:{t:ttl2}:" + algo.Suffix()
	d.Cost = 6
	if r := DecideOne(t, s.Store, d, now); r.Allowed {
		t.Fatalf("cost 6 over burst 5 allowed: %+v", r)
	}
	if _, ok := s.TTL(d.Key); ok {
		t.Fatal("a denied request created a key")
	}
	// A request another rule denies writes nothing either.
	other := limits.Check{Key: "rg:{t:ttl3}:fw", Algorithm: limits.FixedWindow, Limit: 1, PeriodUS: limits.PeriodUS(time.Hour), Burst: 1, Cost: 2}
	d.Key, d.Cost = "rg:{t:ttl3}:"+algo.Suffix(), 1
	res := make([]limits.Result, 2)
	ok, err := s.Store.Decide(context.Background(), &limits.Batch{Checks: []limits.Check{d, other}, NowUS: now}, res)
	if err != nil {
		t.Fatal(err)
	}
	if ok || !res[0].Allowed || res[0].Remaining != 5 {
		t.Fatalf("admitted=%v, %s verdict %+v: want denied by the other rule, this one allowed with 5 left", ok, algo, res[0])
	}
	if _, ok := s.TTL(d.Key); ok {
		t.Fatal("a request denied by another rule created a key")
	}
}
