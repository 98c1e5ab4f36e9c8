package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/storetest"

	"github.com/rategate/rategate/internal/testredis"
)

// slotOwners returns a function from slot to the address of the primary
// that serves it, as the cluster reports it now.
func slotOwners(t *testing.T, c *testredis.Cluster) (owner func(slot int) string, primaries []string) {
	t.Helper()
	ps, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	var table [NumSlots]string
	for _, p := range ps {
		primaries = append(primaries, p.Addr)
		for _, r := range p.Slots {
			lo, hi, _ := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if hi != "" {
				b, _ = strconv.Atoi(hi)
			}
			for s := a; s <= b; s++ {
				table[s] = p.Addr
			}
		}
	}
	sort.Strings(primaries)
	return func(slot int) string { return table[slot] }, primaries
}

// keysOnEveryPrimary returns one key per primary, "rg:{<tag>-<n>}:<suffix>",
// in the order of primaries.
func keysOnEveryPrimary(t *testing.T, c *testredis.Cluster, tag, suffix string) []string {
	t.Helper()
	owner, primaries := slotOwners(t, c)
	keys := make([]string, len(primaries))
	found := 0
	for n := 0; found < len(primaries) && n < 10000; n++ {
		k := fmt.Sprintf("rg:{%s-%d}:%s", tag, n, suffix)
		i := slices.Index(primaries, owner(KeySlot(k)))
		if i >= 0 && keys[i] == "" {
			keys[i] = k
			found++
		}
	}
	if found != len(primaries) {
		t.Fatalf("no key of tag %q on every primary", tag)
	}
	return keys
}

func TestKeySlotMatchesCluster(t *testing.T) {
	c := sharedCluster.Get(t)
	nc := testredis.NodeClient(t, c.Nodes[0].Addr)
	keys := []string{"", "a", "foo", "123456789", "{", "}", "{}", "}{", "{}a", "a{}", "{a", "a}",
		"{a}", "x{a}y", "{a}{b}", "{{a}}", "{}{a}", "a{b}c{d}e", "rg:{global:}:fw", "rg:{user:=1.2.3.4}:gc",
		"{user1000}.following", "{user1000}.followers", "\x00{\xff}", "\xff\xfe\xfd"}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 300; i++ {
		b := make([]byte, rng.IntN(24))
		for j := range b {
			b[j] = "ab{}:%\x00\xff"[rng.IntN(8)]
		}
		keys = append(keys, string(b))
	}
	// rategate's own keys, from hostile identities.
	r := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.GCRA}
	for _, user := range []string{"alice", "{x}", "}{", "a}b{c", strings.Repeat("{", 200), "\x00", "é"} {
		id, _ := limits.AppendIdentity(nil, r, &limits.Request{User: []byte(user)})
		keys = append(keys, string(limits.AppendKey(nil, "rg", r, id)))
	}
	ctx := testredis.Ctx(t)
	for _, k := range keys {
		want, err := nc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := KeySlot(k); int64(got) != want {
			t.Errorf("KeySlot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}

// openClusterStore opens a store over c the way main does, closed at cleanup.
func openClusterStore(t *testing.T, c *testredis.Cluster) *Store {
	t.Helper()
	rs, err := Open(Options{ClusterAddrs: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return rs
}

// hammer sends n concurrent decisions of b (released together) and returns
// how many were admitted.
func hammer(t *testing.T, s limits.Store, n int, batch func(i int) []limits.Check) (admitted int64) {
	t.Helper()
	var ok atomic.Int64
	var wg sync.WaitGroup
	gate := make(chan struct{})
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			checks := batch(i)
			res := make([]limits.Result, len(checks))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := s.Decide(ctx, &limits.Batch{Checks: checks}, res)
			if err != nil {
				errs <- err
				return
			}
			if a {
				ok.Add(1)
			}
		}()
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return ok.Load()
}

func TestClusterConcurrentAcrossPrimaries(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs := openClusterStore(t, c)
	for _, algo := range limits.Algorithms {
		t.Run(string(algo), func(t *testing.T) {
			keys := keysOnEveryPrimary(t, c, "spread-"+string(algo), algo.Suffix())
			checks := make([]limits.Check, len(keys))
			for i, k := range keys {
				checks[i] = limits.Check{Key: k, Algorithm: algo, Limit: 50, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 50, Cost: 1}
			}
			// 200 concurrent requests per key, all keys at once.
			var perKey [3]atomic.Int64
			var wg sync.WaitGroup
			for k := range checks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					perKey[k].Store(hammer(t, rs, 200, func(int) []limits.Check { return []limits.Check{checks[k]} }))
				}()
			}
			wg.Wait()
			for k := range checks {
				if got := perKey[k].Load(); got != 50 {
					t.Errorf("key %s: admitted %d of 200 concurrent requests, want exactly 50", keys[k], got)
				}
			}
		})
	}
}

// TestClusterMultiRuleAcrossSlots: rules in different slots, decided per
// slot with refunds, still obey "a denied request consumes nothing".
func TestClusterMultiRuleAcrossSlots(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs := openClusterStore(t, c)
	owner, _ := slotOwners(t, c)
	ctx := testredis.Ctx(t)
	for _, algo := range limits.Algorithms {
		t.Run(string(algo)+"/user hammering", func(t *testing.T) {
			global := limits.Check{Key: "rg:{global-" + string(algo) + ":}:" + algo.Suffix(), Algorithm: algo,
				Limit: 1000, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 1000, Cost: 1}
			user := limits.Check{Algorithm: algo, Limit: 5, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 5, Cost: 1}
			for n := 0; ; n++ {
				user.Key = fmt.Sprintf("rg:{user-%s:alice%d}:%s", algo, n, algo.Suffix())
				if owner(KeySlot(user.Key)) != owner(KeySlot(global.Key)) {
					break
				}
			}
			before := rs.Refunds()
			admitted := hammer(t, rs, 200, func(int) []limits.Check { return []limits.Check{user, global} })
			if admitted != 5 {
				t.Fatalf("admitted %d of 200, want exactly 5 (the user's limit)", admitted)
			}
			// The user's slot (the smaller limit) is decided first: its
			// denials never reach the global rule, so nothing is refunded.
			g, err := rs.Peek(ctx, global)
			if err != nil {
				t.Fatal(err)
			}
			if g.Remaining != 1000-5 {
				t.Fatalf("global remaining %d after 5 admitted and 195 denied, want %d: denied requests consumed the global rule", g.Remaining, 1000-5)
			}
			if after := rs.Refunds(); after != before {
				t.Fatalf("refunds %+v -> %+v, want none: the user's slot denies before the global one is asked", before, after)
			}
		})
		t.Run(string(algo)+"/global tight", func(t *testing.T) {
			// Ten users against a global limit below their sum: whatever
			// the interleaving, once refunds have run every counter holds
			// exactly the admitted requests.
			global := limits.Check{Key: "rg:{tight-" + string(algo) + ":}:" + algo.Suffix(), Algorithm: algo,
				Limit: 30, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 30, Cost: 1}
			users := make([]limits.Check, 10)
			for u := range users {
				users[u] = limits.Check{Key: fmt.Sprintf("rg:{tight-%s:u%d}:%s", algo, u, algo.Suffix()), Algorithm: algo,
					Limit: 5, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 5, Cost: 1}
			}
			perUser := make([]atomic.Int64, len(users))
			var total atomic.Int64
			var wg sync.WaitGroup
			gate := make(chan struct{})
			for i := 0; i < 200; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-gate
					u := i % len(users)
					res := make([]limits.Result, 2)
					a, err := rs.Decide(ctx, &limits.Batch{Checks: []limits.Check{users[u], global}}, res)
					if err != nil {
						t.Error(err)
						return
					}
					if a {
						perUser[u].Add(1)
						total.Add(1)
					}
				}()
			}
			close(gate)
			wg.Wait()
			if total.Load() > 30 || total.Load() == 0 {
				t.Fatalf("admitted %d, want 1..30", total.Load())
			}
			g, err := rs.Peek(ctx, global)
			if err != nil {
				t.Fatal(err)
			}
			if g.Remaining != 30-total.Load() {
				t.Fatalf("global remaining %d, want %d (30 - admitted)", g.Remaining, 30-total.Load())
			}
			for u := range users {
				r, err := rs.Peek(ctx, users[u])
				if err != nil {
					t.Fatal(err)
				}
				if r.Remaining != 5-perUser[u].Load() {
					t.Fatalf("user %d remaining %d, want %d (5 - its admitted)", u, r.Remaining, 5-perUser[u].Load())
				}
			}
			t.Logf("%d admitted of 200 (the global limit is 30; concurrent refunds in flight can only lower it)", total.Load())
		})
	}
}

// TestClusterMatchesSingleScript runs random multi-rule timelines on the
// cluster store (per-slot scripts and refunds) and on the memory store (one
// atomic step, like decide.lua on one Redis): every verdict, remaining,
// reset and retry must be the same.
func TestClusterMatchesSingleScript(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs := openClusterStore(t, c)
	mem := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { mem.Close() })
	seed := storetest.Seed(t)
	rng := rand.New(rand.NewPCG(uint64(seed), 7))

	// A pool of rules: every algorithm, fractional intervals for gcra (3 per
	// second, 7 per 10 s: exact in 1/L µs), whole ones for token_bucket (a
	// fractional one is stricter by < 1 µs per refund, see
	// TestClusterTokenBucketFractionalRefund), two rules sharing a hash tag
	// (one slot, two keys).
	type lim struct {
		limit, burst int64
		period       time.Duration
	}
	var pool []limits.Check
	for _, algo := range limits.Algorithms {
		lps := []lim{{3, 4, time.Second}, {7, 7, 10 * time.Second}, {20, 5, time.Minute}}
		if algo == limits.TokenBucket {
			lps = []lim{{4, 4, time.Second}, {8, 8, 10 * time.Second}, {20, 5, time.Minute}}
		}
		for i, lp := range lps {
			burst := lp.burst
			if algo != limits.GCRA && algo != limits.TokenBucket {
				burst = lp.limit
			}
			pool = append(pool, limits.Check{Key: fmt.Sprintf("rg:{m-%s-%d:x}:%s", algo, i, algo.Suffix()), Algorithm: algo,
				Limit: lp.limit, PeriodUS: limits.PeriodUS(lp.period), Burst: burst})
		}
	}
	pool = append(pool, limits.Check{Key: "rg:{shared:x}:fw", Algorithm: limits.FixedWindow, Limit: 6, PeriodUS: limits.PeriodUS(time.Minute), Burst: 6},
		limits.Check{Key: "rg:{shared:x}:gc", Algorithm: limits.GCRA, Limit: 4, PeriodUS: limits.PeriodUS(time.Second), Burst: 2})

	// The timeline runs on its own clock, an hour ahead of Redis's, which
	// still expires keys on its own: a record written in a window's last
	// millisecond lives 2 ms, and the next step (under -race, a few ms
	// later) found it gone where the memory store still counted it. So
	// every key a step touched loses its TTL when the step ends (the scripts
	// decide from what a record says, not from whether it is there); a key
	// can then expire only between a write and that PERSIST, within its
	// step, after the step's decision read it. A step that lost a key the
	// memory store still holds (its refund found nothing to give back)
	// leaves the two stores apart: both start over, unless the memory store
	// keeps the key longer than a TTL that ran out within the step could
	// have been (then Redis was given too short a one, or deleted it).
	ctx := testredis.Ctx(t)
	client := c.Client(t)
	lost := 0
	settle := func(checks []limits.Check, now int64, sent time.Time) {
		t.Helper()
		exists := make([]*redis.IntCmd, len(checks))
		_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, ch := range checks {
				p.Persist(ctx, ch.Key)
				exists[i] = p.Exists(ctx, ch.Key)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("persist: %v", err)
		}
		// A TTL this step set ran out by now: on the test's clock, by now
		// plus that time (and 1 ms: the scripts round up) at the latest.
		by := now + time.Since(sent).Microseconds() + 1000
		for i, ch := range checks {
			if exists[i].Val() == 0 && mem.HoldsAt(ch.Key, now) {
				if mem.HoldsAt(ch.Key, by) {
					// the memory store keeps it longer than any TTL that
					// ran out within the step: not the clocks
					t.Fatalf("Redis dropped %s within a step while the memory store keeps it past %d: a TTL shorter than its record, or a delete", ch.Key, by)
				}
				lost++
				t.Logf("Redis expired %s within a step on its own clock: both stores start over", ch.Key)
				if err := c.FlushAll(); err != nil {
					t.Fatal(err)
				}
				mem.Close()
				mem = memstore.NewSweeping(time.Hour)
				return
			}
		}
	}

	now := time.Now().UnixMicro() + limits.PeriodUS(time.Hour) // an hour ahead of Redis's clock
	slotsSeen := map[int]bool{}
	denied, admittedN := 0, 0
	for step := 0; step < 1500; step++ {
		switch r := rng.IntN(10); {
		case r < 4:
		case r < 8:
			now += rng.Int64N(300_000)
		default:
			now += rng.Int64N(5_000_000)
		}
		n := 2 + rng.IntN(3)
		perm := rng.Perm(len(pool))[:n]
		checks := make([]limits.Check, n)
		for i, p := range perm {
			checks[i] = pool[p]
			checks[i].Cost = int64(rng.IntN(4)) // 0 = a look
			checks[i].Shadow = rng.IntN(8) == 0
		}
		for _, ch := range checks {
			slotsSeen[KeySlot(ch.Key)] = true
		}
		want := make([]limits.Result, n)
		got := make([]limits.Result, n)
		wa, err := mem.Decide(ctx, &limits.Batch{Checks: checks, NowUS: now}, want)
		if err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		ga, err := rs.Decide(ctx, &limits.Batch{Checks: checks, NowUS: now}, got)
		if err != nil {
			t.Fatal(err)
		}
		if ga != wa || !slices.Equal(got, want) {
			var b strings.Builder
			for i, ch := range checks {
				fmt.Fprintf(&b, "\n  %s (%s L=%d P=%dµs B=%d cost=%d shadow=%v) slot %d: cluster %+v, single %+v",
					ch.Key, ch.Algorithm, ch.Limit, ch.PeriodUS, ch.Burst, ch.Cost, ch.Shadow, KeySlot(ch.Key), got[i], want[i])
			}
			t.Fatalf("step %d (seed %d): cluster admitted=%v, single script admitted=%v%s", step, seed, ga, wa, b.String())
		}
		settle(checks, now, sent)
		if wa {
			admittedN++
		} else {
			denied++
		}
	}
	t.Logf("1500 requests over %d slots: %d admitted, %d denied; refunds %+v", len(slotsSeen), admittedN, denied, rs.Refunds())
	if denied < 100 || admittedN < 100 || lost > 10 {
		t.Fatalf("%d admitted, %d denied, %d steps lost a key to Redis's clock: the run did not exercise both, or lost too much", admittedN, denied, lost)
	}
}

// TestClusterTokenBucketFractionalRefund: with a refill interval that is not
// a whole number of µs (3 per second), every commit drops the sub-µs part of
// the refill progress, so commit + refund leaves the bucket behind the
// untouched one by less than 1 µs: never looser, and stricter by at most
// one µs per refund.
func TestClusterTokenBucketFractionalRefund(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs := openClusterStore(t, c)
	mem := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { mem.Close() })
	ctx := testredis.Ctx(t)
	tb := limits.Check{Key: "rg:{frac:tb}:tb", Algorithm: limits.TokenBucket, Limit: 3, PeriodUS: limits.PeriodUS(time.Second), Burst: 4, Cost: 1}
	blocked := limits.Check{Key: "rg:{frac:blocked}:fw", Algorithm: limits.FixedWindow, Limit: 1, PeriodUS: limits.PeriodUS(time.Hour), Burst: 1, Cost: 2}
	if KeySlot(tb.Key) == KeySlot(blocked.Key) {
		t.Fatal("pick keys in two slots")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	now := time.Now().UnixMicro() + limits.PeriodUS(time.Hour)
	refunds := int64(0)
	for i := 0; i < 400; i++ {
		now += rng.Int64N(200_000)
		if rng.IntN(3) == 0 {
			// admitted on both: the stores stay comparable
			var m, r [1]limits.Result
			ma, _ := mem.Decide(ctx, &limits.Batch{Checks: []limits.Check{tb}, NowUS: now}, m[:])
			ra, err := rs.Decide(ctx, &limits.Batch{Checks: []limits.Check{tb}, NowUS: now}, r[:])
			if err != nil {
				t.Fatal(err)
			}
			if ra && !ma {
				t.Fatalf("step %d: cluster admitted what the untouched bucket denies: looser", i)
			}
			if ra != ma {
				continue // cluster stricter at a boundary: allowed
			}
		} else {
			// denied by the other slot: commit + refund on the cluster,
			// nothing at all on the memory store
			var r [2]limits.Result
			if a, err := rs.Decide(ctx, &limits.Batch{Checks: []limits.Check{tb, blocked}, NowUS: now}, r[:]); err != nil || a {
				t.Fatalf("step %d: %v %v", i, a, err)
			}
			if r[0].Allowed {
				refunds++
			}
		}
		m, err := mem.PeekAt(tb, now)
		if err != nil {
			t.Fatal(err)
		}
		r, err := rs.PeekAt(ctx, tb, now)
		if err != nil {
			t.Fatal(err)
		}
		if r.Remaining > m.Remaining || r.ResetUS < m.ResetUS {
			t.Fatalf("step %d: cluster %+v is looser than the untouched bucket %+v", i, r, m)
		}
		if r.ResetUS > m.ResetUS+refunds {
			t.Fatalf("step %d: cluster %+v is %dµs behind the untouched bucket %+v after %d refunds", i, r, r.ResetUS-m.ResetUS, m, refunds)
		}
	}
	t.Logf("%d refunds", refunds)
}

// TestClusterRefundExactlyOnce: a refund sent twice (a retry after a lost
// reply) gives back once.
func TestClusterRefundExactlyOnce(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs := openClusterStore(t, c)
	ctx := testredis.Ctx(t)
	now := storetest.WindowStart(time.Hour) + 1
	for _, algo := range limits.Algorithms {
		ch := limits.Check{Key: "rg:{once:" + string(algo) + "}:" + algo.Suffix(), Algorithm: algo, Limit: 10,
			PeriodUS: limits.PeriodUS(time.Hour), Burst: 10, Cost: 3}
		var r [1]limits.Result
		for i := 0; i < 2; i++ { // two admitted requests: 6 of 10 used
			if ok, err := rs.Decide(ctx, &limits.Batch{Checks: []limits.Check{ch}, NowUS: now}, r[:]); err != nil || !ok {
				t.Fatalf("%s: decide: %v %v", algo, ok, err)
			}
		}
		g := &slotGroup{slot: KeySlot(ch.Key), idx: []int{0}, admitted: true, at: now}
		j := newRefundJob(&limits.Batch{Checks: []limits.Check{ch}, NowUS: now}, g, r[:], 5*time.Second)
		for i := 0; i < 2; i++ {
			res := make([]limits.Result, 1)
			if err := rs.runRefund(ctx, j, res); err != nil {
				t.Fatal(err)
			}
			if res[0].Remaining != 7 {
				t.Fatalf("%s: refund %d left %d remaining, want 7 (10 - 6 + 3, once)", algo, i+1, res[0].Remaining)
			}
		}
	}
}

// TestClusterRoundTrips counts the scripts one decision runs and measures
// them on loopback (the numbers docs/scaling.md quotes; logged, not asserted).
func TestClusterRoundTrips(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs := openClusterStore(t, c)
	owner, primaries := slotOwners(t, c)
	// Script runs, as the primaries count them (decisions go straight to
	// them, not through the cluster client).
	scriptRuns := func() int64 {
		var total int64
		for _, addr := range primaries {
			info, err := c.Node(addr).Do("INFO", "commandstats")
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(fmt.Sprint(info), "\n") {
				for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls=", "cmdstat_fcall:calls="} {
					if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
						n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
						total += n
					}
				}
			}
		}
		return total
	}
	user := limits.Check{Key: "rg:{rt:user}:fw", Algorithm: limits.FixedWindow, Limit: 1 << 30, PeriodUS: storetest.SteadyPeriod(), Burst: 1 << 30, Cost: 1}
	global := limits.Check{Key: "rg:{rt:global}:gc", Algorithm: limits.GCRA, Limit: 1 << 30, PeriodUS: storetest.SteadyPeriod(), Burst: 1 << 30, Cost: 1}
	if owner(KeySlot(user.Key)) == owner(KeySlot(global.Key)) {
		t.Fatal("pick keys on two primaries")
	}
	sameSlot := limits.Check{Key: "rg:{rt:user}:gc", Algorithm: limits.GCRA, Limit: 1 << 30, PeriodUS: storetest.SteadyPeriod(), Burst: 1 << 30, Cost: 1}
	blocked := limits.Check{Key: "rg:{rt:blocked}:fw", Algorithm: limits.FixedWindow, Limit: 1, PeriodUS: storetest.SteadyPeriod(), Burst: 1, Cost: 2}
	cases := []struct {
		name        string
		checks      []limits.Check
		wantAdmit   bool
		wantScripts int64
		rtts        int
	}{
		// Several slots: the most restrictive first (blocked, limit 1),
		// the others once it admitted, or dry when it denied.
		{"one rule", []limits.Check{user}, true, 1, 1},
		{"two rules, one slot", []limits.Check{user, sameSlot}, true, 1, 1},
		{"two rules, two slots, admitted", []limits.Check{user, global}, true, 2, 2},
		{"two rules, two slots, denied first", []limits.Check{user, blocked}, false, 2, 2},
		{"three rules, three slots, denied first", []limits.Check{user, global, blocked}, false, 3, 2},
	}
	ctx := testredis.Ctx(t)
	const n = 2000
	measure := func(s limits.Store, checks []limits.Check, wantAdmit bool) []time.Duration {
		res := make([]limits.Result, len(checks))
		lat := make([]time.Duration, n)
		for i := 0; i < n; i++ {
			start := time.Now()
			a, err := s.Decide(ctx, &limits.Batch{Checks: checks}, res)
			lat[i] = time.Since(start)
			if err != nil || a != wantAdmit {
				t.Fatalf("admitted=%v err=%v", a, err)
			}
		}
		slices.Sort(lat)
		return lat
	}
	for _, tc := range cases {
		// load the scripts on every node first (EVALSHA, NOSCRIPT, EVAL)
		if _, err := rs.Decide(ctx, &limits.Batch{Checks: tc.checks}, make([]limits.Result, len(tc.checks))); err != nil {
			t.Fatal(err)
		}
		before := scriptRuns()
		lat := measure(rs, tc.checks, tc.wantAdmit)
		if got := scriptRuns() - before; got != tc.wantScripts*n {
			t.Errorf("%s: %d scripts per decision, want %d", tc.name, got/n, tc.wantScripts)
		}
		t.Logf("cluster, %-42s %d scripts, %d round trip(s) of wall time: p50 %v, p99 %v", tc.name, tc.wantScripts, tc.rtts,
			lat[n/2].Round(time.Microsecond), lat[n*99/100].Round(time.Microsecond))
	}
	// The same requests on one redis-server: always one script.
	srv := testredis.Start(t)
	single, err := New(srv.Client(t), "redis "+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		lat := measure(single, tc.checks, tc.wantAdmit)
		t.Logf("single redis, %-37s 1 script,  1 round trip  of wall time: p50 %v, p99 %v", tc.name,
			lat[n/2].Round(time.Microsecond), lat[n*99/100].Round(time.Microsecond))
	}
}

// waitGoroutines waits until no more goroutines run than before, and fails
// with their stacks if some stay.
func waitGoroutines(t *testing.T, before int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		n := runtime.NumGoroutine()
		if n <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines still running, %d before the test:\n%s", n, before, buf)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClusterWarmAndPingLoadScripts: Warm loads both scripts on every
// primary, and a readiness Ping reloads them on a primary that lost them
// (as a promoted replica, or after SCRIPT FLUSH), so the next decision there
// does not pay for NOSCRIPT and EVAL.
func TestClusterWarmAndPingLoadScripts(t *testing.T) {
	c := sharedCluster.Get(t)
	rs := openClusterStore(t, c)
	ctx := testredis.Ctx(t)
	_, primaries := slotOwners(t, c)
	flush := func() {
		for _, p := range primaries {
			if _, err := c.Node(p).Do("SCRIPT", "FLUSH"); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(when string) {
		t.Helper()
		for _, p := range primaries {
			has, err := testredis.NodeClient(t, p).ScriptExists(ctx, rs.scriptHashes()...).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(has) != 2 || !has[0] || !has[1] {
				t.Fatalf("%s: primary %s has scripts %v, want both", when, p, has)
			}
		}
	}
	flush()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	check("after Warm")
	flush()
	if err := rs.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	check("after Ping")
}

// TestClusterEpochSeesEveryPrimary: on Redis Cluster a primary restarted
// empty while it keeps its slots loses its own keys only. The epoch must
// notice that on any primary, not only on the one holding <prefix>:epoch:
// FLUSHALL on each primary in turn is a loss, seen once.
func TestClusterEpochSeesEveryPrimary(t *testing.T) {
	c := testredis.StartCluster(t)
	rs := openClusterStore(t, c)
	ctx := testredis.Ctx(t)
	e := rs.Epoch("ep")
	owner, primaries := slotOwners(t, c)
	// the slot map is read in the background when the epoch first asks
	var keys []string
	for end := time.Now().Add(5 * time.Second); len(keys) != 1+len(primaries) && time.Now().Before(end); {
		keys = e.keys()
		time.Sleep(10 * time.Millisecond)
	}
	if len(keys) != 1+len(primaries) {
		t.Fatalf("markers %v, want the shared one and one on each of %d primaries", keys, len(primaries))
	}
	if lost, err := e.Check(ctx); lost || err != nil {
		t.Fatalf("first check: lost %v, %v", lost, err)
	}
	shared := owner(KeySlot("ep:epoch"))
	for _, p := range primaries {
		if err := testredis.NodeClient(t, p).FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		lost, err := e.Check(ctx)
		if err != nil || !lost {
			t.Fatalf("FLUSHALL on primary %s (the shared marker's: %v): lost %v, %v; want the loss seen", p, p == shared, lost, err)
		}
		if lost, err := e.Check(ctx); lost || err != nil {
			t.Fatalf("the check after: lost %v, %v; want nothing new", lost, err)
		}
	}
}
