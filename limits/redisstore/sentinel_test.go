package redisstore

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/storetest"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// TestSentinel runs rategate over a real Sentinel deployment (one primary,
// one replica, three sentinels): exact concurrent limiting, one script per
// request, the URL form, then the primary is killed under load. Every
// decision is answered within the timeout, the sentinels promote the
// replica, the client follows, exact limiting resumes, readiness names the
// new primary, and no goroutine is left behind.
func TestSentinel(t *testing.T) {
	before := runtime.NumGoroutine()
	s := testredis.StartSentinel(t)
	rs, err := Open(Options{SentinelMaster: s.Master, SentinelAddrs: s.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			rs.Close()
		}
	}()
	ctx := testredis.Ctx(t)
	if rs.Topology() != Sentinel {
		t.Fatalf("topology %s, want sentinel", rs.Topology())
	}
	if err := rs.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	old := s.Servers[0].Addr
	if want := "redis sentinel mymaster (primary " + old + ", 1 replica)"; rs.Name() != want {
		t.Fatalf("Name() = %q, want %q", rs.Name(), want)
	}

	t.Run("exact", func(t *testing.T) { exactAllAlgorithms(t, rs, "sentinel") })

	t.Run("one script per request", func(t *testing.T) {
		var scripts atomic.Int64
		rs.Client().AddHook(countHook{&scripts})
		user := limits.Check{Key: "rg:{u:alice}:fw", Algorithm: limits.FixedWindow, Limit: 2, PeriodUS: storetest.SteadyPeriod(), Burst: 2, Cost: 1}
		global := limits.Check{Key: "rg:{global:}:gc", Algorithm: limits.GCRA, Limit: 100, PeriodUS: storetest.SteadyPeriod(), Burst: 100, Cost: 1}
		if KeySlot(user.Key) == KeySlot(global.Key) {
			t.Fatal("pick keys in two slots")
		}
		res := make([]limits.Result, 2)
		admitted := 0
		for i := 0; i < 5; i++ {
			a, err := rs.Decide(ctx, &limits.Batch{Checks: []limits.Check{user, global}}, res)
			if err != nil {
				t.Fatal(err)
			}
			if a {
				admitted++
			}
		}
		if admitted != 2 || scripts.Load() != 5 {
			t.Fatalf("admitted %d with %d scripts, want 2 admitted with 5 (one per request, no refunds)", admitted, scripts.Load())
		}
		if g, _ := rs.Peek(ctx, global); g.Remaining != 98 {
			t.Fatalf("global remaining %d, want 98", g.Remaining)
		}
	})

	t.Run("url", func(t *testing.T) {
		addrs := s.Addrs()
		u := "redis://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2] + "&master_name=" + s.Master
		us, err := Open(Options{URL: u})
		if err != nil {
			t.Fatal(err)
		}
		defer us.Close()
		if us.Topology() != Sentinel {
			t.Fatalf("%s opened as %s, want sentinel", u, us.Topology())
		}
		if err := us.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(us.Name(), "primary "+old) {
			t.Fatalf("Name() = %q", us.Name())
		}
	})

	local := memstore.New()
	defer func() {
		if !closed {
			local.Close()
		}
	}()
	l := limits.New(limits.Options{Store: rs, Prefix: "rg", Rules: failoverRules(), Fallback: local, LocalShare: 1, FailureMode: limits.FailLocal})
	stalls := startStallMeter()
	ld := startLoad(t, l, 4)
	time.Sleep(300 * time.Millisecond)
	killedAt := time.Now()
	s.Servers[0].Stop()
	t.Logf("killed primary %s under load", old)
	promoted, err := s.WaitPrimary(old, 30*time.Second)
	if err != nil {
		ld.Stop()
		t.Fatalf("%v\n%s", err, s.Logs())
	}
	t.Logf("sentinels promoted %s %v after the kill", promoted, time.Since(killedAt).Round(time.Millisecond))
	waitDecides(t, rs, []string{"rg:{after:1}:fw"}, 10*time.Second)
	t.Logf("the store decides on the new primary %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	time.Sleep(200 * time.Millisecond)
	ld.Stop()
	t.Logf("load: %s", ld)
	checkLatency(t, "sentinel failover", time.Duration(ld.maxLat.Load()), stalls.Stop())
	if ld.local.Load() == 0 {
		t.Error("no decision fell back while there was no primary: the outage was not exercised")
	}

	if err := rs.Ping(ctx); err != nil {
		t.Fatalf("Ping after failover: %v", err)
	}
	if !strings.Contains(rs.Name(), "primary "+promoted) {
		t.Errorf("Name() = %q, want the new primary %s", rs.Name(), promoted)
	}
	t.Logf("ready: %s", rs.Name())
	// Decisions that need a new connection go to the fallback until the
	// pool dials again (see waitPoolDials); wait for that before counting.
	waitPoolDials(t, rs, 5*time.Second)
	exactAllAlgorithms(t, rs, "after-failover")

	rs.Close()
	local.Close()
	closed = true
	waitGoroutines(t, before, 10*time.Second)
}

// exactAllAlgorithms checks that 200 concurrent requests admit exactly the
// limit of 50, for every algorithm.
func exactAllAlgorithms(t *testing.T, s limits.Store, tag string) {
	t.Helper()
	for _, algo := range limits.Algorithms {
		ch := limits.Check{Key: "rg:{" + tag + ":" + string(algo) + "}:" + algo.Suffix(), Algorithm: algo, Limit: 50,
			PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 50, Cost: 1}
		if got := hammer(t, s, 200, func(int) []limits.Check { return []limits.Check{ch} }); got != 50 {
			t.Fatalf("%s: admitted %d of 200 concurrent requests, want exactly 50", algo, got)
		}
	}
}

// TestOpenURLForms: go-redis's URL forms pick the topology.
func TestOpenURLForms(t *testing.T) {
	c := sharedCluster.Get(t)
	ctx := testredis.Ctx(t)
	addrs := c.Addrs()
	for _, tc := range []struct {
		url  string
		want Topology
	}{
		{"redis://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2], Cluster},
		{"redis://" + addrs[0] + "?addr=" + addrs[0], Cluster}, // one seed, repeated
	} {
		s, err := Open(Options{URL: tc.url})
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		if s.Topology() != tc.want {
			t.Errorf("%s: topology %s, want %s", tc.url, s.Topology(), tc.want)
		}
		if err := s.Ping(ctx); err != nil {
			t.Errorf("%s: ping: %v", tc.url, err)
		}
		if !strings.HasPrefix(s.Name(), "redis cluster (3 primaries: ") {
			t.Errorf("%s: Name() = %q", tc.url, s.Name())
		}
		s.Close()
	}
	srv := testredis.Start(t)
	s, err := Open(Options{URL: "redis://" + srv.Addr + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Topology() != Standalone || s.Name() != "redis "+srv.Addr {
		t.Fatalf("plain URL: %s %q", s.Topology(), s.Name())
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"redis://h:1?addr=nope", "redis://h:1?master_name=m&bogus=1", "http://h:1", "redis://%zz"} {
		if _, err := Open(Options{URL: bad}); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if _, err := Open(Options{}); err == nil {
		t.Error("no topology: no error")
	}
}

// TestClusterReadinessNamesTopology: a cluster store's Ping names every
// primary; before any Ping the name shows the seeds.
func TestClusterReadinessNamesTopology(t *testing.T) {
	c := sharedCluster.Get(t)
	rs := openClusterStore(t, c)
	if got := rs.Name(); !strings.HasPrefix(got, "redis cluster via ") {
		t.Fatalf("Name() before Ping = %q", got)
	}
	if err := rs.Ping(testredis.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	_, primaries := slotOwners(t, c)
	if want := "redis cluster (3 primaries: " + strings.Join(primaries, " ") + ")"; rs.Name() != want {
		t.Fatalf("Name() = %q, want %q", rs.Name(), want)
	}
}

// countHook counts EVAL and EVALSHA commands.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" || name == "fcall" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if name := cmd.Name(); name == "evalsha" || name == "eval" || name == "fcall" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// waitPoolDials waits until the store's connection pools open new
// connections again, as many at once as each may hold (on a cluster, the
// pool of every primary). After an outage go-redis's pool, once as many
// dials have failed as it has connections, answers every new dial with the
// last dial error (naming the old primary) until a probe it makes once a
// second succeeds; decisions that wait for a connection meanwhile fail.
// Decisions made at once share connections (the coalescer batches them), so
// only holding PoolSize connections proves it.
func waitPoolDials(t *testing.T, s *Store, within time.Duration) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for tries := 1; ; tries++ {
		var err error
		if s.nodes != nil {
			// Decisions use the store's own client per primary.
			s.nodes.mu.RLock()
			primaries := map[*redis.Client]bool{}
			for _, nd := range s.nodes.slots {
				if nd != nil {
					primaries[nd.client] = true
				}
			}
			s.nodes.mu.RUnlock()
			for c := range primaries {
				if e := holdConns(c); e != nil {
					err = e
				}
			}
		} else if c, ok := s.client.(*redis.Client); ok {
			err = holdConns(c)
		} else {
			t.Fatalf("the store's client is a %T", s.client)
		}
		if err == nil {
			t.Logf("the pools opened PoolSize connections at once after %v (%d tries)", time.Since(start).Round(time.Millisecond), tries)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pools still cannot open PoolSize connections %v after the outage: %v", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holdConns takes as many connections from c's pool as it may hold, all
// at once, and pings on each.
func holdConns(c *redis.Client) error {
	n := c.Options().PoolSize
	errs, release := make(chan error, n), make(chan struct{})
	for range n {
		go func() {
			conn := c.Conn()
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			errs <- conn.Ping(ctx).Err()
			<-release // hold the connection until every other has one too
		}()
	}
	var err error
	for range n {
		if e := <-errs; e != nil {
			err = e
		}
	}
	close(release)
	return err
}
