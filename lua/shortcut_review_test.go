package lua

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

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
				for {
					tm, err := client.Time(ctx).Result()
					if err != nil {
						t.Fatal(err)
					}
					us := tm.UnixMicro()
					if us%short < short/2 && us%long < long-10*short {
						break
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
