package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"

	"github.com/rategate/rategate/internal/testredis"
)

// Randomized rule changes: the numbers of a rule change between phases of a
// random timeline while its key lives on. Both stores must give the same
// answer at every step, for every algorithm (each script and its Go twin
// read, convert and rewrite a record written under other numbers alike);
// and sliding_log, whose reference model keeps the whole history, must
// match the model whatever its limit does.

// changeShape is one phase's rule.
type changeShape struct {
	limit, period, burst int64
}

var changePeriods = []time.Duration{time.Second, 5 * time.Second, 7*time.Second + 123*time.Microsecond, time.Minute}

func randomShape(rng *rand.Rand, algo limits.Algorithm, period int64) changeShape {
	s := changeShape{limit: 1 + rng.Int64N(12), period: period}
	if period == 0 {
		s.period = limits.PeriodUS(changePeriods[rng.IntN(len(changePeriods))])
	}
	s.burst = s.limit
	if algo.UsesBurst() {
		s.burst = 1 + rng.Int64N(15)
	}
	return s
}

// changeSteps returns n (advance µs, cost) steps for a phase under s: the
// same µs, small steps, fractions of the period, whole periods.
func changeSteps(rng *rand.Rand, s changeShape, n int) (adv, cost []int64) {
	adv, cost = make([]int64, n), make([]int64, n)
	for i := range adv {
		switch r := rng.IntN(10); {
		case r < 3:
		case r < 6:
			adv[i] = 1 + rng.Int64N(s.period/20)
		case r < 9:
			adv[i] = rng.Int64N(s.period)
		default:
			adv[i] = s.period + rng.Int64N(s.period)
		}
		switch r := rng.IntN(20); {
		case r == 0:
			cost[i] = 0
		case r == 1:
			cost[i] = s.burst + 1
		case r < 14:
			cost[i] = 1
		default:
			cost[i] = 1 + rng.Int64N(s.burst)
		}
	}
	return adv, cost
}

// lockstep decides the same checks on the same key on Redis and in memory,
// on the test's own clock, and fails at the first answer they disagree on.
// Both stores expire the key on that clock: the memory store by its
// record's expiry, Redis by the TTL its scripts set, replayed on that
// clock: a decision that sets a TTL (Redis announces it as an "expire"
// keyspace event) makes the key expire that long after the decision's
// instant, one that keeps the TTL changes nothing. So a key Redis would
// drop before its counts stop counting makes the stores disagree at the
// next step. Every key Redis holds must have a TTL. (Not for sliding_log:
// its script reads the key's TTL to extend it, and compares a TTL that
// runs on Redis's clock with times on the test's; only the memory store's
// expiry drops its key.)
//
// Redis also runs each TTL on its own clock, which the test's outruns: a
// key given 2 ms (a record written a millisecond before its window ends)
// can be gone at the next step, a few ms later under -race, while on the
// test's clock it lives on. Such a step is lost to Redis's clock
// (goneEarly): the memory store forgets the key too, and both go on from
// there.
type lockstep struct {
	t       *testing.T
	mem     *memstore.Store
	rs      *redisstore.Store
	key     string
	sub     *redis.PubSub
	expires int64 // when Redis drops the key on the test's clock; 0: no key
	history []string
	lost    int // steps lost to Redis's clock
}

// maxLost bounds the steps of one timeline lost to Redis's clock: each
// needs a TTL of a few ms and a stall longer than it.
const maxLost = 3

// goneEarly reports whether Redis no longer holds key although on the
// test's clock its TTL (ending at expires, µs; 0: no key) has not run out
// at now. Nothing but Redis's own clock removes a key between two steps.
func goneEarly(t *testing.T, rs *redisstore.Store, key string, expires, now int64) bool {
	t.Helper()
	if expires == 0 || now >= expires {
		return false
	}
	n, err := rs.Client().Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 0
}

// redisExpiry returns when Redis drops key on the test's clock (0: no
// key), now being the instant of a decision sent at sent on the wall
// clock; the key's TTL as Redis reports it (-1: none, -2: no key); and
// the wall-clock time from sent to that report. A TTL the decision set
// runs on Redis's clock from the decision on: what is left of it plus the
// time since sent plus 1 ms (PTTL rounds down) is at least what was set.
// (A TTL set before keeps running on Redis's clock while the test's jumps
// ahead: from such a step the expiry is later than Redis's.)
func redisExpiry(t *testing.T, rs *redisstore.Store, key string, now int64, sent time.Time) (int64, time.Duration, time.Duration) {
	t.Helper()
	ttl, err := rs.Client().PTTL(context.Background(), key).Result()
	elapsed := time.Since(sent)
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 0 {
		return 0, ttl, elapsed
	}
	return now + (ttl + elapsed).Microseconds() + 1000, ttl, elapsed
}

// forget makes the memory store drop key as Redis did on its own clock
// (the caller saw that), and fails the test past maxLost such steps. by
// is when, on the test's clock, Redis's TTL ran out at the latest: a
// memory store that still holds the key then keeps it longer than the TTL
// Redis was given, which lets a count go before it stops counting: a bug,
// not the clocks.
func forget(t *testing.T, mem *memstore.Store, c limits.Check, lost *int, what string, by int64) {
	t.Helper()
	if mem.HoldsAt(c.Key, by) {
		t.Fatalf("%s: Redis dropped %s by %d on the test's clock, while the memory store holds it longer: a TTL shorter than its record", what, c.Key, by)
	}
	*lost++
	if *lost > maxLost {
		t.Fatalf("%s: Redis expired %s on its own clock in more than %d steps", what, c.Key, maxLost)
	}
	t.Logf("%s: Redis expired %s on its own clock, before the test's clock said: the memory store forgets it too", what, c.Key)
	if err := mem.Reset(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

// newLockstep returns a lockstep on key; the Redis store must be the only
// user of its server's keyspace events.
func newLockstep(t *testing.T, mem *memstore.Store, rs *redisstore.Store, key string) *lockstep {
	t.Helper()
	ctx := context.Background()
	client, ok := rs.Client().(*redis.Client)
	if !ok {
		t.Fatalf("lockstep needs a single Redis, not %T", rs.Client())
	}
	// g: "expire" when a command sets a TTL; x: "expired" when Redis
	// expires the key
	if err := client.ConfigSet(ctx, "notify-keyspace-events", "Kgx").Err(); err != nil {
		t.Fatal(err)
	}
	ps := client.Subscribe(ctx, "__keyspace@0__:"+key)
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	return &lockstep{t: t, mem: mem, rs: rs, key: key, sub: ps}
}

// events reports whether Redis set the key's TTL (set) and whether it
// expired the key on its own clock (expired) since the last call: it reads
// the key's events up to the answer to a PING sent now (Redis queued every
// event of a command it ran before it reads the PING).
func (ls *lockstep) events() (set, expired bool) {
	ls.t.Helper()
	ctx := context.Background()
	if err := ls.sub.Ping(ctx); err != nil {
		ls.t.Fatal(err)
	}
	for {
		msg, err := ls.sub.ReceiveTimeout(ctx, 5*time.Second)
		if err != nil {
			ls.t.Fatalf("keyspace events of %s: %v", ls.key, err)
		}
		switch m := msg.(type) {
		case *redis.Pong:
			return set, expired
		case *redis.Message:
			switch m.Payload {
			case "expire":
				set = true
			case "expired":
				expired = true
			}
		}
	}
}

// beforeRedis readies the key for a decision at now. Redis expires keys
// on its own clock, which the test's outruns: the key is dropped where
// memory has dropped it, and, with replay, where its TTL has run out on
// the test's clock (not for sliding_log); one Redis expired before the
// test's clock said is forgotten by memory too (goneEarly, forget).
func (ls *lockstep) beforeRedis(c limits.Check, now int64, replay bool, what string) {
	t := ls.t
	t.Helper()
	if (replay && ls.expires != 0 && now >= ls.expires && c.Algorithm != limits.SlidingLog) || !ls.mem.HoldsAt(ls.key, now) {
		if err := ls.rs.Reset(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		ls.expires = 0
	} else if goneEarly(t, ls.rs, ls.key, ls.expires, now) {
		forget(t, ls.mem, c, &ls.lost, what, ls.expires)
		ls.expires = 0
	}
}

// afterRedis follows the key's TTL after a decision at now sent at sent
// (the wall clock), and returns, when Redis expired the key on its own
// clock since the decision read it, when on the test's clock that TTL ran
// out at the latest (0: it did not). Every key Redis holds must have a
// TTL.
func (ls *lockstep) afterRedis(now int64, sent time.Time) int64 {
	t := ls.t
	t.Helper()
	expires, ttl, elapsed := redisExpiry(t, ls.rs, ls.key, now, sent)
	set, expired := ls.events()
	gone := int64(0)
	switch {
	case ttl == -1:
		t.Fatalf("%s has no TTL after step %d\nhistory:\n%s", ls.key, len(ls.history), joinLines(ls.history))
	case ttl < 0:
		if expired {
			// a TTL this step set ran out within elapsed; one set
			// before, at the expiry it was replayed to
			gone = now + elapsed.Microseconds() + 1000
			if !set && ls.expires != 0 {
				gone = ls.expires
			}
		}
		ls.expires = 0
	case set:
		// (The scripts round a TTL up to the ms: Redis may hold the key
		// up to 1 ms longer than its counts count.)
		ls.expires = expires
	}
	return gone
}

// step decides c (its key is ls.key) at now on both stores and returns
// the memory store's answer, once Redis gave the same.
func (ls *lockstep) step(c limits.Check, now int64) limits.Result {
	t := ls.t
	t.Helper()
	what := fmt.Sprintf("step %d", len(ls.history))
	ls.beforeRedis(c, now, true, what)
	sent := time.Now()
	onRedis := DecideOne(t, ls.rs, c, now)
	gone := ls.afterRedis(now, sent)
	inMemory := DecideOne(t, ls.mem, c, now)
	ls.history = append(ls.history, fmt.Sprintf("L=%d P=%d B=%d t=%d c=%d: %+v", c.Limit, c.PeriodUS, c.Burst, now, c.Cost, inMemory))
	if onRedis != inMemory {
		t.Fatalf("%s step %d: redis %+v, memory %+v\nhistory:\n%s", ls.key, len(ls.history)-1, onRedis, inMemory, joinLines(ls.history))
	}
	if gone != 0 && ls.mem.HoldsAt(ls.key, now) {
		forget(t, ls.mem, c, &ls.lost, what, gone)
	}
	return inMemory
}

func TestRuleChangeRedisMatchesMemory(t *testing.T) {
	seed := Seed(t)
	mem, rs := gtStores(t)
	for _, algo := range limits.Algorithms {
		t.Run(string(algo), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(len(algo))))
			for seq := 0; seq < 25; seq++ {
				ls := newLockstep(t, mem, rs, fmt.Sprintf("rg:{chg:%d}:%s", seq, algo.Suffix()))
				// ahead of the wall clock: the memory store's sweeper keeps every key
				now := time.Now().UnixMicro() + limits.PeriodUS(time.Hour)
				for ph := 0; ph < 5; ph++ {
					s := randomShape(rng, algo, 0)
					c := limits.Check{Key: ls.key, Algorithm: algo, Limit: s.limit, PeriodUS: s.period, Burst: s.burst}
					adv, cost := changeSteps(rng, s, 12)
					for i := range adv {
						now += adv[i]
						c.Cost = cost[i]
						if r := ls.step(c, now); r.Remaining < 0 || r.Remaining > s.burst {
							t.Fatalf("sequence %d: remaining %d outside [0, %d]\nhistory:\n%s", seq, r.Remaining, s.burst, joinLines(ls.history))
						}
					}
				}
			}
		})
	}
}

// TestSlidingWindowExpiryAfterPeriodChange: a sliding_window record
// rewritten under a shorter period holding only the previous count expires
// with the current window; a count admitted into it later in that window
// must make the record live on until that count stops counting (an expiry
// kept from the rewrite lost it at the window's end: the next window then
// admitted 5 where 4 fit).
func TestSlidingWindowExpiryAfterPeriodChange(t *testing.T) {
	mem, rs := gtStores(t)
	ls := newLockstep(t, mem, rs, "rg:{swexp:}:"+limits.SlidingWindow.Suffix())
	m := limits.PeriodUS(time.Minute)
	base := (time.Now().UnixMicro()/m + 60) * m // an hour ahead, on a minute
	s := limits.PeriodUS(time.Second)
	c := limits.Check{Key: ls.key, Algorithm: limits.SlidingWindow, Limit: 5, Burst: 5, Cost: 1, PeriodUS: m}
	for i := 0; i < 5; i++ {
		if !ls.step(c, base-10*s).Allowed {
			t.Fatalf("request %d of 5 denied", i+1)
		}
	}
	// 30 s from base on: the 5 are the previous count. At base+5s they
	// weigh 5*(1-5/30) = 4.17, so one more is denied (the record is
	// rewritten under 30 s, holding the previous count only); at base+12s
	// they weigh 3 and one is admitted, counted until base+60s.
	c.PeriodUS = 30 * s
	if ls.step(c, base+5*s).Allowed {
		t.Fatal("admitted at base+5s over 4.17 of 5")
	}
	if r := ls.step(c, base+12*s); !r.Allowed || r.ResetUS != 48*s {
		t.Fatalf("at base+12s: %+v, want admitted, reset 48s", r)
	}
	// Next window: that one weighs 1*(1-5/30) = 0.83, so 4 more fit, not 5.
	admitted := 0
	for range 6 {
		if ls.step(c, base+35*s).Allowed {
			admitted++
		}
	}
	if admitted != 4 {
		t.Fatalf("at base+35s: %d admitted, want 4", admitted)
	}
}

// TestSlidingLogLimitChangeMatchesModel: the limit of a sliding_log rule
// changes between phases (a lower one can leave more than L in the window,
// when a denial's retry has to find the entry that frees used + c - L, deep
// in the log); memory matches the reference model at every step, then Redis
// and memory in lockstep.
func TestSlidingLogLimitChangeMatchesModel(t *testing.T) {
	seed := Seed(t)
	run := func(t *testing.T, sequences int, stores ...limits.Store) {
		rng := rand.New(rand.NewPCG(uint64(seed), 11))
		denied, over := 0, 0
		defer func() {
			t.Logf("%d sequences: %d denials, %d of them with more than the limit in the window", sequences, denied, over)
			if over == 0 {
				t.Error("no denial found more than the limit in the window: the run did not exercise a lowered limit")
			}
		}()
		for seq := 0; seq < sequences; seq++ {
			p := limits.PeriodUS(changePeriods[rng.IntN(len(changePeriods))])
			key := fmt.Sprintf("rg:{slchg:%d}:sl2", seq)
			model := &slModel{period: p}
			now := time.Now().UnixMicro() + limits.PeriodUS(time.Hour)
			var history []string
			for ph := 0; ph < 5; ph++ {
				s := randomShape(rng, limits.SlidingLog, p)
				if ph%2 == 1 {
					s.limit = 20 + rng.Int64N(20)
				}
				model.limit = s.limit
				c := limits.Check{Key: key, Algorithm: limits.SlidingLog, Limit: s.limit, PeriodUS: p, Burst: s.limit}
				adv, cost := changeSteps(rng, s, 15)
				for i := range adv {
					now += adv[i]
					c.Cost = cost[i]
					used := int64(0)
					for _, e := range model.log {
						if e.at > now-p {
							used += e.cost
						}
					}
					want := model.decide(now, cost[i])
					if !want.Allowed {
						denied++
						if used > s.limit {
							over++
						}
					}
					history = append(history, fmt.Sprintf("L=%d +%d c=%d: %+v", s.limit, adv[i], cost[i], want))
					for _, st := range stores {
						if got := DecideOne(t, st, c, now); got != want {
							t.Fatalf("sequence %d phase %d step %d: %s %+v, model %+v\nhistory:\n%s", seq, ph, i, st.Name(), got, want, joinLines(history))
						}
					}
				}
			}
		}
	}
	t.Run("memory", func(t *testing.T) {
		m := memstore.NewSweeping(time.Hour)
		defer m.Close()
		run(t, 500, m)
	})
	t.Run("redis=memory", func(t *testing.T) {
		srv := testredis.Start(t)
		rs, err := redisstore.New(srv.Client(t), "redis "+srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		m := memstore.NewSweeping(time.Hour)
		defer m.Close()
		run(t, 30, rs, m)
	})
}

func joinLines(lines []string) string {
	out := ""
	for _, l := range lines {
		out += "  " + l + "\n"
	}
	return out
}
