package limits

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// storeUnderTest is one store plus the test-only views the conformance
// suite needs: a controllable clock for peeks and the remaining TTL of a key.
type storeUnderTest struct {
	name   string
	store  Store
	peekAt func(c Check, nowUS int64) (Result, error)
	ttl    func(key string) (time.Duration, bool)
}

// forEachStore runs fn once against a fresh memory store, once against a
// fresh real redis-server and once against a real Redis Cluster (emptied).
func forEachStore(t *testing.T, fn func(t *testing.T, s storeUnderTest)) {
	t.Run("memory", func(t *testing.T) {
		m := newMemoryStore(50 * time.Millisecond)
		t.Cleanup(func() { m.Close() })
		fn(t, storeUnderTest{
			name: "memory", store: m,
			peekAt: m.PeekAt,
			ttl:    m.TTL,
		})
	})
	t.Run("redis", func(t *testing.T) {
		srv := testredis.Start(t)
		client := srv.Client(t)
		rs, err := NewRedisStore(client, "redis "+srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		fn(t, storeUnderTest{
			name: "redis", store: rs,
			peekAt: func(c Check, now int64) (Result, error) {
				return rs.PeekAt(context.Background(), c, now)
			},
			ttl: func(key string) (time.Duration, bool) {
				d, err := client.PTTL(context.Background(), key).Result()
				if err != nil || d < 0 {
					return 0, false
				}
				return d, true
			},
		})
	})
	t.Run("redis-cluster", func(t *testing.T) { fn(t, clusterStoreUnderTest(t)) })
}

// windowStart returns the start of the current epoch-aligned window of
// length p, in µs: timelines start there so TTLs relative to the fake clock
// stay close to Redis's own clock.
func windowStart(p time.Duration) int64 {
	pu := PeriodUS(p)
	return time.Now().UnixMicro() / pu * pu
}

func decideOne(t *testing.T, s Store, c Check, now int64) Result {
	t.Helper()
	var r [1]Result
	admitted, err := s.Decide(context.Background(), &Batch{Checks: []Check{c}, NowUS: now}, r[:])
	if err != nil {
		t.Fatalf("decide: %v", err)
	}
	if admitted != r[0].Allowed && !c.Shadow {
		t.Fatalf("admitted=%v but rule allowed=%v", admitted, r[0].Allowed)
	}
	return r[0]
}

// step is one request of a timeline: advance the clock, send cost, expect.
type step struct {
	advance       time.Duration
	cost          int64
	wantAllowed   bool
	wantRemaining int64
	wantRetry     time.Duration // -1µs = NeverFits
	wantReset     time.Duration
}

const neverFits = time.Duration(NeverFits) * time.Microsecond

func runTimeline(t *testing.T, s Store, c Check, start int64, steps []step) {
	t.Helper()
	now := start
	for i, st := range steps {
		now += int64(st.advance / time.Microsecond)
		c.Cost = st.cost
		r := decideOne(t, s, c, now)
		got := step{advance: st.advance, cost: st.cost, wantAllowed: r.Allowed, wantRemaining: r.Remaining,
			wantRetry: time.Duration(r.RetryUS) * time.Microsecond, wantReset: time.Duration(r.ResetUS) * time.Microsecond}
		if got != st {
			t.Fatalf("step %d (t=+%v): got %+v\nwant %+v", i, time.Duration(now-start)*time.Microsecond, got, st)
		}
	}
}

func TestFixedWindowTimeline(t *testing.T) {
	forEachStore(t, func(t *testing.T, s storeUnderTest) {
		c := Check{Key: "rg:{t:fw}:fw", Algorithm: FixedWindow, Limit: 5, PeriodUS: PeriodUS(time.Minute), Burst: 5}
		start := windowStart(time.Minute)
		runTimeline(t, s.store, c, start, []step{
			{time.Second, 1, true, 4, 0, 59 * time.Second},
			{0, 1, true, 3, 0, 59 * time.Second},
			{10 * time.Second, 2, true, 1, 0, 49 * time.Second},
			{0, 2, false, 1, 49 * time.Second, 49 * time.Second}, // cost 2 does not fit in 1
			{0, 1, true, 0, 0, 49 * time.Second},
			{0, 1, false, 0, 49 * time.Second, 49 * time.Second},
			{48*time.Second + 999*time.Millisecond, 1, false, 0, time.Millisecond, time.Millisecond},
			{time.Millisecond, 1, true, 4, 0, time.Minute}, // new window aligned to the epoch
			{0, 6, false, 4, neverFits, time.Minute},       // cost above the limit never fits
			{0, 0, true, 4, 0, time.Minute},                // cost 0 looks without consuming
		})
	})
}

func TestFixedWindowTTL(t *testing.T) {
	forEachStore(t, func(t *testing.T, s storeUnderTest) {
		c := Check{Key: "rg:{t:ttl}:fw", Algorithm: FixedWindow, Limit: 5, PeriodUS: PeriodUS(10 * time.Second), Burst: 5, Cost: 1}
		now := time.Now().UnixMicro()
		r := decideOne(t, s.store, c, now)
		if !r.Allowed {
			t.Fatalf("first request denied: %+v", r)
		}
		ttl, ok := s.ttl(c.Key)
		if !ok {
			t.Fatal("key has no TTL")
		}
		reset := time.Duration(r.ResetUS) * time.Microsecond
		if ttl <= 0 || ttl > reset+time.Millisecond || ttl > 10*time.Second {
			t.Fatalf("ttl %v, want in (0, %v] (the rest of the window)", ttl, reset)
		}
		// A denied request neither creates nor extends keys.
		d := Check{Key: "rg:{t:ttl2}:fw", Algorithm: FixedWindow, Limit: 1, PeriodUS: PeriodUS(10 * time.Second), Burst: 1, Cost: 2}
		if r := decideOne(t, s.store, d, now); r.Allowed {
			t.Fatal("cost 2 over limit 1 allowed")
		}
		if _, ok := s.ttl(d.Key); ok {
			t.Fatal("a denied request created a key")
		}
	})
}

func TestMultiRuleAllOrNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, s storeUnderTest) {
		start := windowStart(time.Hour) + 1
		user := Check{Key: "rg:{user:alice}:fw", Algorithm: FixedWindow, Limit: 3, PeriodUS: PeriodUS(time.Hour), Burst: 3, Cost: 1}
		global := Check{Key: "rg:{global:}:fw", Algorithm: FixedWindow, Limit: 100, PeriodUS: PeriodUS(time.Hour), Burst: 100, Cost: 1}
		res := make([]Result, 2)
		allowed := 0
		for i := 0; i < 10; i++ {
			ok, err := s.store.Decide(context.Background(), &Batch{Checks: []Check{user, global}, NowUS: start}, res)
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
		g, err := s.peekAt(global, start)
		if err != nil {
			t.Fatal(err)
		}
		if g.Remaining != 97 {
			t.Fatalf("global remaining %d after 3 admitted and 7 denied, want 97: denied requests burned the global quota", g.Remaining)
		}

		// The other way round: the global rule denies, the user quota is untouched.
		tight := Check{Key: "rg:{tight:}:fw", Algorithm: FixedWindow, Limit: 2, PeriodUS: PeriodUS(time.Hour), Burst: 2, Cost: 1}
		bob := Check{Key: "rg:{user:bob}:fw", Algorithm: FixedWindow, Limit: 10, PeriodUS: PeriodUS(time.Hour), Burst: 10, Cost: 1}
		for i := 0; i < 5; i++ {
			if _, err := s.store.Decide(context.Background(), &Batch{Checks: []Check{bob, tight}, NowUS: start}, res); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := s.peekAt(bob, start)
		if b.Remaining != 8 {
			t.Fatalf("bob remaining %d, want 8", b.Remaining)
		}
	})
}

func TestShadowRuleNeverDenies(t *testing.T) {
	forEachStore(t, func(t *testing.T, s storeUnderTest) {
		start := windowStart(time.Hour) + 1
		shadow := Check{Key: "rg:{sh:x}:fw", Algorithm: FixedWindow, Limit: 2, PeriodUS: PeriodUS(time.Hour), Burst: 2, Cost: 1, Shadow: true}
		real := Check{Key: "rg:{real:x}:fw", Algorithm: FixedWindow, Limit: 5, PeriodUS: PeriodUS(time.Hour), Burst: 5, Cost: 1}
		res := make([]Result, 2)
		var shadowDenied int
		for i := 0; i < 5; i++ {
			ok, err := s.store.Decide(context.Background(), &Batch{Checks: []Check{shadow, real}, NowUS: start}, res)
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
		if r, _ := s.peekAt(shadow, start); r.Remaining != 0 {
			t.Fatalf("shadow remaining %d, want 0 (2 consumed, the rest not)", r.Remaining)
		}
		if r, _ := s.peekAt(real, start); r.Remaining != 0 {
			t.Fatalf("real remaining %d, want 0", r.Remaining)
		}
	})
}

// concurrencyPeriod is long enough that a test never crosses a window
// boundary or sees a refill while it runs.
const concurrencyPeriod = 100 * 24 * time.Hour

func TestConcurrentAdmitsExactlyLimit(t *testing.T) {
	forEachStore(t, func(t *testing.T, s storeUnderTest) {
		for _, algo := range Algorithms {
			if algos[algo] == nil {
				continue
			}
			t.Run(string(algo), func(t *testing.T) {
				c := Check{Key: "rg:{conc:" + string(algo) + "}:" + algo.Suffix(), Algorithm: algo, Limit: 50,
					PeriodUS: PeriodUS(concurrencyPeriod), Burst: 50, Cost: 1}
				var admitted atomic.Int64
				var wg sync.WaitGroup
				startGate := make(chan struct{})
				errs := make(chan error, 200)
				for i := 0; i < 200; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-startGate
						var r [1]Result
						ok, err := s.store.Decide(context.Background(), &Batch{Checks: []Check{c}}, r[:])
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
	})
}
