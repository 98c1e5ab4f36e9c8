package redisstore

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/lua"
)

// This file compares, at random, batches sent as the coalescer sends them
// (one FCALL of DecideMany, or one EVALSHA of DecideManyScript) with the
// same decisions sent one by one (one FCALL of Decide each, at the
// instant the batch reports) and with the memory store.

// randomBatchSeed is the seed TestBatchesMatchOneByOneAtRandom starts from
// unless RG_BATCH_SEED names another; RG_BATCH_ROUNDS sets how many
// batches it sends.
const randomBatchSeed = 20260611

// batchRule is the numbers of one check but its key and cost.
type batchRule struct {
	algo                 limits.Algorithm
	limit, period, burst int64
}

// randomRule draws a rule of algo: small limits (so that batches run
// through them) and large ones (so that requests of many checks are
// admitted now and then), periods that roll over while the test runs (all of them
// whole seconds: windows end on a second). A gcra or token_bucket rule
// takes 62.5 ms or more per unit (its key expires when it is full again:
// at least that long after an admission).
func randomRule(rng *rand.Rand, algo limits.Algorithm) batchRule {
	ls := []int64{1, 2, 3, 5, 8, 20, 60, 200, 1000, 1000, 1000}
	ps := []int64{1_000_000, 2_000_000, 3_000_000, 7_000_000}
	r := batchRule{algo: algo, limit: ls[rng.IntN(len(ls))], period: ps[rng.IntN(len(ps))]}
	r.burst = r.limit
	if algo == limits.GCRA || algo == limits.TokenBucket {
		r.limit = []int64{1, 2, 3, 5, 8, 16}[rng.IntN(6)]
		r.burst = []int64{1, 2, r.limit, 2 * r.limit, 3 * r.limit}[rng.IntN(5)]
	}
	return r
}

// randomCost draws a check's cost against its rule: mostly 1, some looks
// (0), some that fill or overrun the limit or burst.
func randomCost(rng *rand.Rand, r batchRule) int64 {
	switch n := rng.IntN(20); {
	case n < 2:
		return 0
	case n < 13:
		return 1
	case n < 15:
		return 2
	case n < 16:
		return 3
	case n < 17:
		return r.limit
	case n < 18:
		return r.burst
	case n < 19:
		return r.burst + 1
	default:
		return r.limit + 1
	}
}

// randomChecks draws how many checks a request has: mostly a few, now and
// then past the checks a decision may hold (maxHeldChecks) or past the
// 41 checks decide.lua writes at once.
func randomChecks(rng *rand.Rand, most int) int {
	n := 1
	switch x := rng.IntN(100); {
	case x < 40:
	case x < 80:
		n = 2 + rng.IntN(3)
	case x < 92:
		n = 5 + rng.IntN(8)
	case x < 97:
		n = maxHeldChecks - 2 + rng.IntN(5)
	default:
		n = 40 + rng.IntN(6)
	}
	return min(n, most)
}

// TestBatchesMatchOneByOneAtRandom sends random batches through the
// coalescer's sendMany, as FCALL of DecideMany and as EVALSHA of
// DecideManyScript, and fails unless every decision answers exactly what
// one FCALL of Decide answers at the batch's instant, sent one by one in
// the batch's order in a key space of its own, and what the memory store
// answers; and unless the two key spaces then hold the same records with
// about the same expiry (and none without one). The batches mix all five
// algorithms in one request, keys that several decisions name (held by
// the call) and keys named once, limits that a batch runs through, costs
// of 0 to past the limit or burst, shadow checks, a key decided under two
// rules in one batch and rules reloaded between batches (sliding_log's
// period stays: a longer one counts entries Redis may have expired a
// little earlier in one key space than in the other), requests of 1 to
// 45 checks (past the 30 a decision may hold and the 41 written at once),
// batches of up to DefaultMaxBatch decisions, some with a decision at its
// own instant (nothing held), and decide.lua's rg_careful in any state
// (an undone write just before, and some requests after it).
func TestBatchesMatchOneByOneAtRandom(t *testing.T) {
	keepBoxes(t)
	seed := uint64(randomBatchSeed)
	if s := os.Getenv("RG_BATCH_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("RG_BATCH_SEED=%q: %v", s, err)
		}
		seed = v
	}
	rounds := 160
	if s := os.Getenv("RG_BATCH_ROUNDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("RG_BATCH_ROUNDS=%q: %v", s, err)
		}
		rounds = v
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	srv := testredis.Start(t)
	client := srv.Client(t)
	ctx := testredis.Ctx(t)
	byFcall := warmStore(t, &redis.Options{Addr: srv.Addr}, nil)
	byEval, err := New(redis.NewClient(&redis.Options{Addr: srv.Addr}), "redis", CoalesceOptions{EvalOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { byEval.Close() })
	if err := byEval.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	mem := memstore.New()
	t.Cleanup(func() { mem.Close() })
	lib := lua.Library()
	fail := func(round int, format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d (RG_BATCH_SEED=%d), batch %d: %s", seed, seed, round, fmt.Sprintf(format, args...))
	}

	// the keys: per algorithm 10, three of them hot (named by most
	// decisions), each with the rule it is mostly decided under
	type poolKey struct {
		name string
		rule batchRule
	}
	var pool []poolKey
	for _, algo := range limits.Algorithms {
		info, _ := algo.Info()
		for i := range 10 {
			pool = append(pool, poolKey{fmt.Sprintf("{%s%d}:%s", algo, i, info.Suffix), randomRule(rng, algo)})
		}
	}
	inSpace := func(space, name string) string { return "rb" + space + ":" + name }
	var allKeys []string
	for _, k := range pool {
		allKeys = append(allKeys, inSpace("m", k.name), inSpace("o", k.name))
	}
	pick := func() int {
		if rng.IntN(3) > 0 {
			// hot: keys 0 to 2 of an algorithm
			return 10*rng.IntN(len(limits.Algorithms)) + rng.IntN(3)
		}
		return rng.IntN(len(pool))
	}

	// guard waits while a key of either space is about to expire, or a
	// window to end: the decisions one by one run a few milliseconds after
	// the batch, at its instant, and Redis expires keys by its clock (a
	// script's start), so a record that ends then would be gone for them
	// and not for the batch. It returns when it returned.
	const margin = 100 * time.Millisecond
	guard := func(round int) time.Time {
		t.Helper()
		for try := 0; ; try++ {
			pipe := client.Pipeline()
			cmds := make([]*redis.DurationCmd, len(allKeys))
			for i, k := range allKeys {
				cmds[i] = pipe.PTTL(ctx, k)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				fail(round, "PTTL: %v", err)
			}
			wait := time.Duration(-1)
			for i, c := range cmds {
				d := c.Val()
				if d == -1 {
					fail(round, "key %s has no expiry", allKeys[i])
				}
				if d >= 0 && d < margin && d > wait {
					wait = d
				}
			}
			if left := time.Second - time.Duration(time.Now().UnixNano())%time.Second; left < margin && left > wait {
				wait = left
			}
			if wait < 0 {
				return time.Now()
			}
			if try == 100 {
				fail(round, "keys kept expiring for 100 waits")
			}
			time.Sleep(wait + 3*time.Millisecond)
		}
	}

	// careful puts decide.lua's rg_careful in some state: one request
	// whose first write is undone (a later check denies), then n requests
	// of two checks, on keys of their own.
	careful := func(round, n int) {
		t.Helper()
		fw := func(limit int64) []any {
			return []any{limits.FixedWindow.Code(), limit, int64(60_000_000), limit, int64(1), 0}
		}
		call := func(keys []string, checks ...[]any) {
			t.Helper()
			args := []any{int64(0)}
			for _, c := range checks {
				args = append(args, c...)
			}
			if err := client.FCall(ctx, lib.Decide, keys, args...).Err(); err != nil {
				fail(round, "careful: %v", err)
			}
		}
		a, b, gate := "rbc:{a}:fw2", "rbc:{b}:fw2", "rbc:{gate}:fw2"
		call([]string{a, b}, fw(1_000_000), fw(1_000_000))
		call([]string{gate}, fw(1))
		call([]string{gate}, fw(1))
		call([]string{a, gate}, fw(1_000_000), fw(1))
		for range n {
			call([]string{a, b}, fw(1_000_000), fw(1_000_000))
		}
	}

	scratch := map[*Store]*manyScratch{byFcall: {}, byEval: {}}
	var held, decisions, denied, admittedN, manyChecks int
	var slowest time.Duration
	start := time.Now()
	for round := range rounds {
		if rng.IntN(25) == 0 {
			// a rule reloaded: another rule for a key from now on
			k := &pool[rng.IntN(len(pool))]
			r := randomRule(rng, k.rule.algo)
			if k.rule.algo == limits.SlidingLog {
				r.period = k.rule.period
			}
			k.rule = r
		}
		if rng.IntN(6) == 0 {
			careful(round, rng.IntN(40))
		}
		// the batch's decisions
		m := 2 + rng.IntN(30)
		if rng.IntN(8) == 0 {
			m = 64 + rng.IntN(DefaultMaxBatch-63)
		}
		own := rng.IntN(8) == 0
		type decision struct {
			checks []limits.Check
			now    int64
		}
		ds := make([]decision, m)
		for i := range ds {
			n := randomChecks(rng, len(pool))
			if n > 12 && m > 40 {
				n = 1 + rng.IntN(4) // long batches of short requests: keep the test short
			}
			seen := map[int]bool{}
			for len(ds[i].checks) < n {
				at := pick()
				if rng.IntN(4) == 0 || n > 8 {
					at = rng.IntN(len(pool))
				}
				if seen[at] {
					continue
				}
				seen[at] = true
				k := pool[at]
				r := k.rule
				if rng.IntN(7) == 0 {
					// the same key under another rule in this batch
					v := randomRule(rng, r.algo)
					if r.algo == limits.SlidingLog {
						v.period = r.period
					}
					r = v
				}
				ds[i].checks = append(ds[i].checks, limits.Check{Key: k.name, Algorithm: r.algo, Limit: r.limit,
					PeriodUS: r.period, Burst: r.burst, Cost: randomCost(rng, r), Shadow: rng.IntN(8) == 0})
			}
			if len(ds[i].checks) > 12 {
				manyChecks++
			}
		}
		guarded := guard(round)
		if own {
			// one decision (or a few) at an instant of its own: the call
			// holds no key
			for range 1 + rng.IntN(2) {
				ds[rng.IntN(m)].now = time.Now().UnixMicro()
			}
		}
		store := byFcall
		if rng.IntN(3) == 0 {
			store = byEval
		}
		calls := make([]*scriptCall, m)
		for i, d := range ds {
			call := newCall(ctx)
			call.args = append(call.args, d.now)
			for _, c := range d.checks {
				c.Key = inSpace("m", c.Key)
				var err error
				if call.args, err = appendCheckArgs(call.args, &c); err != nil {
					t.Fatal(err)
				}
				call.keys = append(call.keys, c.Key)
			}
			calls[i] = call
		}
		if _, args, ok := scratch[store].args(calls); ok {
			// count the checks on held keys (the scratch is rebuilt by send)
			held += heldBits(args)
		}
		store.co.send(store.co.client.Pipeline(), calls, nil, scratch[store])
		type outcome struct {
			admitted, at int64
			results      []limits.Result
			err          error
		}
		got := make([]outcome, m)
		for i, call := range calls {
			reply, err, owned := call.wait()
			if !owned {
				t.Fatal("a call was abandoned")
			}
			got[i].results = make([]limits.Result, len(call.keys))
			if err == nil {
				got[i].admitted, got[i].at, err = callResults(call, reply, got[i].results)
			}
			got[i].err = err
			call.release()
			if err != nil {
				fail(round, "decision %d (%v): %v", i, ds[i].checks, err)
			}
		}
		// one by one, in the batch's order, at the instants it reports: in
		// one MULTI, so that Redis expires nothing while they run (it
		// reads its clock once for a transaction, as for a script), as
		// nothing expires while the batch's one call runs
		pipe := client.TxPipeline()
		cmds := make([]*redis.Cmd, m)
		for i, d := range ds {
			keys := make([]string, len(d.checks))
			args := []any{got[i].at}
			for j, c := range d.checks {
				keys[j] = inSpace("o", c.Key)
				var err error
				if args, err = appendCheckArgs(args, &c); err != nil {
					t.Fatal(err)
				}
			}
			cmds[i] = pipe.FCall(ctx, lib.Decide, keys, args...)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			fail(round, "one by one: %v", err)
		}
		if took := time.Since(guarded); took > margin-10*time.Millisecond {
			fail(round, "the batch and its decisions one by one took %v, too long to compare (a busy machine?)", took)
		} else if took > slowest {
			slowest = took
		}
		way := "FCALL DecideMany"
		if store == byEval {
			way = "EVALSHA DecideManyScript"
		}
		for i, d := range ds {
			reply, err := cmds[i].Result()
			if err != nil {
				fail(round, "decision %d alone (%v): %v", i, d.checks, err)
			}
			want := make([]limits.Result, len(d.checks))
			wadm, _, err := parseReply(reply, 2, want)
			if err != nil {
				fail(round, "decision %d alone: %v", i, err)
			}
			mres := make([]limits.Result, len(d.checks))
			madm, err := mem.Decide(ctx, &limits.Batch{Checks: d.checks, NowUS: got[i].at}, mres)
			if err != nil {
				fail(round, "memory store: %v", err)
			}
			if got[i].admitted != wadm || !sameResults(got[i].results, want) {
				fail(round, "%s, decision %d of %d at %d, checks %s:\n batch:      admitted %d %v\n one by one: admitted %d %v%s",
					way, i, m, got[i].at, describeChecks(d.checks), got[i].admitted, got[i].results, wadm, want,
					earlier(mismatched(d.checks, got[i].results, want), i, func(j int) ([]limits.Check, int64, []limits.Result) {
						return ds[j].checks, got[j].admitted, got[j].results
					}))
			}
			if (wadm == 1) != madm || !sameResults(mres, want) {
				fail(round, "decision %d of %d at %d, checks %s:\n redis:  admitted %d %v\n memory: admitted %v %v",
					i, m, got[i].at, describeChecks(d.checks), wadm, want, madm, mres)
			}
			decisions++
			if wadm == 1 {
				admittedN++
			} else {
				denied++
			}
		}
		// the records the batch and the decisions one by one left
		touched := map[string]bool{}
		for _, d := range ds {
			for _, c := range d.checks {
				touched[c.Key] = true
			}
		}
		for name := range touched {
			km, ko := inSpace("m", name), inSpace("o", name)
			sm, so := testredis.KeyState(t, client, km), testredis.KeyState(t, client, ko)
			tm, to := client.PTTL(ctx, km).Val(), client.PTTL(ctx, ko).Val()
			if sm != so {
				// A record that expires within moments after the batch may
				// be gone from one space and not yet from the other (the
				// decisions one by one wrote it a little later).
				gone := func(s string, d time.Duration) bool { return s == "none" || d < 100*time.Millisecond }
				if !(gone(sm, tm) && gone(so, to)) {
					fail(round, "%s after the batch (%s): %s (PTTL %v), one by one: %s (PTTL %v)", name, way, sm, tm, so, to)
				}
				continue
			}
			if tm == -1 || to == -1 {
				fail(round, "%s has no expiry: PTTL %v after the batch, %v one by one", name, tm, to)
			}
			if (tm - to).Abs() > 100*time.Millisecond {
				fail(round, "%s: PTTL %v after the batch (%s), %v one by one", name, tm, way, to)
			}
		}
	}
	t.Logf("seed %d: %d batches, %d decisions (%d admitted, %d denied), %d checks on held keys, %d requests of over 12 checks, %v (the slowest batch and replay %v)",
		seed, rounds, decisions, admittedN, denied, held, manyChecks, time.Since(start).Round(time.Millisecond), slowest)
	if held < 1000 || denied < 200 || admittedN < 200 {
		t.Fatalf("the batches held %d checks and decided %d admitted, %d denied: too few to compare", held, admittedN, denied)
	}
}

// heldBits counts the checks DecideMany's arguments say the call holds.
func heldBits(args []any) int {
	m, r, c := args[0].(int), args[1].(int), args[2].(int)
	a := 3 + 6*r
	for range c {
		a += 1 + args[a].(int)
	}
	n := 0
	for range m {
		x, ok := args[a].(int64)
		if !ok {
			x = int64(args[a].(int))
		}
		if x < 0 {
			a += 2
			continue
		}
		a++
		for x >>= 16; x > 0; x >>= 1 {
			n += int(x & 1)
		}
	}
	return n
}

// sameResults reports a and b equal, result for result.
func sameResults(a, b []limits.Result) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// describeChecks is a request's checks in a line: key, algorithm, limit,
// period, burst, cost and S for a shadow.
func describeChecks(cs []limits.Check) string {
	var b strings.Builder
	for i, c := range cs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s L%d P%d B%d c%d", c.Key, c.Algorithm, c.Limit, c.PeriodUS, c.Burst, c.Cost)
		if c.Shadow {
			b.WriteString(" S")
		}
	}
	return b.String()
}

// earlier describes the decisions before decision i of a batch that name
// one of checks' keys (decision(j) is decision j's checks and what the
// batch answered), for a failure's message.
func earlier(checks []limits.Check, i int, decision func(j int) ([]limits.Check, int64, []limits.Result)) string {
	keys := map[string]bool{}
	for _, c := range checks {
		keys[c.Key] = true
	}
	var b strings.Builder
	for j := range i {
		cs, adm, rs := decision(j)
		for _, c := range cs {
			if keys[c.Key] {
				fmt.Fprintf(&b, "\n earlier decision %d: %s: admitted %d %v", j, describeChecks(cs), adm, rs)
				break
			}
		}
	}
	return b.String()
}

// mismatched is the checks whose results differ between a and b.
func mismatched(checks []limits.Check, a, b []limits.Result) []limits.Check {
	var out []limits.Check
	for i, c := range checks {
		if a[i] != b[i] {
			out = append(out, c)
		}
	}
	return out
}
