package storetest

import (
	"fmt"
	"math/big"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"

	"github.com/rategate/rategate/internal/testredis"
)

// Property tests for gcra and token_bucket: random timelines checked step by
// step against tiny reference models in exact rational arithmetic, written
// from docs/algorithms.md independently of the implementation, and run on both stores.
//
// Redis expires keys on its own clock while these timelines run on a fake
// one, so sequences that go to Redis use an interval T >= 1 s: every key a
// step writes then lives at least T (an admission always leaves at least one
// interval to refill) and outlives the milliseconds a sequence takes.

// gtCfg is one rule shape under test.
type gtCfg struct {
	L, P, B int64
	// minCost, when > 0, is the smallest non-zero cost a sequence uses: at
	// the extremes it keeps Redis TTLs well above the test's own run time.
	minCost int64
}

func (c gtCfg) String() string { return fmt.Sprintf("L=%d P=%dµs B=%d", c.L, c.P, c.B) }

func (c gtCfg) check(algo limits.Algorithm, key string) limits.Check {
	return limits.Check{Key: key, Algorithm: algo, Limit: c.L, PeriodUS: c.P, Burst: c.B}
}

// ---- exact rational helpers ----

func gtRatI(v int64) *big.Rat { return new(big.Rat).SetInt64(v) }

func gtRatFloor(x *big.Rat) int64 {
	q := new(big.Int).Div(x.Num(), x.Denom()) // Euclidean: floor for a positive divisor
	return q.Int64()
}

func gtRatCeil(x *big.Rat) int64 { return -gtRatFloor(new(big.Rat).Neg(x)) }

func gtRatAdd(a, b *big.Rat) *big.Rat { return new(big.Rat).Add(a, b) }
func gtRatSub(a, b *big.Rat) *big.Rat { return new(big.Rat).Sub(a, b) }
func gtRatMul(a, b *big.Rat) *big.Rat { return new(big.Rat).Mul(a, b) }
func gtRatQuo(a, b *big.Rat) *big.Rat { return new(big.Rat).Quo(a, b) }

// gtModel is a reference algorithm: decide answers without changing
// anything and returns the commit that an admission would perform.
type gtModel interface {
	decide(now, cost int64) (limits.Result, func())
}

// gcraModel: T = P/L, tau = B*T, tat = max(stored, now), new = tat + c*T,
// allow iff new - now <= tau. Times reported rounded up, remaining down.
type gcraModel struct {
	cfg gtCfg
	tat *big.Rat // nil until the first admission
}

func (m *gcraModel) decide(now, cost int64) (limits.Result, func()) {
	T := big.NewRat(m.cfg.P, m.cfg.L)
	tau := gtRatMul(T, gtRatI(m.cfg.B))
	n := gtRatI(now)
	tat := n
	if m.tat != nil && m.tat.Cmp(n) > 0 {
		tat = m.tat
	}
	d := gtRatSub(tat, n)
	left := func(x *big.Rat) int64 { return max(0, gtRatFloor(gtRatQuo(gtRatSub(tau, x), T))) }
	switch {
	case cost > m.cfg.B:
		return limits.Result{Remaining: left(d), ResetUS: gtRatCeil(d), RetryUS: limits.NeverFits}, nil
	case cost == 0:
		return limits.Result{Allowed: true, Remaining: left(d), ResetUS: gtRatCeil(d)}, nil
	}
	next := gtRatAdd(tat, gtRatMul(T, gtRatI(cost)))
	x := gtRatSub(next, n)
	if x.Cmp(tau) > 0 {
		return limits.Result{Remaining: left(d), ResetUS: gtRatCeil(d), RetryUS: gtRatCeil(gtRatSub(x, tau))}, nil
	}
	return limits.Result{Allowed: true, Remaining: left(x), ResetUS: gtRatCeil(x)}, func() { m.tat = next }
}

// tbModel: tokens_now = min(B, tokens + (now - ts)*L/P), starting full;
// allow iff tokens_now >= c, then tokens = tokens_now - c, ts = now.
type tbModel struct {
	cfg    gtCfg
	tokens *big.Rat // nil = full, never written
	ts     int64
}

func (m *tbModel) decide(now, cost int64) (limits.Result, func()) {
	full := gtRatI(m.cfg.B)
	T := big.NewRat(m.cfg.P, m.cfg.L)
	tok := full
	if m.tokens != nil {
		tok = gtRatAdd(m.tokens, gtRatQuo(gtRatI(now-m.ts), T))
		if tok.Cmp(full) > 0 {
			tok = full
		}
	}
	untilFull := func(x *big.Rat) int64 { return gtRatCeil(gtRatMul(gtRatSub(full, x), T)) }
	switch {
	case cost > m.cfg.B:
		return limits.Result{Remaining: gtRatFloor(tok), ResetUS: untilFull(tok), RetryUS: limits.NeverFits}, nil
	case cost == 0:
		return limits.Result{Allowed: true, Remaining: gtRatFloor(tok), ResetUS: untilFull(tok)}, nil
	case tok.Cmp(gtRatI(cost)) < 0:
		return limits.Result{Remaining: gtRatFloor(tok), ResetUS: untilFull(tok), RetryUS: gtRatCeil(gtRatMul(gtRatSub(gtRatI(cost), tok), T))}, nil
	}
	after := gtRatSub(tok, gtRatI(cost))
	return limits.Result{Allowed: true, Remaining: gtRatFloor(after), ResetUS: untilFull(after)}, func() { m.tokens, m.ts = after, now }
}

func gtNewModel(algo limits.Algorithm, cfg gtCfg) gtModel {
	if algo == limits.GCRA {
		return &gcraModel{cfg: cfg}
	}
	return &tbModel{cfg: cfg}
}

// ---- random timelines ----

// gtStep is one request of a random timeline, at now = start + at.
type gtStep struct {
	at, cost int64
}

// gtSequence draws n requests. Advances favour the places where rounding
// bugs live: zero (bursts), exact multiples of T and one µs either side, and
// the reference model's own retry and reset times, ±1 µs; sometimes a jump
// past a full refill. The model (a fresh one of algo) resolves those.
func gtSequence(rng *rand.Rand, n int, algo limits.Algorithm, cfg gtCfg) []gtStep {
	m := gtNewModel(algo, cfg)
	tau := new(big.Int).Mul(big.NewInt(cfg.B), big.NewInt(cfg.P))
	tau.Div(tau, big.NewInt(cfg.L))
	full := max(1, tau.Int64()) // B*T rounded down, at least 1 µs
	kT := func(k int64) int64 {
		x := new(big.Int).Mul(big.NewInt(k), big.NewInt(cfg.P))
		return x.Div(x, big.NewInt(cfg.L)).Int64()
	}
	lo := max(1, cfg.minCost)
	var last limits.Result
	steps := make([]gtStep, 0, n)
	at := int64(0)
	for i := 0; i < n; i++ {
		var adv int64
		switch p := rng.Intn(100); {
		case p < 30:
			adv = 0
		case p < 45:
			adv = rng.Int63n(kT(2) + 2)
		case p < 60:
			adv = max(0, kT(1+rng.Int63n(min(cfg.B, 4)))+rng.Int63n(3)-1)
		case p < 75:
			if last.RetryUS > 0 {
				adv = max(0, last.RetryUS+rng.Int63n(3)-1)
			}
		case p < 82:
			adv = max(0, last.ResetUS+rng.Int63n(3)-1)
		case p < 94:
			adv = rng.Int63n(full + 1)
		default:
			adv = full + rng.Int63n(2*full+1)
		}
		at += adv
		var cost int64
		switch p := rng.Intn(100); {
		case p < 55:
			cost = lo
		case p < 65:
			cost = 0
		case p < 95:
			cost = lo + rng.Int63n(max(1, cfg.B-lo+1))
		default:
			cost = cfg.B + 1
		}
		cost = min(cost, cfg.B+1)
		r, commit := m.decide(at, cost)
		if r.Allowed && cost > 0 {
			commit()
		}
		last = r
		steps = append(steps, gtStep{at: at, cost: cost})
	}
	return steps
}

// gtRun runs steps against s from start and returns every result.
func gtRun(t *testing.T, s limits.Store, c limits.Check, start int64, steps []gtStep) []limits.Result {
	t.Helper()
	out := make([]limits.Result, len(steps))
	for i, st := range steps {
		c.Cost = st.cost
		out[i] = DecideOne(t, s, c, start+st.at)
	}
	return out
}

// gtHistory formats the first n+1 steps of a failing timeline.
func gtHistory(steps []gtStep, got []limits.Result, n int) string {
	var sb strings.Builder
	for i := 0; i <= n && i < len(steps); i++ {
		fmt.Fprintf(&sb, "\n  %2d t=+%dµs cost=%d -> %+v", i, steps[i].at, steps[i].cost, got[i])
	}
	return sb.String()
}

// gtCheckModel fails at the first step where got differs from algo's model.
func gtCheckModel(t *testing.T, what string, algo limits.Algorithm, cfg gtCfg, steps []gtStep, got []limits.Result) {
	t.Helper()
	m := gtNewModel(algo, cfg)
	for i, st := range steps {
		want, commit := m.decide(st.at, st.cost)
		if got[i] != want {
			t.Fatalf("%s: %s %v step %d: got %+v, model says %+v; history:%s", what, algo, cfg, i, got[i], want, gtHistory(steps, got, i))
		}
		if want.Allowed && st.cost > 0 {
			commit()
		}
	}
}

// gtCheckConservative fails if got ever admits what the exact bucket, fed
// the same admissions, would not, or reports more tokens than it holds.
func gtCheckConservative(t *testing.T, what string, cfg gtCfg, steps []gtStep, got []limits.Result) {
	t.Helper()
	m := &tbModel{cfg: cfg}
	for i, st := range steps {
		want, commit := m.decide(st.at, st.cost)
		// Remaining is compared only under the same verdict: an admission
		// reports what is left after it, a denial what is there.
		if got[i].Allowed && !want.Allowed || got[i].Allowed == want.Allowed && got[i].Remaining > want.Remaining {
			t.Fatalf("%s: token_bucket %v step %d: got %+v, exact bucket %+v; history:%s", what, cfg, i, got[i], want, gtHistory(steps, got, i))
		}
		if got[i].Allowed && st.cost > 0 {
			commit()
		}
	}
}

// gtSameResults fails at the first step where two runs differ.
func gtSameResults(t *testing.T, what string, steps []gtStep, a, b []limits.Result) {
	t.Helper()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("%s: step %d differs: %+v vs %+v; history:%s", what, i, a[i], b[i], gtHistory(steps, a, i))
		}
	}
}

// gtStores is a memory store whose janitor never runs during a test (it
// sweeps on the real clock, which the fake timelines run ahead of or behind)
// and a Redis store on a fresh redis-server.
func gtStores(t *testing.T) (*memstore.Store, *redisstore.Store) {
	t.Helper()
	m := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { m.Close() })
	srv := testredis.Start(t)
	rs, err := redisstore.New(srv.Client(t), "redis "+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	return m, rs
}

// Interval shapes. Whole T: the token bucket is exact. Fractional T: gcra is
// still exact, the token bucket conservative. "redis" shapes have T >= 1 s.
var (
	gtWholeMemory = []gtCfg{
		{L: 1, P: 1_000_000, B: 5},   // redis-cell's vectors
		{L: 10, P: 30, B: 4},         // T = 3 µs: boundaries every few µs
		{L: 3, P: 21, B: 1},          // T = 7 µs, no burst
		{L: 1000, P: 1000, B: 50},    // T = 1 µs
		{L: 2000, P: 1000, B: 30},    // T = 0.5 µs: a µs refills 2 whole tokens
		{L: 4, P: 1_200_000, B: 100}, // T = 0.3 s, deep bucket
	}
	gtWholeRedis = []gtCfg{
		{L: 1, P: 1_000_000, B: 5},
		{L: 5, P: 10_000_000, B: 5},
		{L: 4, P: 12_000_000, B: 7},
	}
	gtFractionalMemory = []gtCfg{
		{L: 3, P: 10, B: 5},                 // T = 3.33 µs
		{L: 3, P: 2, B: 10},                 // T = 0.67 µs
		{L: 7, P: 1_000_000, B: 3},          // T = 142857.14 µs
		{L: 999_983, P: 1_000_000, B: 1000}, // T just over 1 µs
	}
	gtFractionalRedis = []gtCfg{
		{L: 3, P: 10_000_000, B: 4}, // T = 3.33 s
		{L: 7, P: 10_000_000, B: 3}, // T = 1.43 s
	}
)

const (
	gtSteps        = 60
	gtMemorySeqs   = 60 // per shape and algorithm
	gtRedisSeqsPer = 8  // per shape and algorithm
)

// gtAgainstModel runs random timelines of algo: many on memory alone, and on
// the Redis shapes the same timelines on both stores, compared with each
// other step by step. check judges each run.
func gtAgainstModel(t *testing.T, algo limits.Algorithm, memShapes, redisShapes []gtCfg,
	check func(t *testing.T, what string, cfg gtCfg, steps []gtStep, got []limits.Result)) {
	seed := Seed(t)
	mem, rs := gtStores(t)
	start := time.Now().UnixMicro()
	for si, cfg := range memShapes {
		for i := 0; i < gtMemorySeqs; i++ {
			s := seed + int64(si*100_000+i)
			steps := gtSequence(rand.New(rand.NewSource(s)), gtSteps, algo, cfg)
			c := cfg.check(algo, fmt.Sprintf("rg:{gt:%d:%d:%d}:%s", s, si, i, algo.Suffix()))
			check(t, fmt.Sprintf("memory, sequence seed %d", s), cfg, steps, gtRun(t, mem, c, start, steps))
		}
	}
	for si, cfg := range redisShapes {
		for i := 0; i < gtRedisSeqsPer; i++ {
			s := seed + int64(si*100_000+i) + 50_000
			steps := gtSequence(rand.New(rand.NewSource(s)), gtSteps, algo, cfg)
			c := cfg.check(algo, fmt.Sprintf("rg:{gt:r:%d:%d:%d}:%s", s, si, i, algo.Suffix()))
			fromRedis := gtRun(t, rs, c, start, steps)
			fromMemory := gtRun(t, mem, c, start, steps)
			what := fmt.Sprintf("sequence seed %d", s)
			gtSameResults(t, what+", redis vs memory "+cfg.String(), steps, fromRedis, fromMemory)
			check(t, "redis, "+what, cfg, steps, fromRedis)
		}
	}
}

func TestGCRAMatchesModel(t *testing.T) {
	exact := func(t *testing.T, what string, cfg gtCfg, steps []gtStep, got []limits.Result) {
		gtCheckModel(t, what, limits.GCRA, cfg, steps, got)
	}
	gtAgainstModel(t, limits.GCRA, append(append([]gtCfg{}, gtWholeMemory...), gtFractionalMemory...),
		append(append([]gtCfg{}, gtWholeRedis...), gtFractionalRedis...), exact)
}

func TestTokenBucketMatchesModel(t *testing.T) {
	gtAgainstModel(t, limits.TokenBucket, gtWholeMemory, gtWholeRedis,
		func(t *testing.T, what string, cfg gtCfg, steps []gtStep, got []limits.Result) {
			gtCheckModel(t, what, limits.TokenBucket, cfg, steps, got)
		})
}

// With a fractional T the token bucket drops under a µs of refill per
// admission: it may deny what the exact bucket admits, never the reverse.
func TestTokenBucketFractionalNeverAdmitsMore(t *testing.T) {
	gtAgainstModel(t, limits.TokenBucket, gtFractionalMemory, gtFractionalRedis, gtCheckConservative)
}

// gcra and token_bucket are the same limiter when T is whole: the same
// timelines give the same results, field by field, on both stores.
func TestGCRATokenBucketEquivalent(t *testing.T) {
	seed := Seed(t)
	mem, rs := gtStores(t)
	start := time.Now().UnixMicro()
	run := func(s limits.Store, name string, si, i int, cfg gtCfg, seqs int64) {
		sd := seed + int64(si*100_000+i) + seqs
		steps := gtSequence(rand.New(rand.NewSource(sd)), gtSteps, limits.GCRA, cfg)
		key := fmt.Sprintf("rg:{eq:%d:%d:%d}:", sd, si, i)
		g := gtRun(t, s, cfg.check(limits.GCRA, key+"gc"), start, steps)
		b := gtRun(t, s, cfg.check(limits.TokenBucket, key+"tb"), start, steps)
		gtSameResults(t, fmt.Sprintf("%s, sequence seed %d, gcra vs token_bucket %v", name, sd, cfg), steps, g, b)
	}
	for si, cfg := range gtWholeMemory {
		for i := 0; i < gtMemorySeqs; i++ {
			run(mem, "memory", si, i, cfg, 0)
		}
	}
	for si, cfg := range gtWholeRedis {
		for i := 0; i < gtRedisSeqsPer/2; i++ {
			run(rs, "redis", si, i, cfg, 50_000)
		}
	}
}

// The validated extremes (P <= 400 days, L, B <= 1e9, B*P/L <= 400 days) with
// now at the current time: decisions stay exact on both stores.
func TestGCRATokenBucketExtremes(t *testing.T) {
	const day = int64(24 * time.Hour / time.Microsecond)
	const p400 = 400 * day
	type shape struct {
		cfg   gtCfg
		redis bool // T or minCost keep Redis TTLs >= 30 ms
		exact bool // token_bucket exact (T whole, or a µs refills whole tokens)
	}
	shapes := []shape{
		{gtCfg{L: 1, P: p400, B: 1}, true, true},                                         // T = 400 days
		{gtCfg{L: 1e9, P: p400, B: 1e9, minCost: 1000}, true, true},                      // T = 34560 µs, tau = 400 days
		{gtCfg{L: 1e9, P: 1000, B: 1e9}, false, true},                                    // T = 1e-6 µs, tau = 1 ms
		{gtCfg{L: 1e9, P: 1_000_000, B: 1e9, minCost: 3e8}, true, true},                  // T = 1e-3 µs, tau = 1 s
		{gtCfg{L: 999_999_937, P: p400, B: 999_999_937, minCost: 1000}, true, false},     // T = 34560.002 µs
		{gtCfg{L: 999_999_937, P: 1_000_003, B: 999_999_937, minCost: 3e8}, true, false}, // T ≈ 1.000003e-3 µs
		{gtCfg{L: 7, P: p400, B: 7}, true, false},                                        // T = 57.14 days
	}
	seed := Seed(t)
	mem, rs := gtStores(t)
	start := time.Now().UnixMicro()
	for si, sh := range shapes {
		for _, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
			judge := func(what string, steps []gtStep, got []limits.Result) {
				if algo == limits.TokenBucket && !sh.exact {
					gtCheckConservative(t, what, sh.cfg, steps, got)
				} else {
					gtCheckModel(t, what, algo, sh.cfg, steps, got)
				}
			}
			for i := 0; i < 30; i++ {
				s := seed + int64(si*100_000+i)
				steps := gtSequence(rand.New(rand.NewSource(s)), 40, algo, sh.cfg)
				c := sh.cfg.check(algo, fmt.Sprintf("rg:{ext:%d:%d:%d}:%s", s, si, i, algo.Suffix()))
				fromMemory := gtRun(t, mem, c, start, steps)
				judge(fmt.Sprintf("memory, sequence seed %d", s), steps, fromMemory)
				if sh.redis && i < 3 {
					fromRedis := gtRun(t, rs, c, start, steps)
					gtSameResults(t, fmt.Sprintf("sequence seed %d, redis vs memory %s %v", s, algo, sh.cfg), steps, fromRedis, fromMemory)
				}
			}
		}
	}
}

// A rule's limit, period or burst can change while keys written under the
// old values live on (a config reload): both stores must still agree step by
// step, and a bucket never reports more than its new burst.
func TestGCRATokenBucketRuleChange(t *testing.T) {
	seed := Seed(t)
	mem, rs := gtStores(t)
	start := time.Now().UnixMicro()
	phases := []gtCfg{
		{L: 7, P: 10_000_000, B: 6},   // TAT fractions in 1/7 µs
		{L: 3, P: 10_000_000, B: 2},   // ... read with L = 3: fractions >= L
		{L: 20, P: 10_000_000, B: 10}, // a larger burst
		{L: 1, P: 1_000_000, B: 1},
	}
	for _, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
		for i := 0; i < 10; i++ {
			s := seed + int64(i)
			rng := rand.New(rand.NewSource(s))
			key := fmt.Sprintf("rg:{chg:%d:%d}:%s", s, i, algo.Suffix())
			at := int64(0)
			var steps []gtStep
			var got []limits.Result
			// the key's TTL on the test's clock, and the steps lost to
			// Redis's own (the decisions are lockstep's, without its
			// replay of the TTL)
			ls := newLockstep(t, mem, rs, key)
			for _, cfg := range phases {
				part := gtSequence(rng, 15, algo, cfg)
				c := cfg.check(algo, key)
				for j := range part {
					part[j].at += at
				}
				// the next rule reads this one's state at once, or a little later
				at = part[len(part)-1].at + rng.Int63n(2)*rng.Int63n(cfg.P/cfg.L)
				a := make([]limits.Result, len(part))
				b := make([]limits.Result, len(part))
				for j, st := range part {
					now := start + st.at
					// Redis expires keys on its own clock, which this fake
					// one outruns: drop the key where memory has, as Redis
					// would by then. (A key that expires full under a
					// smaller burst is full again only once it is gone.)
					what := fmt.Sprintf("sequence seed %d, %s %v", s, algo, cfg)
					ls.beforeRedis(c, now, false, what)
					c.Cost = st.cost
					sent := time.Now()
					a[j] = DecideOne(t, rs, c, now)
					gone := ls.afterRedis(now, sent)
					b[j] = DecideOne(t, mem, c, now)
					if gone != 0 && mem.HoldsAt(key, now) {
						forget(t, mem, c, &ls.lost, what, gone)
					}
				}
				steps, got = append(steps, part...), append(got, a...)
				gtSameResults(t, fmt.Sprintf("sequence seed %d, redis vs memory %s %v", s, algo, cfg), part, a, b)
				for j, r := range a {
					if r.Remaining > cfg.B {
						t.Fatalf("sequence seed %d, %s %v: remaining %d above the burst; history:%s", s, algo, cfg, r.Remaining, gtHistory(steps, got, len(steps)-len(a)+j))
					}
				}
			}
		}
	}
}
