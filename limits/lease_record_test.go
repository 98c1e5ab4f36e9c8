package limits_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestLeaseRecordHoldsLiveSlices: a leased window rule's lease record
// (<prefix>:{rule:identity}:lease, one hash field per slice) kept a field
// for every slice taken until the slice's window ended (fixed_window;
// sliding_window one period later): an instance's slices spent to the last
// unit were forgotten locally but only a bucket's were settled with the
// store. A busy instance takes about 20 slices a second, so an hourly
// global quota's record grew by some 1,200 fields a minute per instance,
// and lease.lua reads the whole record on every take: after two minutes
// 2,403 fields and 3,992 µs of Redis per take (56 µs with 2 fields). Spent
// window slices are now settled with the next take, as a bucket's.
//
// One instance on a driven clock (10,000 requests a second) on a
// fixed_window rule of 1e9 per hour, for a minute of its clock.
func TestLeaseRecordHoldsLiveSlices(t *testing.T) {
	client, rs := realRedisStore(t)
	prefix := fmt.Sprintf("plr%d", time.Now().UnixNano()%1_000_000)
	r := leasedRule("global", limits.FixedWindow, 1_000_000_000, time.Hour)
	l := limits.New(limits.Options{Store: rs, Prefix: prefix, Rules: []*limits.Rule{r}, Leaser: rs,
		Lease: limits.LeaseOptions{SyncPrefetch: true, Instance: "i0"}})
	ctx := context.Background()
	// start just after an hour boundary, on Redis's epoch-aligned windows
	now := (time.Now().UnixMicro()/3_600_000_000 + 1) * 3_600_000_000
	lkey := limits.LeaseKey(prefix + ":{global:}:" + limits.FixedWindow.Suffix())
	const minutes = 1
	var hlen []int64
	deadline := time.Now().Add(20 * time.Second)
	for m := 0; m < minutes && time.Now().Before(deadline); m++ {
		for i := 0; i < 600_000; i++ { // one minute at 10,000/s
			now += 100
			var d limits.Decision
			if err := l.DecideAt(ctx, &limits.Request{}, &d, now); err != nil {
				t.Fatal(err)
			}
			if !d.Admitted {
				t.Fatalf("minute %d request %d denied", m, i)
			}
			if i%1000 == 0 {
				l.SweepLeasesAt(ctx, now)
			}
		}
		hlen = append(hlen, client.HLen(ctx, lkey).Val())
	}
	mem, _ := client.MemoryUsage(ctx, lkey, 0).Result()
	st := l.LeaseStats()
	takes := int64(0)
	if len(st) > 0 {
		takes = st[0].Takes
	}
	sample, _ := client.HRandFieldWithValues(ctx, lkey, 3).Result()
	t.Logf("sample fields (granted:until:at:reset:keep), clock now %d: %v", now, sample)
	// one take's cost now: Redis's own time per script call
	info := client.Info(ctx, "commandstats").Val()
	var calls string
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha") || strings.HasPrefix(line, "cmdstat_fcall") {
			calls += strings.TrimSpace(line) + " "
		}
	}
	t.Logf("fields in %s after each minute: %v; MEMORY USAGE %d B; takes %d; %s", lkey, hlen, mem, takes, calls)
	last := hlen[len(hlen)-1]
	// What the record needs at any moment: the slices that may still be
	// spent or given back, a couple per instance.
	if last > 100 {
		t.Fatalf("after %d minutes of one busy instance the lease record holds %d fields (%d bytes) and grows by about %d a minute until the hour ends; the live slices are at most 2",
			len(hlen), last, mem, last/int64(len(hlen)))
	}
}
