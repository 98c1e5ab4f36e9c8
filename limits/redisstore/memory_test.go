package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"

	"github.com/rategate/rategate/internal/testredis"
)

// TestMemoryUsagePerKey fills one key per registered algorithm at a
// realistic limit (100 per minute, 100 requests spread over the minute) on
// real Redis and reports MEMORY USAGE: the sliding log grows with L, every
// other algorithm keeps a fixed small state.
func TestMemoryUsagePerKey(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	rs, err := New(client, "redis "+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	p := limits.PeriodUS(time.Minute)
	start := storetest.WindowStart(time.Minute)
	usage := map[limits.Algorithm]int64{}
	for _, algo := range limits.Algorithms {
		c := limits.Check{Key: "rg:{api:203.0.113.7}:" + algo.Suffix(), Algorithm: algo, Limit: 100, PeriodUS: p, Burst: 100, Cost: 1}
		admitted := 0
		for i := int64(0); i < 100; i++ {
			// 500 ms apart with a few ms of jitter, over the first 50 s: the
			// fixed window's key then outlives the measurement by 10 s.
			if storetest.DecideOne(t, rs, c, start+i*p/120+(i%7)*1000).Allowed {
				admitted++
			}
		}
		n, err := client.MemoryUsage(context.Background(), c.Key, 0).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE %s: %v", c.Key, err)
		}
		usage[algo] = n
		t.Logf("memory usage: %s limit=100 bytes=%d", algo, n)
		if admitted != 100 {
			t.Logf("memory usage: %s admitted %d of 100", algo, admitted)
		}
		if algo != limits.SlidingLog && n >= 200 {
			t.Errorf("%s: %d bytes for one key, want < 200 (O(1) state)", algo, n)
		}
	}
	if usage[limits.SlidingLog] <= usage[limits.FixedWindow] {
		t.Errorf("sliding_log %d bytes <= fixed_window %d: the log should cost more than a counter", usage[limits.SlidingLog], usage[limits.FixedWindow])
	}
}
