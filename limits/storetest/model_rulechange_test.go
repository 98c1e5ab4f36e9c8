package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

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

func TestRuleChangeRedisMatchesMemory(t *testing.T) {
	seed := Seed(t)
	mem, rs := gtStores(t)
	ctx := context.Background()
	for _, algo := range limits.Algorithms {
		t.Run(string(algo), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(len(algo))))
			for seq := 0; seq < 25; seq++ {
				key := fmt.Sprintf("rg:{chg:%d}:%s", seq, algo.Suffix())
				// ahead of the wall clock: the memory store's sweeper keeps every key
				now := time.Now().UnixMicro() + limits.PeriodUS(time.Hour)
				var history []string
				for ph := 0; ph < 5; ph++ {
					s := randomShape(rng, algo, 0)
					c := limits.Check{Key: key, Algorithm: algo, Limit: s.limit, PeriodUS: s.period, Burst: s.burst}
					adv, cost := changeSteps(rng, s, 12)
					for i := range adv {
						now += adv[i]
						c.Cost = cost[i]
						// Redis expires keys on its own clock, which this one
						// outruns: drop the key where memory has, as Redis would.
						if !mem.HoldsAt(key, now) {
							if err := rs.Reset(ctx, c); err != nil {
								t.Fatal(err)
							}
						}
						onRedis := DecideOne(t, rs, c, now)
						inMemory := DecideOne(t, mem, c, now)
						history = append(history, fmt.Sprintf("L=%d P=%d B=%d +%d c=%d: %+v", s.limit, s.period, s.burst, adv[i], cost[i], inMemory))
						if onRedis != inMemory {
							t.Fatalf("sequence %d phase %d step %d: redis %+v, memory %+v\nhistory:\n%s", seq, ph, i, onRedis, inMemory, joinLines(history))
						}
						if inMemory.Remaining < 0 || inMemory.Remaining > s.burst {
							t.Fatalf("sequence %d: remaining %d outside [0, %d]\nhistory:\n%s", seq, inMemory.Remaining, s.burst, joinLines(history))
						}
					}
				}
			}
		})
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
			key := fmt.Sprintf("rg:{slchg:%d}:sl", seq)
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
