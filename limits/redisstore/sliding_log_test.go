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
// log, steady admissions (one entry leaves, one comes), and the worst case,
// an admission just after a whole burst of the limit leaves at once. (Each
// of them read the whole log before: 7 ms at 10000 entries, 86 ms at 100000.)
func TestSlidingLogFullKeyAtCapIsFast(t *testing.T) {
	srv := testredis.Start(t, "slowlog-log-slower-than 0", "slowlog-max-len 1000")
	client := srv.Client(t)
	rs, err := New(client, "redis "+srv.Addr, CoalesceOptions{Disabled: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testredis.Ctx(t)
	const n = limits.MaxSlidingLogLimit
	p := limits.PeriodUS(time.Hour)
	start := time.Now().UnixMicro() + p // ahead of Redis's clock: nothing expires
	c := limits.Check{Key: "rg:{cap:spread}:sl", Algorithm: limits.SlidingLog, Limit: n, PeriodUS: p, Burst: n, Cost: 1}
	burst := c
	burst.Key = "rg:{cap:burst}:sl"

	// Fill both keys through the decide script, pipelined: one entry every
	// P/n for the first, all n in one µs for the second.
	src, err := lua.Decide()
	if err != nil {
		t.Fatal(err)
	}
	script := redis.NewScript(src)
	if err := script.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
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
	fill(c.Key, func(i int64) int64 { return start + i*(p/n) })
	fill(burst.Key, func(int64) int64 { return start })
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
	if got := client.ZCard(ctx, burst.Key).Val(); got != 1 {
		t.Fatalf("%d entries left after the burst left, want 1", got)
	}

	logs, err := client.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var decisions int
	var slowest time.Duration
	for _, l := range logs {
		if len(l.Args) == 0 || !strings.EqualFold(l.Args[0], "evalsha") {
			continue
		}
		decisions++
		slowest = max(slowest, l.Duration)
	}
	t.Logf("%d decisions on sliding_log keys of %d entries: slowest %v inside Redis", decisions, n, slowest)
	if decisions != 101 {
		t.Fatalf("SLOWLOG holds %d decisions, want 101", decisions)
	}
	if slowest > 5*time.Millisecond {
		t.Fatalf("a decision took %v inside Redis, want < 5ms (the default budget is 50ms for the round trip)", slowest)
	}
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
	c := limits.Check{Key: "rg:{t:foreign}:sl", Algorithm: limits.SlidingLog, Limit: 3, PeriodUS: limits.PeriodUS(time.Minute), Burst: 3}
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
