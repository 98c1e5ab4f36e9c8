package lua_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
	"github.com/rategate/rategate/lua"
)

// TestRefundAfterAReset: an operator's reset (reset.lua) erases what the
// commits before it held, and the record an identity builds after it
// holds none of them: a refund of a commit from before the reset gives
// nothing back, one of a commit after it gives back exactly its cost.
// Without the stamp the first refund lowered the new count (6 admitted
// in a window of 3 when a late refund ran after a reset).
func TestRefundAfterAReset(t *testing.T) {
	client, decide, refund := refundScripts(t)
	ctx := testredis.Ctx(t)
	src, err := lua.Source("reset.lua")
	if err != nil {
		t.Fatal(err)
	}
	reset := redis.NewScript(src)
	p := storetest.SteadyPeriod() // an hour or more, not turning over during the test
	const limit = 3
	for _, algo := range limits.Algorithms {
		t.Run(string(algo), func(t *testing.T) {
			code := algo.Code()
			key := "rg:{reset-" + string(algo) + ":1.2.3.4}:" + algo.Suffix()
			stamp := limits.ResetStampKey(key)
			commit := func() (at, rem, rst int64) {
				t.Helper()
				r, err := decide.Run(ctx, client, []string{key}, 0, code, limit, p, limit, 1, 0).Int64Slice()
				if err != nil {
					t.Fatal(err)
				}
				if r[0] != 1 {
					t.Fatalf("commit denied: %v", r)
				}
				// decide.lua: {admitted, now, then per check: allowed, remaining, reset, retry}
				return r[1], r[3], r[4]
			}
			giveBack := func(at, rem, rst int64, id string) {
				t.Helper()
				if err := refund.Run(ctx, client, []string{key, key + ":refund:" + id}, 0, 60000, code, limit, p, limit, 1, at, rem, rst).Err(); err != nil {
					t.Fatal(err)
				}
			}
			// look returns the quota as it stands: remaining, and reset
			// (a bucket's refund gives back time, the µs since the commit
			// drained: its remaining may not move, its reset does)
			look := func() (int64, int64) {
				t.Helper()
				r, err := decide.Run(ctx, client, []string{key}, 0, code, limit, p, limit, 0, 0).Int64Slice()
				if err != nil {
					t.Fatal(err)
				}
				return r[3], r[4]
			}
			at, rem, rst := commit()
			commit()
			if err := reset.Run(ctx, client, []string{key}, stamp).Err(); err != nil {
				t.Fatal(err)
			}
			if ttl := client.PTTL(ctx, stamp).Val(); ttl <= 0 || ttl > 2*time.Duration(p)*time.Microsecond+2*time.Second {
				t.Fatalf("the reset stamp's TTL is %v, want the record's (at most two periods: sliding_window) and a second", ttl)
			}
			a2, r2, s2 := commit()
			left, reset1 := look()
			if left != limit-1 {
				t.Fatalf("after the reset and one commit: %d left, want %d", left, limit-1)
			}
			giveBack(at, rem, rst, "old")
			if got, r := look(); got != left || r < reset1-1_000_000 {
				t.Fatalf("a refund of a commit from before the reset gave back: %d left, reset %d µs; it was %d, %d µs", got, r, left, reset1)
			}
			giveBack(a2, r2, s2, "new")
			if got, r := look(); got != limit && r > reset1/2 {
				t.Fatalf("a refund of the commit after the reset gave nothing back: %d left, reset %d µs; it was %d, %d µs", got, r, left, reset1)
			}
		})
	}
}
