package storetest

import (
	"context"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

func fixedWindowTimeline(t *testing.T, s Store) {
	c := limits.Check{Key: "rg:{t:fw}:fw", Algorithm: limits.FixedWindow, Limit: 5, PeriodUS: limits.PeriodUS(time.Minute), Burst: 5}
	start := WindowStart(time.Minute)
	RunTimeline(t, s.Store, c, start, []Step{
		{time.Second, 1, true, 4, 0, 59 * time.Second},
		{0, 1, true, 3, 0, 59 * time.Second},
		{10 * time.Second, 2, true, 1, 0, 49 * time.Second},
		{0, 2, false, 1, 49 * time.Second, 49 * time.Second}, // cost 2 does not fit in 1
		{0, 1, true, 0, 0, 49 * time.Second},
		{0, 1, false, 0, 49 * time.Second, 49 * time.Second},
		{48*time.Second + 999*time.Millisecond, 1, false, 0, time.Millisecond, time.Millisecond},
		{time.Millisecond, 1, true, 4, 0, time.Minute}, // new window aligned to the epoch
		{0, 6, false, 4, NeverFits, time.Minute},       // cost above the limit never fits
		{0, 0, true, 4, 0, time.Minute},                // cost 0 looks without consuming
	})
}

func fixedWindowTTL(t *testing.T, s Store) {
	c := limits.Check{Key: "rg:{t:ttl}:fw", Algorithm: limits.FixedWindow, Limit: 5, PeriodUS: limits.PeriodUS(10 * time.Second), Burst: 5, Cost: 1}
	now := time.Now().UnixMicro()
	r := DecideOne(t, s.Store, c, now)
	if !r.Allowed {
		t.Fatalf("first request denied: %+v", r)
	}
	ttl, ok := s.TTL(c.Key)
	if !ok {
		t.Fatal("key has no TTL")
	}
	reset := time.Duration(r.ResetUS) * time.Microsecond
	if ttl <= 0 || ttl > reset+time.Millisecond || ttl > 10*time.Second {
		t.Fatalf("ttl %v, want in (0, %v] (the rest of the window)", ttl, reset)
	}
	// A denied request neither creates nor extends keys.
	d := limits.Check{Key: "rg:{t:ttl2}:fw", Algorithm: limits.FixedWindow, Limit: 1, PeriodUS: limits.PeriodUS(10 * time.Second), Burst: 1, Cost: 2}
	if r := DecideOne(t, s.Store, d, now); r.Allowed {
		t.Fatal("cost 2 over limit 1 allowed")
	}
	if _, ok := s.TTL(d.Key); ok {
		t.Fatal("a denied request created a key")
	}
}

func multiRuleAllOrNothing(t *testing.T, s Store) {
	start := WindowStart(time.Hour) + 1
	user := limits.Check{Key: "rg:{user:alice}:fw", Algorithm: limits.FixedWindow, Limit: 3, PeriodUS: limits.PeriodUS(time.Hour), Burst: 3, Cost: 1}
	global := limits.Check{Key: "rg:{global:}:fw", Algorithm: limits.FixedWindow, Limit: 100, PeriodUS: limits.PeriodUS(time.Hour), Burst: 100, Cost: 1}
	res := make([]limits.Result, 2)
	allowed := 0
	for i := 0; i < 10; i++ {
		ok, err := s.Store.Decide(context.Background(), &limits.Batch{Checks: []limits.Check{user, global}, NowUS: start}, res)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			allowed++
		} else if !res[1].Allowed || res[1].Remaining != 97 {
			t.Fatalf("denied request: global verdict %+v, want allowed with 97 left (nothing consumed)", res[1])
		}
	}
	if allowed != 3 {
		t.Fatalf("admitted %d, want 3", allowed)
	}
	g, err := s.PeekAt(global, start)
	if err != nil {
		t.Fatal(err)
	}
	if g.Remaining != 97 {
		t.Fatalf("global remaining %d after 3 admitted and 7 denied, want 97: denied requests burned the global quota", g.Remaining)
	}

	// The other way round: the global rule denies, the user quota is untouched.
	tight := limits.Check{Key: "rg:{tight:}:fw", Algorithm: limits.FixedWindow, Limit: 2, PeriodUS: limits.PeriodUS(time.Hour), Burst: 2, Cost: 1}
	bob := limits.Check{Key: "rg:{user:bob}:fw", Algorithm: limits.FixedWindow, Limit: 10, PeriodUS: limits.PeriodUS(time.Hour), Burst: 10, Cost: 1}
	for i := 0; i < 5; i++ {
		if _, err := s.Store.Decide(context.Background(), &limits.Batch{Checks: []limits.Check{bob, tight}, NowUS: start}, res); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := s.PeekAt(bob, start)
	if b.Remaining != 8 {
		t.Fatalf("bob remaining %d, want 8", b.Remaining)
	}
}

func shadowRuleNeverDenies(t *testing.T, s Store) {
	start := WindowStart(time.Hour) + 1
	shadow := limits.Check{Key: "rg:{sh:x}:fw", Algorithm: limits.FixedWindow, Limit: 2, PeriodUS: limits.PeriodUS(time.Hour), Burst: 2, Cost: 1, Shadow: true}
	real := limits.Check{Key: "rg:{real:x}:fw", Algorithm: limits.FixedWindow, Limit: 5, PeriodUS: limits.PeriodUS(time.Hour), Burst: 5, Cost: 1}
	res := make([]limits.Result, 2)
	var shadowDenied int
	for i := 0; i < 5; i++ {
		ok, err := s.Store.Decide(context.Background(), &limits.Batch{Checks: []limits.Check{shadow, real}, NowUS: start}, res)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("request %d denied; only the shadow rule is over its limit", i)
		}
		if !res[0].Allowed {
			shadowDenied++
		}
	}
	if shadowDenied != 3 {
		t.Fatalf("shadow rule reported %d denials, want 3", shadowDenied)
	}
	if r, _ := s.PeekAt(shadow, start); r.Remaining != 0 {
		t.Fatalf("shadow remaining %d, want 0 (2 consumed, the rest not)", r.Remaining)
	}
	if r, _ := s.PeekAt(real, start); r.Remaining != 0 {
		t.Fatalf("real remaining %d, want 0", r.Remaining)
	}
}

func concurrentAdmitsExactlyLimit(t *testing.T, s Store) {
	for _, algo := range limits.Algorithms {
		t.Run(string(algo), func(t *testing.T) {
			c := limits.Check{Key: "rg:{conc:" + string(algo) + "}:" + algo.Suffix(), Algorithm: algo, Limit: 50,
				PeriodUS: limits.PeriodUS(ConcurrencyPeriod), Burst: 50, Cost: 1}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			startGate := make(chan struct{})
			errs := make(chan error, 200)
			for i := 0; i < 200; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-startGate
					var r [1]limits.Result
					ok, err := s.Store.Decide(context.Background(), &limits.Batch{Checks: []limits.Check{c}}, r[:])
					if err != nil {
						errs <- err
						return
					}
					if ok {
						admitted.Add(1)
					}
				}()
			}
			close(startGate)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := admitted.Load(); got != 50 {
				t.Fatalf("admitted %d of 200 concurrent requests, want exactly 50", got)
			}
		})
	}
}

// recordRaw: a store shows an algorithm's string record as its numbers by
// name, as the Redis scripts store them (the admin API's raw value): for
// each algorithm with a record, after one admission of cost 2 into an empty
// key of limit and burst 5 per hour, at the wall clock's instant (the
// memory store shows a record as it stands on that clock).
func recordRaw(t *testing.T, s Store) {
	p := limits.PeriodUS(time.Hour)
	at := time.Now().UnixMicro()
	start := at - at%p
	i := func(n int64) string { return strconv.FormatInt(n, 10) }
	for _, tc := range []struct {
		algo limits.Algorithm
		want map[string]string
	}{
		{limits.FixedWindow, map[string]string{"e": i(start + p), "n": "2"}},
		{limits.SlidingWindow, map[string]string{"e": i(start + p), "c": "2", "p": "0", "d": i(p)}},
		// the TAT: two intervals of 12 minutes after now
		{limits.GCRA, map[string]string{"t": i(at + 2*p/5), "f": "0", "l": "5", "p": i(p)}},
		{limits.TokenBucket, map[string]string{"tokens": "3", "ts": i(at), "l": "5", "p": i(p), "b": "5"}},
	} {
		c := limits.Check{Key: "rg:{t:raw}:" + tc.algo.Suffix(), Algorithm: tc.algo, Limit: 5, PeriodUS: p, Burst: 5, Cost: 2}
		DecideOne(t, s.Store, c, at)
		raw, err := s.Raw(context.Background(), c.Key)
		if err != nil {
			t.Fatal(err)
		}
		if raw.Type != "string" || !maps.Equal(raw.Record, tc.want) || raw.String != "" || raw.TTLMS <= 0 {
			t.Errorf("%s: raw %+v, want a string record %v with a TTL", tc.algo, raw, tc.want)
		}
	}
}
