package lua

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// TestShortcutsFollowTheNumbers: a held record's shortcut (records.lua)
// admits only what the algorithm would at the same numbers: a decision on
// the same key under another limit or period, a cost of 0, a shadow, the
// limit running out and the decisions after a denial are decided as the
// algorithm decides them, decision for decision as one Decide each.
func TestShortcutsFollowTheNumbers(t *testing.T) {
	client, lib := withLibrary(t)
	const p = mixPeriod
	// limit, period, cost, shadow of each decision on the one key
	steps := [][4]int64{
		{20, p, 1, 0}, {20, p, 1, 0}, {20, p, 2, 0}, // a shortcut from the first
		{20, p, -10, 0}, {20, p, 1, 0}, {20, p, 1, 0}, // a count taken below 0 (by hand: rategate sends no negative cost)
		{20, 2 * p, 1, 0}, {20, 2 * p, 1, 0}, {20, p, 1, 0}, // another period, and back
		{18, p, 1, 0}, {20, p, 1, 0}, {20, p, 0, 0}, {20, p, 1, 1}, // another limit, a look, a shadow
		{20, p, 5, 0}, {20, p, 5, 0}, {20, p, 5, 0}, {20, p, 1, 0}, {20, p, 1, 0}, // to the limit and past it
	}
	for _, way := range manyWays(client, lib) {
		for _, algo := range []string{"fixed_window", "sliding_window"} {
			t.Run(way.name+"/"+algo, func(t *testing.T) {
				ms, os := "ms"+way.name+algo, "os"+way.name+algo
				// user >= 0: after that user's check (a key no other
				// decision of the call names)
				decision := func(hot string, st [4]int64, user int) manyDecision {
					var checks [][5]int64
					var keys []string
					if user >= 0 {
						checks = append(checks, [5]int64{int64(Code(algo)), 1000, p, 0, 1})
						keys = append(keys, fmt.Sprint("user", user))
					}
					checks = append(checks, [5]int64{int64(Code(algo)), st[0], st[1], 0, st[2]})
					keys = append(keys, hot)
					argv := decideArgv(0, checks...)
					argv[len(argv)-1] = st[3]
					return manyDecision{keys, argv}
				}
				// a record to start from, then the steps alone (dm_one)
				// and after a user's check (rg_chain), twice over, each
				// round on a key of its own (the steps run past the limit)
				var names []string
				for round := range 4 {
					hot := fmt.Sprint("hot", round)
					names = append(names, hot)
					ds := []manyDecision{decision(hot, steps[0], -1), decision(hot, steps[0], -1)}
					compareCall(t, client, lib, way, ms, os, ds)
					ds = ds[:0]
					for i, st := range steps {
						user := -1
						if round%2 == 1 {
							user = i
						}
						ds = append(ds, decision(hot, st, user))
					}
					if held := compareCall(t, client, lib, way, ms, os, ds); held < len(steps) {
						t.Fatalf("%d checks on held keys, want %d", held, len(steps))
					}
				}
				for i := range steps {
					names = append(names, fmt.Sprint("user", i))
				}
				compareKeys(t, client, ms, os, names)
			})
		}
	}
}

// TestShortcutAfterLookOnShorterPeriodRecord: a held fixed_window record
// counted under a shorter period (e < we: in force to the end of this
// window, fixed_window.lua) whose first decision in a call is a look (cost
// 0, a Peek) is not rewritten by the look, yet the look leaves the record
// a shortcut (records.lua). The admissions after it in the call must still
// move the record's end (and expiry) to we, as one Decide each does: else
// the count is gone when the short window ends, and the decisions after
// that are admitted on a count short of what was admitted. Alone (dm_one)
// and last after a user's check (rg_chain's written-out copy).
func TestShortcutAfterLookOnShorterPeriodRecord(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	const short, long = int64(200_000), int64(3_600_000_000)
	fw := int64(Code("fixed_window"))
	for _, way := range manyWays(client, lib) {
		for _, chain := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/chain=%v", way.name, chain), func(t *testing.T) {
				// start in a short window's first half (its record must
				// be in force for the second call) and clear of an hour's
				// end (e < we)
				for try := 0; ; try++ {
					tm, err := client.Time(ctx).Result()
					if err != nil {
						t.Fatal(err)
					}
					us := tm.UnixMicro()
					if us%short < short/2 && us%long < long-10*short {
						break
					}
					if try == 500 {
						t.Fatal("no instant in a short window's first half within 5 s")
					}
					time.Sleep(10 * time.Millisecond)
				}
				ms, os := "ms"+t.Name(), "os"+t.Name()
				decision := func(period, cost int64, user int) manyDecision {
					var checks [][5]int64
					var keys []string
					if chain {
						checks = append(checks, [5]int64{fw, 1000, short, 0, 1})
						keys = append(keys, fmt.Sprint("user", user))
					}
					checks = append(checks, [5]int64{fw, 100, period, 0, cost})
					keys = append(keys, "hot")
					return manyDecision{keys, decideArgv(0, checks...)}
				}
				// counted under the short period
				compareCall(t, client, lib, way, ms, os, []manyDecision{decision(short, 1, 0), decision(short, 1, 1)})
				// the period grows: a look first, then admissions
				compareCall(t, client, lib, way, ms, os, []manyDecision{
					decision(long, 0, 2), decision(long, 1, 3), decision(long, 1, 4),
				})
				km, ko := inSpace(ms)("hot"), inSpace(os)("hot")
				if m, o := testredis.KeyState(t, client, km), testredis.KeyState(t, client, ko); m != o {
					t.Errorf("key hot: DecideMany left %s (PTTL %v), Decide %s (PTTL %v)",
						m, client.PTTL(ctx, km).Val(), o, client.PTTL(ctx, ko).Val())
				}
				// past the short window's end: the four admitted under the
				// long period's window still count
				time.Sleep(time.Duration(short) * time.Microsecond)
				compareCall(t, client, lib, way, ms, os, []manyDecision{decision(long, 1, 5), decision(long, 1, 6)})
			})
		}
	}
}
