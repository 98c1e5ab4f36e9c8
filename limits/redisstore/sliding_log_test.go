package redisstore

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/lua"
)

// TestSlidingLogFullKeyAtCapIsFast: a sliding_log key holding its whole
// limit at the cap config allows (MaxSlidingLogLimit) decides well inside
// the default 50 ms budget on a real Redis. It is a measurement with a
// generous bound, not a speed test: SLOWLOG records every command's own
// duration inside Redis, and none may exceed 5 ms — denials on the full
// log, steady admissions (one entry leaves, one comes), an admission just
// after a whole burst of the limit leaves at once, and one just after all
// but the newest entry leave. (Each of them read the whole log before: 7 ms
// at 10000 entries, 86 ms at 100000; the two bursts removed every departed
// entry at once, 3–6 ms here.) A busy machine only adds to a duration, so
// the measurement is taken up to three times and the best one counts.
func TestSlidingLogFullKeyAtCapIsFast(t *testing.T) {
	srv := testredis.Start(t, "slowlog-log-slower-than 0", "slowlog-max-len 10000")
	client := srv.Client(t)
	rs, err := New(client, "redis "+srv.Addr, CoalesceOptions{Disabled: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testredis.Ctx(t)
	const n = limits.MaxSlidingLogLimit
	p := limits.PeriodUS(time.Hour)

	src, err := lua.Decide()
	if err != nil {
		t.Fatal(err)
	}
	script := redis.NewScript(src)
	if err := script.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	// fill writes n entries through the decide script, pipelined.
	fill := func(key string, at func(i int64) int64) {
		for lo := int64(0); lo < n; lo += 500 {
			pipe := client.Pipeline()
			for i := lo; i < min(lo+500, n); i++ {
				script.EvalSha(ctx, pipe, []string{key}, at(i), limits.SlidingLog.Code(), n, p, n, 1, 0)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := client.ZCard(ctx, key).Val(); got != n {
			t.Fatalf("%s holds %d entries after the fill, want %d", key, got, n)
		}
	}
	card := func(key string, want int64) {
		t.Helper()
		if got := client.ZCard(ctx, key).Val(); got != want {
			t.Fatalf("%s holds %d entries, want %d", key, got, want)
		}
	}

	// measure fills three keys ahead of Redis's clock (nothing expires by
	// itself): one entry every P/n, all n in one µs, n-1 in one µs and the
	// last a µs later; it returns the decisions SLOWLOG saw and the slowest.
	measure := func(attempt int) (decisions int, slowest time.Duration) {
		start := time.Now().UnixMicro() + p
		c := limits.Check{Key: fmt.Sprintf("rg:{cap:spread%d}:sl2", attempt), Algorithm: limits.SlidingLog, Limit: n, PeriodUS: p, Burst: n, Cost: 1}
		burst, tail := c, c
		burst.Key = fmt.Sprintf("rg:{cap:burst%d}:sl2", attempt)
		tail.Key = fmt.Sprintf("rg:{cap:tail%d}:sl2", attempt)
		fill(c.Key, func(i int64) int64 { return start + i*(p/n) })
		fill(burst.Key, func(int64) int64 { return start })
		fill(tail.Key, func(i int64) int64 { return start + i/(n-1) })
		if err := rs.Warm(ctx); err != nil { // the script and the library in place first
			t.Fatal(err)
		}
		if err := client.SlowLogReset(ctx).Err(); err != nil {
			t.Fatal(err)
		}

		for i := int64(0); i < 50; i++ {
			if r := storetest.DecideOne(t, rs, c, start+p-1-i); r.Allowed || r.Remaining != 0 {
				t.Fatalf("denial %d on the full log: %+v", i, r)
			}
		}
		for i := int64(0); i < 50; i++ {
			// entry i leaves at start + i*P/n + P
			if r := storetest.DecideOne(t, rs, c, start+p+i*(p/n)); !r.Allowed || r.Remaining != 0 {
				t.Fatalf("steady admission %d: %+v", i, r)
			}
		}
		if r := storetest.DecideOne(t, rs, burst, start+p); !r.Allowed || r.Remaining != n-1 {
			t.Fatalf("admission after the whole burst left: %+v", r)
		}
		card(burst.Key, 1)
		// n-1 entries have left, the last is still in the window: each
		// admission removes up to 128 of those that left, and counts exactly.
		const departed, step = n - 1, 128
		for j := int64(1); j <= (departed+step-1)/step; j++ {
			r := storetest.DecideOne(t, rs, tail, start+p)
			if !r.Allowed || r.Remaining != n-1-j {
				t.Fatalf("admission %d after all but the newest entry left: %+v, want remaining %d", j, r, n-1-j)
			}
			card(tail.Key, 1+j+max(0, departed-step*j))
		}

		logs, err := client.SlowLogGet(ctx, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range logs {
			if len(l.Args) == 0 || !strings.EqualFold(l.Args[0], "evalsha") && !strings.EqualFold(l.Args[0], "fcall") {
				continue
			}
			decisions++
			slowest = max(slowest, l.Duration)
		}
		return decisions, slowest
	}

	const want = 101 + (n-1+127)/128
	var best time.Duration
	for attempt := 0; attempt < 3; attempt++ {
		decisions, slowest := measure(attempt)
		t.Logf("attempt %d: %d decisions on sliding_log keys of %d entries: slowest %v inside Redis", attempt, decisions, n, slowest)
		if decisions != want {
			t.Fatalf("SLOWLOG holds %d decisions, want %d", decisions, want)
		}
		if attempt == 0 || slowest < best {
			best = slowest
		}
		if best <= 5*time.Millisecond {
			return
		}
	}
	t.Fatalf("the slowest decision of the best of three attempts took %v inside Redis, want < 5ms (the default budget is 50ms for the round trip)", best)
}

// TestSlidingLogForeignMembers: a sliding_log key whose members are not in
// the running-total layout (an earlier build's "<time>:<seq>:<cost>", or
// anything else) makes no decision fail: a look treats it as empty, and a
// decision that costs something drops it and starts the identity afresh.
func TestSlidingLogForeignMembers(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	rs, err := New(client, "redis "+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testredis.Ctx(t)
	now := time.Now().UnixMicro()
	c := limits.Check{Key: "rg:{t:foreign}:sl2", Algorithm: limits.SlidingLog, Limit: 3, PeriodUS: limits.PeriodUS(time.Minute), Burst: 3}
	for i, m := range []string{fmt.Sprintf("%d:0:1", now-2), fmt.Sprintf("%d:1:1", now-2), "junk"} {
		if err := client.ZAdd(ctx, c.Key, redis.Z{Score: float64(now - 2 + int64(i)), Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := rs.PeekAt(ctx, c, now); err != nil || !r.Allowed || r.Remaining != 3 {
		t.Fatalf("look at a foreign log: %+v, %v; want the full quota", r, err)
	}
	if n := client.ZCard(ctx, c.Key).Val(); n != 3 {
		t.Fatalf("a look changed the foreign log: %d members", n)
	}
	c.Cost = 1
	for i := int64(0); i < 3; i++ {
		if r := storetest.DecideOne(t, rs, c, now+i); !r.Allowed || r.Remaining != 2-i {
			t.Fatalf("request %d on a foreign log: %+v", i, r)
		}
	}
	if r := storetest.DecideOne(t, rs, c, now+3); r.Allowed {
		t.Fatalf("fourth request admitted: %+v", r)
	}
	members := client.ZRange(ctx, c.Key, 0, -1).Val()
	if fmt.Sprint(members) != "[a1:1 a2:1 a3:1]" {
		t.Fatalf("members %v, want the three new entries only", members)
	}
}
