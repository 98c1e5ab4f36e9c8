package lua_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/lua"
)

// refundScripts starts a redis-server and loads the decide and refund
// scripts on it.
func refundScripts(t *testing.T) (*redis.Client, *redis.Script, *redis.Script) {
	t.Helper()
	client := testredis.Start(t).Client(t)
	dsrc, err := lua.Decide()
	if err != nil {
		t.Fatal(err)
	}
	rsrc, err := lua.Refund()
	if err != nil {
		t.Fatal(err)
	}
	decide, refund := redis.NewScript(dsrc), redis.NewScript(rsrc)
	for _, s := range []*redis.Script{decide, refund} {
		if err := s.Load(testredis.Ctx(t), client).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return client, decide, refund
}

// TestSlidingLogRefundReadsBoundedLog: a sliding_log refund looks for its
// entry among the 256 newest at or after the entry's time, no more, so that
// entries sharing one µs (a batch's instant, or every admission after the
// Redis clock steps back) cannot make one refund read the whole log. The
// entry with 200 newer ones is refunded exactly (the newer ones' totals
// lowered: the counts that follow are right); the one with 300 newer ones
// gives nothing back (stricter, never looser); and on a log of 10000
// entries in one µs the newest one is refunded.
func TestSlidingLogRefundReadsBoundedLog(t *testing.T) {
	client, decide, refund := refundScripts(t)
	ctx := testredis.Ctx(t)
	code := limits.SlidingLog.Code()
	p := limits.PeriodUS(time.Hour)
	t0 := time.Now().UnixMicro() + p // ahead of Redis's clock: nothing expires by itself

	// admit sends k admissions of cost 1 at one instant, pipelined.
	admit := func(key string, limit, at int64, k int) {
		t.Helper()
		for lo := 0; lo < k; lo += 500 {
			pipe := client.Pipeline()
			cmds := make([]*redis.Cmd, 0, 500)
			for i := lo; i < min(lo+500, k); i++ {
				cmds = append(cmds, decide.Run(ctx, pipe, []string{key}, at, code, limit, p, limit, 1, 0))
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			for _, c := range cmds {
				if r, _ := c.Int64Slice(); r[0] != 1 {
					t.Fatalf("%s: admission at %d denied: %v", key, at, r)
				}
			}
		}
	}
	// giveBack refunds the cost-1 commit at `at` (reset P: its entry is at
	// `at`) and returns the remaining quota the refund's look reports.
	giveBack := func(key string, limit, at, now int64) int64 {
		t.Helper()
		r, err := refund.Run(ctx, client, []string{key, key + ":refund:1"}, now, 60000, code, limit, p, limit, 1, at, limit-1, p).Int64Slice()
		if err != nil || len(r) != 5 {
			t.Fatalf("%s: refund answered %v, %v", key, r, err)
		}
		return r[2]
	}
	look := func(key string, limit, now int64) int64 {
		t.Helper()
		r, err := decide.Run(ctx, client, []string{key}, now, code, limit, p, limit, 0, 0).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return r[3] // admitted, now, allowed, remaining, ...
	}

	for _, tc := range []struct {
		newer    int
		refunded bool
	}{{200, true}, {255, true}, {256, false}, {300, false}} {
		key := fmt.Sprintf("rg:{refund:%d}:sl2", tc.newer)
		const limit = 1000
		admit(key, limit, t0, 1)            // the request refunded below
		admit(key, limit, t0+1, tc.newer)   // admitted after it
		left := int64(limit - 1 - tc.newer) // nothing given back
		if tc.refunded {
			left++
		}
		if got := giveBack(key, limit, t0, t0+2); got != left {
			t.Fatalf("%d newer entries: the refund reports %d remaining, want %d", tc.newer, got, left)
		}
		admit(key, limit, t0+3, 1)
		if got := look(key, limit, t0+4); got != left-1 {
			t.Fatalf("%d newer entries: %d remaining after one more admission, want %d", tc.newer, got, left-1)
		}
		// the newer entries leave; the one admitted last stays
		if got := look(key, limit, t0+1+p); got != limit-1 {
			t.Fatalf("%d newer entries: %d remaining once they left, want %d", tc.newer, got, limit-1)
		}
	}

	key := "rg:{refund:burst}:sl2"
	admit(key, limits.MaxSlidingLogLimit, t0, limits.MaxSlidingLogLimit)
	if got := giveBack(key, limits.MaxSlidingLogLimit, t0, t0+1); got != 1 {
		t.Fatalf("a refund on %d entries in one µs reports %d remaining, want 1", limits.MaxSlidingLogLimit, got)
	}
	if n := client.ZCard(ctx, key).Val(); n != limits.MaxSlidingLogLimit-1 {
		t.Fatalf("%d entries after the refund, want %d", n, limits.MaxSlidingLogLimit-1)
	}
}

// TestSlidingLogRefundLeavesTheTTL: a sliding_log refund neither shortens
// the key's TTL nor deletes the key. The commit it refunds may be of a rule
// a reload has lengthened since, whose entries must live to the longer
// period's end (a TTL cut to the commit's period let a key expire while
// the rule still counted its entries); and a key whose entries have all
// left may still hold a departed burst that admissions remove 128 at a
// time, which a DEL would free on Redis's main thread.
func TestSlidingLogRefundLeavesTheTTL(t *testing.T) {
	client, decide, refund := refundScripts(t)
	ctx := testredis.Ctx(t)
	code := limits.SlidingLog.Code()
	p := limits.PeriodUS(time.Hour)
	const limit = 10000
	t0 := time.Now().UnixMicro() + 2*p
	run := func(key string, now, period, cost int64) []int64 {
		t.Helper()
		r, err := decide.Run(ctx, client, []string{key}, now, code, limit, period, limit, cost, 0).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return r // admitted, now, allowed, remaining, reset, retry
	}
	giveBack := func(key string, now, period, at, reset int64) {
		t.Helper()
		if err := refund.Run(ctx, client, []string{key, key + ":refund:1"}, now, 60000, code, limit, period, limit, 1, at, 0, reset).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// A commit under P, then a reload to 2P and an admission under it; the
	// refund of the first commit carries P.
	key := "rg:{refund:longer}:sl2"
	z := run(key, t0, p, 1)
	w := run(key, t0+10, 2*p, 1)
	if z[0] != 1 || w[0] != 1 {
		t.Fatalf("admissions: %v, %v", z, w)
	}
	giveBack(key, t0+20, p, t0, z[4])
	// W, at t0+10, counts under 2P until t0+10+2P: its TTL, from t0+20,
	// must cover 2P-10µs, not P-10µs.
	if ttl := client.PTTL(ctx, key).Val(); ttl < time.Duration(2*p-1000)*time.Microsecond-time.Second {
		t.Fatalf("TTL after the refund %v, want about %v (the lengthened period)", ttl, time.Duration(2*p)*time.Microsecond)
	}
	if r := run(key, t0+30, 2*p, 0); r[3] != limit-1 {
		t.Fatalf("after the refund: %d remaining, want %d (W still counts)", r[3], limit-1)
	}

	// 9999 entries in one µs, X a µs later, A as the burst leaves (128 of
	// it removed), then A refunded once X has left too.
	key = "rg:{refund:backlog}:sl2"
	for lo := 0; lo < limit-1; lo += 500 {
		pipe := client.Pipeline()
		for i := lo; i < min(lo+500, limit-1); i++ {
			decide.Run(ctx, pipe, []string{key}, t0, code, limit, p, limit, 1, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run(key, t0+1, p, 1)
	a := run(key, t0+p, p, 1)
	if a[0] != 1 || a[3] != limit-2 {
		t.Fatalf("admission as the burst leaves: %v", a)
	}
	giveBack(key, t0+p+1, p, t0+p, a[4])
	if n := client.ZCard(ctx, key).Val(); n != limit-128 {
		t.Fatalf("%d entries after the refund, want %d (the departed ones stay until admissions remove them)", n, limit-128)
	}
	if r := run(key, t0+p+2, p, 0); r[3] != limit {
		t.Fatalf("after the refund: %d remaining, want %d (everything has left)", r[3], limit)
	}
	if r := run(key, t0+p+3, p, 1); r[0] != 1 || r[3] != limit-1 {
		t.Fatalf("admission after the refund: %v", r)
	}
	if n := client.ZCard(ctx, key).Val(); n != 1 {
		t.Fatalf("%d entries after an admission into an empty window, want 1", n)
	}
}
