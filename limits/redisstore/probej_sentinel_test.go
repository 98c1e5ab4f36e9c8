package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// TestProbeJPlannedSentinelFailoverLosesDecisions: an operator's planned
// `SENTINEL FAILOVER` on a healthy loopback deployment (no replication lag
// to speak of). Every decision the store reported as admitted must be
// counted on the primary that survives: what is not is admitted again later
// in the window (over-admission). docs/failure.md says a failover loses
// only what the replica had not received, "milliseconds on a healthy
// network".
func TestProbeJPlannedSentinelFailoverLosesDecisions(t *testing.T) {
	s := testredis.StartSentinel(t)
	rs, err := Open(Options{SentinelMaster: s.Master, SentinelAddrs: s.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	ctx := testredis.Ctx(t)
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	const limit = 10_000_000
	ch := limits.Check{Key: "rg:{planned:}:fw", Algorithm: limits.FixedWindow, Limit: limit, PeriodUS: limits.PeriodUS(time.Hour), Burst: limit, Cost: 1}
	var admitted, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r [1]limits.Result
			for {
				select {
				case <-stop:
					return
				default:
				}
				dctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				ok, err := rs.Decide(dctx, &limits.Batch{Checks: []limits.Check{ch}}, r[:])
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
					time.Sleep(time.Millisecond)
				case ok:
					admitted.Add(1)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	old := s.Servers[0].Addr
	if _, err := s.Sentinels[0].Do("SENTINEL", "FAILOVER", s.Master); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	promoted, err := s.WaitPrimary(old, 30*time.Second)
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("%v\n%s", err, s.Logs())
	}
	t.Logf("promoted %s %v after SENTINEL FAILOVER", promoted, time.Since(start).Round(time.Millisecond))
	// let the old primary be turned into a replica and catch up
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		role, _ := s.Server(old).Do("ROLE")
		info, _ := s.Server(old).Do("INFO", "replication")
		if len(role) > 0 && !containsStr(role, "master") && containsStr(info, "master_link_status:up") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	nc := s.Server(promoted).Client(t)
	r, err := rs.Peek(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	used := limit - r.Remaining
	typ, _ := nc.Type(ctx, ch.Key).Result()
	t.Logf("the key on %s: %s %s", promoted, typ, testredis.KeyState(t, nc, ch.Key))
	t.Logf("admitted %d (failed %d), counted on the surviving primary %d", admitted.Load(), failed.Load(), used)
	if lost := admitted.Load() - used; lost > 10 {
		t.Fatalf("a planned SENTINEL FAILOVER lost %d admitted decisions (admitted %d, the surviving primary counts %d): each is admitted again in the window", lost, admitted.Load(), used)
	}
}

func containsStr(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
