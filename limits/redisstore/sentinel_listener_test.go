package redisstore

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

// TestSentinelFailoverWithTheListenedSentinelDown: go-redis follows a
// Sentinel switch through one subscription to +switch-master, on one
// sentinel (the first that answered). With that sentinel down (one of
// three: the deployment still has its quorum and fails over), a planned
// SENTINEL FAILOVER is never heard: the store goes on writing to the old
// primary, still a primary until the sentinels demote it, and everything
// it admitted meanwhile is thrown away when it resyncs as a replica.
// docs/failure.md: a planned failover loses "about a second" of admitted
// decisions. With every sentinel up it lost 0.9 s of traffic; here the loss must
// stay under half the time to the old primary's demotion (it was all of
// it, 11-13 s).
func TestSentinelFailoverWithTheListenedSentinelDown(t *testing.T) {
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
	// The sentinel the store listens to: the one with a subscribed client.
	listened := -1
	for i := 0; i < 50 && listened < 0; i++ {
		for j, sv := range s.Sentinels {
			cl, _ := sv.Do("CLIENT", "LIST")
			if strings.Contains(cl, "sub=2") {
				listened = j
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if listened < 0 {
		t.Fatal("no sentinel has the store's +switch-master subscription")
	}
	const limit = 100_000_000
	ch := limits.Check{Key: "rg:{listener:}:fw", Algorithm: limits.FixedWindow, Limit: limit, PeriodUS: storetest.SteadyPeriod(), Burst: limit, Cost: 1}
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
	time.Sleep(time.Second)
	began := time.Now()
	s.Sentinels[listened].Stop()
	t.Logf("stopped sentinel %s, the one the store listens to", s.Sentinels[listened].Addr)
	time.Sleep(200 * time.Millisecond)
	other := s.Sentinels[(listened+1)%3]
	old := s.Servers[0].Addr
	if _, err := other.Do("SENTINEL", "FAILOVER", s.Master); err != nil {
		close(stop)
		wg.Wait()
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
	// Until the old primary is a replica in sync with the new one.
	var demoted time.Duration
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		role, _ := s.Server(old).Do("ROLE")
		info, _ := s.Server(old).Do("INFO", "replication")
		if role != "" && !strings.Contains(role, "master") && strings.Contains(info, "master_link_status:up") {
			demoted = time.Since(start)
			break
		}
	}
	t.Logf("old primary %s a replica in sync %v after SENTINEL FAILOVER", old, demoted.Round(time.Millisecond))
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	r, err := rs.Peek(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	rate := float64(admitted.Load()) / time.Since(began).Seconds()
	used := limit - r.Remaining
	lost := admitted.Load() - used
	t.Logf("admitted %d (failed %d), counted on the surviving primary %d: %d lost, %.1f s of traffic (%.0f a second)",
		admitted.Load(), failed.Load(), used, lost, float64(lost)/rate, rate)
	// Unheard, the store writes to the old primary until its demotion
	// (10 s or more after the promotion); heard, within a few of the
	// watch's looks (1.9 s measured on an idle machine, 5.0 s once under
	// a loaded CI run before the watch nudged for 10 s). Half the time to
	// the demotion tells the two apart on a loaded machine too.
	if float64(lost) > rate*demoted.Seconds()/2 {
		t.Fatalf("with the sentinel it listened to down, a planned SENTINEL FAILOVER lost %d admitted decisions, %.1f s of traffic (the store never heard +switch-master and wrote to the old primary until it was demoted %v after the failover); docs: about a second",
			lost, float64(lost)/rate, demoted.Round(time.Millisecond))
	}
}
