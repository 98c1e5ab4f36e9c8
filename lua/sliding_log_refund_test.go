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

// TestSlidingLogRefundReadsBoundedLog: a sliding_log refund looks for its
// entry among the 256 newest at or after the entry's time, no more, so that
// entries sharing one µs (a batch's instant, or every admission after the
// Redis clock steps back) cannot make one refund read the whole log. The
// entry with 200 newer ones is refunded exactly (the newer ones' totals
// lowered: the counts that follow are right); the one with 300 newer ones
// gives nothing back (stricter, never looser); and on a log of 10000
// entries in one µs the newest one is refunded.
func TestSlidingLogRefundReadsBoundedLog(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	ctx := testredis.Ctx(t)
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
		if err := s.Load(ctx, client).Err(); err != nil {
			t.Fatal(err)
		}
	}
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
		key := fmt.Sprintf("rg:{refund:%d}:sl", tc.newer)
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

	key := "rg:{refund:burst}:sl"
	admit(key, limits.MaxSlidingLogLimit, t0, limits.MaxSlidingLogLimit)
	if got := giveBack(key, limits.MaxSlidingLogLimit, t0, t0+1); got != 1 {
		t.Fatalf("a refund on %d entries in one µs reports %d remaining, want 1", limits.MaxSlidingLogLimit, got)
	}
	if n := client.ZCard(ctx, key).Val(); n != limits.MaxSlidingLogLimit-1 {
		t.Fatalf("%d entries after the refund, want %d", n, limits.MaxSlidingLogLimit-1)
	}
}
