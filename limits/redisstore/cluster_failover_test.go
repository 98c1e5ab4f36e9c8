package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/storetest"

	"github.com/rategate/rategate/internal/testredis"
)

// decisionTimeout plays redis.timeout in the failure tests, and
// decisionMargin is how much longer than that a decision may take, on top
// of the stalls the test process itself suffered. A stallMeter measures
// them: on a loaded machine with the race detector the whole process can be
// off the CPU for hundreds of ms, which no client can help. After such a
// stall every goroutine whose timer fired queues for the CPU at once and
// the meter sees only its own wake-up, so a decision is allowed twice the
// worst stall. A client that waits without watching its context (go-redis's
// own read, dial and pool timeouts are seconds) still fails the check.
const (
	decisionTimeout = 100 * time.Millisecond
	decisionMargin  = 50 * time.Millisecond
)

// stallMeter measures how late a goroutine that sleeps 5 ms wakes up: the
// worst scheduling stall of the process while it runs.
type stallMeter struct {
	stop  chan struct{}
	done  chan struct{}
	worst atomic.Int64 // ns
}

func startStallMeter() *stallMeter {
	m := &stallMeter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		const tick = 5 * time.Millisecond
		for {
			start := time.Now()
			select {
			case <-m.stop:
				return
			case <-time.After(tick):
			}
			if late := time.Since(start) - tick; int64(late) > m.worst.Load() {
				m.worst.Store(int64(late))
			}
		}
	}()
	return m
}

// Stop stops the meter and returns the worst stall it saw.
func (m *stallMeter) Stop() time.Duration {
	close(m.stop)
	<-m.done
	return time.Duration(m.worst.Load())
}

// checkLatency fails t when the slowest decision took longer than the
// timeout plus the margin plus the process's own worst stall.
func checkLatency(t *testing.T, what string, slowest, stall time.Duration) {
	t.Helper()
	bound := decisionTimeout + decisionMargin + 2*stall
	t.Logf("%s: slowest decision %v (timeout %v; the process itself stalled up to %v)", what,
		slowest.Round(time.Millisecond), decisionTimeout, stall.Round(time.Millisecond))
	if slowest > bound {
		t.Errorf("%s: slowest decision took %v, want <= %v (timeout %v + margin %v + twice the process stall %v)",
			what, slowest, bound, decisionTimeout, decisionMargin, stall)
	}
}

// failoverRules are three rules every load request matches, keyed so that
// they live in different slots: one global key, one per user, one per IP.
func failoverRules() []*limits.Rule {
	big := int64(1_000_000_000)
	return []*limits.Rule{
		{Name: "global", Algorithm: limits.GCRA, Limit: big, Period: time.Hour, Burst: big, Cost: 1},
		{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.FixedWindow, Limit: big, Period: time.Hour, Burst: big, Cost: 1},
		{Name: "per-ip", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.SlidingWindow, Limit: big, Period: time.Hour, Burst: big, Cost: 1},
	}
}

// load sends decisions through a limiter from a few goroutines, each with
// its own decisionTimeout deadline, and records how long they took and who
// decided them (the shared store, or the local fallback while it failed).
type load struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	maxLat atomic.Int64 // ns
	shared atomic.Int64
	local  atomic.Int64
}

func startLoad(t *testing.T, l *limits.Limiter, workers int) *load {
	ld := &load{stop: make(chan struct{})}
	for w := 0; w < workers; w++ {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var d limits.Decision
			for {
				select {
				case <-ld.stop:
					return
				default:
				}
				u := rng.IntN(50)
				req := &limits.Request{User: []byte("user" + strconv.Itoa(u)), IP: []byte("192.0.2." + strconv.Itoa(u))}
				ctx, cancel := context.WithTimeout(context.Background(), decisionTimeout)
				start := time.Now()
				err := l.Decide(ctx, req, &d)
				el := time.Since(start)
				cancel()
				if d.Undecided {
					t.Errorf("decision failed even with the local fallback: %v", err)
					return
				}
				for {
					m := ld.maxLat.Load()
					if int64(el) <= m || ld.maxLat.CompareAndSwap(m, int64(el)) {
						break
					}
				}
				if d.Local {
					ld.local.Add(1)
				} else {
					ld.shared.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return ld
}

func (ld *load) Stop() {
	close(ld.stop)
	ld.wg.Wait()
}

func (ld *load) String() string {
	return fmt.Sprintf("%d decided by the shared store, %d by the local fallback; slowest %v",
		ld.shared.Load(), ld.local.Load(), time.Duration(ld.maxLat.Load()).Round(time.Millisecond))
}

// waitDecides waits until the store decides a one-check batch for every key
// without error (after a failover the client must find the new primary).
func waitDecides(t *testing.T, s limits.Store, keys []string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		err = nil
		for _, k := range keys {
			var r [1]limits.Result
			// a zero-cost look with the algorithm the key's suffix names:
			// another's would not read its record
			algo := limits.FixedWindow
			if info, ok := limits.AlgorithmOfKey(k); ok {
				algo = info.Name
			}
			ctx, cancel := context.WithTimeout(context.Background(), decisionTimeout)
			_, err = s.Decide(ctx, &limits.Batch{Checks: []limits.Check{{Key: k, Algorithm: algo, Limit: 1, PeriodUS: storetest.SteadyPeriod(), Burst: 1}}}, r[:])
			cancel()
			if err != nil {
				break
			}
		}
		if err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("store still failing %v after recovery: %v", within, err)
}

// exactOnEveryPrimary checks that 200 concurrent requests per key, one key
// per primary, admit exactly the limit of 50 for every algorithm.
func exactOnEveryPrimary(t *testing.T, c *testredis.Cluster, s limits.Store, tag string) {
	t.Helper()
	for _, algo := range limits.Algorithms {
		for _, k := range keysOnEveryPrimary(t, c, tag+"-"+string(algo), algo.Suffix()) {
			ch := limits.Check{Key: k, Algorithm: algo, Limit: 50, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 50, Cost: 1}
			if got := hammer(t, s, 200, func(int) []limits.Check { return []limits.Check{ch} }); got != 50 {
				t.Fatalf("%s on %s: admitted %d of 200 concurrent requests, want exactly 50", algo, k, got)
			}
		}
	}
}

// TestClusterFailover kills the primary of the global rule's slot under
// load: every decision is still answered within the timeout (by the local
// fallback while the slot has no primary), the replica is promoted, the
// client finds it, exact limiting resumes on every primary, the new primary
// gets the scripts it lacked, and no goroutine is left behind.
func TestClusterFailover(t *testing.T) {
	before := runtime.NumGoroutine()
	c := testredis.StartCluster(t)
	rs, err := Open(Options{ClusterAddrs: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			rs.Close()
		}
	}()
	rules := failoverRules()
	local := memstore.New()
	defer func() {
		if !closed {
			local.Close()
		}
	}()
	l := limits.New(limits.Options{Store: rs, Prefix: "rg", Rules: rules, Fallback: local, LocalShare: 1, FailureMode: limits.FailLocal})

	globalKey, _ := l.KeyFor(rules[0], &limits.Request{})
	owner, _ := slotOwners(t, c)
	victim := c.Node(owner(KeySlot(globalKey)))

	stalls := startStallMeter()
	ld := startLoad(t, l, 4)
	time.Sleep(300 * time.Millisecond)
	killedAt := time.Now()
	victim.Stop()
	t.Logf("killed primary %s (slot %d of %s) under load", victim.Addr, KeySlot(globalKey), globalKey)
	if err := c.WaitHealthy(20 * time.Second); err != nil {
		ld.Stop()
		t.Fatalf("%v\n%s", err, c.Logs())
	}
	promoted, err := c.PrimaryForSlot(KeySlot(globalKey))
	if err != nil {
		ld.Stop()
		t.Fatal(err)
	}
	t.Logf("replica %s promoted %v after the kill", promoted, time.Since(killedAt).Round(time.Millisecond))
	waitDecides(t, rs, []string{globalKey}, 10*time.Second)
	t.Logf("the store decides on the new primary %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	time.Sleep(200 * time.Millisecond) // some load on the healed cluster
	ld.Stop()
	t.Logf("load: %s", ld)
	checkLatency(t, "cluster failover", time.Duration(ld.maxLat.Load()), stalls.Stop())
	if ld.local.Load() == 0 {
		t.Error("no decision fell back while the slot had no primary: the outage was not exercised")
	}

	ctx := testredis.Ctx(t)
	// Readiness must not flap while the dead node is still among the
	// client's known nodes (a seed, here): every ping within the decision
	// timeout, on the loaded store and on a fresh one with no traffic.
	fresh, err := Open(Options{ClusterAddrs: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Store{rs, fresh} {
		for i := 0; i < 30; i++ {
			pctx, cancel := context.WithTimeout(ctx, decisionTimeout)
			err := s.Ping(pctx)
			cancel()
			if err != nil {
				t.Fatalf("ping %d after failover: %v", i, err)
			}
		}
	}
	fresh.Close()
	if name := rs.Name(); !strings.Contains(name, "3 primaries") || !strings.Contains(name, promoted) {
		t.Errorf("Name() = %q, want the 3 primaries including %s", name, promoted)
	}
	exactOnEveryPrimary(t, c, rs, "after-failover")
	has, err := testredis.NodeClient(t, promoted).ScriptExists(ctx, rs.script.Hash()).Result()
	if err != nil || !has[0] {
		t.Errorf("the promoted primary has no decide script after deciding (%v, %v)", has, err)
	}

	rs.Close()
	local.Close()
	closed = true
	waitGoroutines(t, before, 10*time.Second)
}

// TestClusterOutageAndRecovery kills a primary and its replica: the
// cluster reports CLUSTERDOWN for every slot, decisions fail fast (so
// failure_mode applies) and readiness fails; when both come back (empty,
// without scripts) service is normal and exact again.
func TestClusterOutageAndRecovery(t *testing.T) {
	before := runtime.NumGoroutine()
	c := testredis.StartCluster(t)
	rs, err := Open(Options{ClusterAddrs: c.Addrs()})
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
	if err := rs.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	nodes, err := c.Topology()
	if err != nil {
		t.Fatal(err)
	}
	var primary, replica testredis.ClusterNode
	for _, n := range nodes {
		if n.Primary && len(n.Slots) > 0 && primary.ID == "" {
			primary = n
		}
	}
	for _, n := range nodes {
		if n.PrimaryID == primary.ID {
			replica = n
		}
	}
	if replica.ID == "" {
		t.Fatalf("no replica of %s in %+v", primary.Addr, nodes)
	}
	owner, _ := slotOwners(t, c)
	// a key on a healthy primary: CLUSTERDOWN stops it too
	var healthyKey string
	for n := 0; healthyKey == ""; n++ {
		k := fmt.Sprintf("rg:{healthy:%d}:fw", n)
		if owner(KeySlot(k)) != primary.Addr {
			healthyKey = k
		}
	}
	c.Node(primary.Addr).Stop()
	c.Node(replica.Addr).Stop()
	t.Logf("killed primary %s and its replica %s", primary.Addr, replica.Addr)

	// Until the others agree the shard is gone, its slots time out or are
	// refused; then every slot answers CLUSTERDOWN.
	stalls := startStallMeter()
	deadline := time.Now().Add(15 * time.Second)
	sawClusterDown := false
	var maxLat time.Duration
	for time.Now().Before(deadline) && !sawClusterDown {
		var r [1]limits.Result
		dctx, cancel := context.WithTimeout(context.Background(), decisionTimeout)
		start := time.Now()
		_, err := rs.Decide(dctx, &limits.Batch{Checks: []limits.Check{{Key: healthyKey, Algorithm: limits.FixedWindow, Limit: 5, PeriodUS: storetest.SteadyPeriod(), Burst: 5, Cost: 1}}}, r[:])
		maxLat = max(maxLat, time.Since(start))
		cancel()
		if err != nil && strings.Contains(err.Error(), "CLUSTERDOWN") {
			sawClusterDown = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !sawClusterDown {
		t.Fatalf("no CLUSTERDOWN within 15 s of losing a whole shard\n%s", c.Logs())
	}
	checkLatency(t, "CLUSTERDOWN", maxLat, stalls.Stop())
	pctx, cancel := context.WithTimeout(context.Background(), decisionTimeout)
	perr := rs.Ping(pctx)
	cancel()
	if perr == nil {
		t.Fatal("Ping succeeded with a shard down: /readyz would report ready")
	}
	t.Logf("during the outage: decisions fail within %v; Ping: %v", maxLat.Round(time.Millisecond), perr)
	// Multi-slot batches fail the same way, and nothing is left consumed:
	// the healthy slots' commits are refunded when the others come back.
	var two [2]limits.Result
	dctx, cancel := context.WithTimeout(context.Background(), decisionTimeout)
	_, err = rs.Decide(dctx, &limits.Batch{Checks: []limits.Check{
		{Key: healthyKey, Algorithm: limits.FixedWindow, Limit: 5, PeriodUS: storetest.SteadyPeriod(), Burst: 5, Cost: 1},
		{Key: "rg:{other:1}:gc", Algorithm: limits.GCRA, Limit: 5, PeriodUS: storetest.SteadyPeriod(), Burst: 5, Cost: 1},
	}}, two[:])
	cancel()
	if err == nil {
		t.Fatal("a multi-slot decision succeeded during CLUSTERDOWN")
	}

	c.Node(primary.Addr).Restart(t)
	c.Node(replica.Addr).Restart(t)
	if err := c.WaitHealthy(20 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, c.Logs())
	}
	waitDecides(t, rs, keysOnEveryPrimary(t, c, "back", "fw"), 10*time.Second)
	if err := rs.Ping(ctx); err != nil {
		t.Fatalf("Ping after recovery: %v", err)
	}
	t.Logf("recovered: %s", rs.Name())
	waitPoolDials(t, rs, 5*time.Second)
	exactOnEveryPrimary(t, c, rs, "after-outage")

	rs.Close()
	closed = true
	waitGoroutines(t, before, 10*time.Second)
}

// TestClusterRedirects moves the slot of a live key from one primary to
// another while deciding: ASK during the migration, TRYAGAIN for a
// two-key script whose keys are split between the nodes (retried until the
// deadline, then an error, never a hang), MOVED once the slot has moved; the
// count survives the move exactly.
func TestClusterRedirects(t *testing.T) {
	c := testredis.StartCluster(t)
	rs := openClusterStore(t, c)
	ctx := testredis.Ctx(t)
	fw := limits.Check{Key: "rg:{mig:a}:fw", Algorithm: limits.FixedWindow, Limit: 10, PeriodUS: limits.PeriodUS(time.Hour), Burst: 10, Cost: 1}
	gc := limits.Check{Key: "rg:{mig:a}:gc", Algorithm: limits.GCRA, Limit: 10, PeriodUS: limits.PeriodUS(time.Hour), Burst: 10, Cost: 1}
	slot := KeySlot(fw.Key)
	now := storetest.WindowStart(time.Hour) + 1
	decide := func(checks ...limits.Check) (bool, []limits.Result, error) {
		res := make([]limits.Result, len(checks))
		dctx, cancel := context.WithTimeout(ctx, decisionTimeout)
		defer cancel()
		a, err := rs.Decide(dctx, &limits.Batch{Checks: checks, NowUS: now}, res)
		return a, res, err
	}
	for i := 0; i < 3; i++ {
		if a, _, err := decide(fw); err != nil || !a {
			t.Fatalf("decide before the move: %v %v", a, err)
		}
	}
	m := migrateSlot(t, c, slot)
	nodes, src, dst, do := m.nodes, m.src, m.dst, m.do

	// The existing key is still served by the source; a new key in the
	// slot is sent to the target with ASK.
	if a, r, err := decide(fw); err != nil || !a || r[0].Remaining != 6 {
		t.Fatalf("existing key while migrating: %v %+v %v", a, r, err)
	}
	if a, r, err := decide(gc); err != nil || !a || r[0].Remaining != 9 {
		t.Fatalf("new key while migrating (ASK): %v %+v %v", a, r, err)
	}
	// One key on each side: the script cannot run anywhere (TRYAGAIN).
	stalls := startStallMeter()
	start := time.Now()
	_, _, err := decide(fw, gc)
	el := time.Since(start)
	if err == nil {
		t.Fatal("split two-key script: no error")
	}
	checkLatency(t, "TRYAGAIN", el, stalls.Stop())
	t.Logf("split keys: %v after %v", err, time.Since(start).Round(time.Millisecond))
	// With more time go-redis's bounded retries end and say why.
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = rs.Decide(lctx, &limits.Batch{Checks: []limits.Check{fw, gc}, NowUS: now}, make([]limits.Result, 2))
	cancel()
	if err == nil || !strings.Contains(err.Error(), "TRYAGAIN") {
		t.Fatalf("split two-key script with a long deadline: %v, want TRYAGAIN", err)
	}

	do(src.Addr, "MIGRATE", "127.0.0.1", strings.TrimPrefix(dst.Addr, "127.0.0.1:"), "", 0, 5000, "KEYS", fw.Key)
	// Both keys on the target now: ASK, and the moved count goes on.
	if a, r, err := decide(fw, gc); err != nil || !a || r[0].Remaining != 5 || r[1].Remaining != 8 {
		t.Fatalf("after MIGRATE (ASK): %v %+v %v", a, r, err)
	}
	for _, n := range nodes {
		if n.Primary && len(n.Slots) > 0 {
			do(n.Addr, "CLUSTER", "SETSLOT", slot, "NODE", dst.ID)
		}
	}
	// The client still maps the slot to the source, which answers MOVED.
	for i := 0; i < 5; i++ {
		if a, r, err := decide(fw, gc); err != nil || !a || r[0].Remaining != int64(4-i) {
			t.Fatalf("after the move (MOVED) %d: %v %+v %v", i, a, r, err)
		}
	}
	if a, r, err := decide(fw); err != nil || a || r[0].Remaining != 0 {
		t.Fatalf("the moved key kept its count: want denied at 10, got %v %+v %v", a, r, err)
	}
	if err := c.WaitHealthy(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.PrimaryForSlot(slot); got != dst.Addr {
		t.Fatalf("slot %d served by %s, want %s", slot, got, dst.Addr)
	}
}

// TestClusterPrimaryDownIsLocal: one dead primary is not the store being
// down. Once the primary's own breaker refuses its slots' decisions at once,
// the limiter decides them by its local fallback (bounded: the limit over
// local_share), as any call that failed while the store is up; failure_mode
// (allow here: unlimited) is for the store as a whole. The store's breaker
// is the app's (IsStoreFailure), and most traffic goes to the dead primary:
// its refusals must not open it, or every primary's identities would be
// left to failure_mode. Every other primary keeps deciding.
func TestClusterPrimaryDownIsLocal(t *testing.T) {
	c := testredis.StartCluster(t)
	rs := openClusterStore(t, c)
	local := memstore.New()
	defer local.Close()
	const limit = 5
	rule := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.FixedWindow,
		Limit: limit, Period: time.Hour, Burst: limit, Cost: 1}
	breaker := limits.NewBreaker(rs.Ping, rs.Name(), limits.BreakerOptions{ProbeTimeout: decisionTimeout, IsFailure: IsStoreFailure})
	defer breaker.Close()
	l := limits.New(limits.Options{Store: rs, Prefix: "rg", Rules: []*limits.Rule{rule}, Fallback: local, LocalShare: 1,
		FailureMode: limits.FailAllow, Breaker: breaker})

	// victim's key on one primary, other's on another
	owner, _ := slotOwners(t, c)
	slotOf := func(user string) (string, string) {
		k, _ := l.KeyFor(rule, &limits.Request{User: []byte(user)})
		return owner(KeySlot(k)), k
	}
	victimAddr, _ := slotOf("victim")
	other := ""
	for i := 0; other == ""; i++ {
		if addr, _ := slotOf("u" + strconv.Itoa(i)); addr != victimAddr {
			other = "u" + strconv.Itoa(i)
		}
	}
	decide := func(user string) limits.Decision {
		var d limits.Decision
		ctx, cancel := context.WithTimeout(context.Background(), decisionTimeout)
		defer cancel()
		_ = l.Decide(ctx, &limits.Request{User: []byte(user)}, &d)
		return d
	}
	for i := range limit + 1 {
		if d := decide("victim"); d.Admitted != (i < limit) || d.Local || d.Undecided {
			t.Fatalf("victim's request %d before the outage: %+v", i+1, d)
		}
	}

	c.Node(victimAddr).Stop()
	t.Logf("stopped %s, the primary of the victim's key", victimAddr)
	// Inside the failover (about two cluster-node-timeouts, 3.9-4.7 s
	// here): the victim's slot has no primary the whole time.
	var admitted, byLocal, undecided, otherShared, otherTotal int
	var kind limits.ErrorKind
	notSent := false
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		for range 8 {
			d := decide("victim")
			if d.Admitted {
				admitted++
			}
			if d.Undecided {
				undecided++
			}
			if d.Local {
				byLocal++
				kind, notSent = ErrorKind(d.Err), limits.NotSent(d.Err)
			}
			// the streak of refusals outlasts the breaker's OpenAfter
			// (its ProbeTimeout, decisionTimeout) before a success
			time.Sleep(decisionTimeout / 6)
		}
		// another primary's identity now and then: the store stays up
		if d := decide(other); !d.Local && !d.Undecided {
			otherShared++
		}
		otherTotal++
	}
	t.Logf("victim: %d admitted, %d by the local fallback, %d left to failure_mode; other: %d of %d by Redis",
		admitted, byLocal, undecided, otherShared, otherTotal)
	if undecided > 0 || admitted > limit {
		t.Errorf("the victim's decisions during one primary's outage: %d to failure_mode (allow), %d admitted; "+
			"want every one by the local fallback, at most %d admitted", undecided, admitted, limit)
	}
	if byLocal == 0 {
		t.Error("no decision of the victim fell back: the outage was not exercised")
	}
	if kind != limits.KindConnection {
		t.Errorf("the last refusal's error kind %q, want %q", kind, limits.KindConnection)
	}
	if !notSent {
		// it would feed rategate_store_duration_seconds a near-zero time
		t.Errorf("the last refusal (%v) does not say it was never sent", kind)
	}
	if st := breaker.State(); st != limits.BreakerClosed {
		t.Errorf("the store's breaker is %v with one primary of three down", st)
	}
	if otherShared < otherTotal*9/10 {
		t.Errorf("another primary's identity: %d of %d decided by Redis during the outage", otherShared, otherTotal)
	}
}

// migration is a slot being moved between two primaries (migrateSlot).
type migration struct {
	nodes    []testredis.ClusterNode
	src, dst testredis.ClusterNode
	// do runs a command on the node at addr, failing the test on an error.
	do func(addr string, args ...any)
}

// migrateSlot starts moving slot from its primary to another (IMPORTING on
// the target, MIGRATING on the source); the test moves keys and ends it.
func migrateSlot(t *testing.T, c *testredis.Cluster, slot int) migration {
	t.Helper()
	nodes, err := c.Topology()
	if err != nil {
		t.Fatal(err)
	}
	owner, _ := slotOwners(t, c)
	m := migration{nodes: nodes}
	for _, n := range nodes {
		switch {
		case !n.Primary || len(n.Slots) == 0:
		case n.Addr == owner(slot):
			m.src = n
		case m.dst.ID == "":
			m.dst = n
		}
	}
	m.do = func(addr string, args ...any) {
		t.Helper()
		if _, err := c.Node(addr).Do(args...); err != nil {
			t.Fatalf("%s %v: %v", addr, args, err)
		}
	}
	m.do(m.dst.Addr, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.src.ID)
	m.do(m.src.Addr, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.dst.ID)
	return m
}
