package limits_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

var leaseSeedFlag = flag.Int64("lease.seed", 0, "seed for the lease property tests (0 = time-based)")

func leaseSeed(t *testing.T) int64 {
	seed := *leaseSeedFlag
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (replay with -lease.seed=%d)", seed, seed)
	return seed
}

// leasable lists the algorithms a rule can lease.
func leasable() []limits.Algorithm {
	var out []limits.Algorithm
	for _, a := range limits.Algorithms {
		if a.Leasable() {
			out = append(out, a)
		}
	}
	return out
}

// persistAll removes the TTL of keys, so that Redis, which expires keys on
// its own clock, keeps what a timeline on a driven clock still reads (the
// records carry their own times, see redisDCStore). It returns Redis's
// expired_keys count: when it grew, a key expired on Redis's clock before
// its TTL was removed, and the timeline lost state the other store keeps.
func persistAll(t *testing.T, c *redis.Client, keys ...string) int64 {
	t.Helper()
	ctx := context.Background()
	var info *redis.StringCmd
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Persist(ctx, k)
		}
		info = p.Info(ctx, "stats")
		return nil
	}); err != nil {
		t.Fatalf("persist: %v", err)
	}
	return infoField(t, info.Val(), "expired_keys")
}

// TestLeaseScriptMatchesTwin: random timelines of takes, returns, resets and
// looks, with ordinary decisions and rule changes in between, on one key of
// every leasable algorithm: lua/lease.lua on a real Redis and its Go twin
// (memlease.go) give the same answer to every call.
func TestLeaseScriptMatchesTwin(t *testing.T) {
	seed := leaseSeed(t)
	srv := testredis.Start(t)
	client := srv.Client(t)
	rs, err := redisstore.New(client, "redis "+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	mem := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { mem.Close() })
	ctx := context.Background()
	periods := []int64{1_000, 7_919, 100_000, 1_000_000, 60_000_000}

	for ai, algo := range leasable() {
		t.Run(string(algo), func(t *testing.T) {
			counts := map[string]int{}
			const rounds = 25
			for round := 0; round < rounds; round++ {
				rng := rand.New(rand.NewSource(seed + int64(ai*1000+round)))
				key := fmt.Sprintf("tw%d:{r%d:%d}:%s", seed%1000, ai, round, algo.Suffix())
				c := limits.Check{Key: key, Algorithm: algo}
				renumber := func() {
					c.PeriodUS = periods[rng.Intn(len(periods))]
					if rng.Intn(3) == 0 {
						c.PeriodUS = 500 + rng.Int63n(3_000_000)
					}
					c.Limit = 1 + rng.Int63n(20)
					c.Burst = c.Limit
					if algo.UsesBurst() {
						c.Burst = 1 + rng.Int63n(25)
					}
				}
				renumber()
				now := time.Now().UnixMicro() + rng.Int63n(1_000_000)
				var ids []string
				var log []string
				expired := persistAll(t, client)
				fail := func(format string, args ...any) {
					t.Helper()
					t.Fatalf("round %d, %s L=%d P=%d B=%d, at %d: %s\ntimeline:\n%s", round, algo, c.Limit, c.PeriodUS, c.Burst, now,
						fmt.Sprintf(format, args...), strings.Join(log, "\n"))
				}
				for step := 0; step < 150; step++ {
					switch x := rng.Intn(10); {
					case x < 4:
						now += rng.Int63n(c.PeriodUS/8 + 1)
					case x < 6:
						now = (now/c.PeriodUS+1)*c.PeriodUS + int64(rng.Intn(3)) - 1
					case x < 7:
						now += c.PeriodUS/2 + rng.Int63n(2*c.PeriodUS)
					case x < 8:
						now += rng.Int63n(3_000_000)
					}
					op := rng.Intn(20)
					switch {
					case op < 7:
						need := 1 + rng.Int63n(3)
						if rng.Intn(10) == 0 {
							need = c.Burst + 1
						}
						tk := limits.LeaseTake{Check: c, Want: need + rng.Int63n(12), ID: fmt.Sprintf("h%d-%d", rng.Intn(3), step),
							TTLUS: 1 + rng.Int63n(2*c.PeriodUS), NowUS: now}
						tk.Check.Cost = need
						for _, id := range ids {
							if rng.Intn(6) == 0 {
								tk.Settle = append(tk.Settle, id)
							}
						}
						gr, err1 := rs.TakeLease(ctx, &tk)
						gm, err2 := mem.TakeLease(ctx, &tk)
						log = append(log, fmt.Sprintf("%d take need %d want %d id %s settle %v: redis %+v memory %+v", now, need, tk.Want, tk.ID, tk.Settle, gr, gm))
						if err1 != nil || err2 != nil {
							fail("take: %v / %v", err1, err2)
						}
						if gr != gm {
							fail("take answers differ")
						}
						if gr.Granted > 0 {
							ids = append(ids, tk.ID)
							counts["granted"]++
						} else {
							counts["denied"]++
						}
					case op < 11 && len(ids) > 0:
						ret := limits.LeaseReturn{Check: c, NowUS: now}
						for _, id := range ids {
							if rng.Intn(3) == 0 {
								ret.Slices = append(ret.Slices, limits.SliceReturn{ID: id, Unspent: rng.Int63n(8)})
							}
						}
						br, err1 := rs.ReturnLease(ctx, &ret)
						bm, err2 := mem.ReturnLease(ctx, &ret)
						log = append(log, fmt.Sprintf("%d return %v: redis %d memory %d", now, ret.Slices, br, bm))
						if err1 != nil || err2 != nil {
							fail("return: %v / %v", err1, err2)
						}
						if br != bm {
							fail("return answers differ")
						}
						if br > 0 {
							counts["returned"]++
						}
					case op < 15:
						// Another instance, not leasing, decides the same key.
						dc := c
						dc.Cost = rng.Int63n(3)
						var r1, r2 [1]limits.Result
						a1, err1 := rs.Decide(ctx, &limits.Batch{Checks: []limits.Check{dc}, NowUS: now}, r1[:])
						a2, err2 := mem.Decide(ctx, &limits.Batch{Checks: []limits.Check{dc}, NowUS: now}, r2[:])
						log = append(log, fmt.Sprintf("%d decide cost %d: redis %v %+v memory %v %+v", now, dc.Cost, a1, r1[0], a2, r2[0]))
						if err1 != nil || err2 != nil {
							fail("decide: %v / %v", err1, err2)
						}
						if a1 != a2 || r1 != r2 {
							fail("decisions differ")
						}
					case op < 17:
						l1, err1 := rs.LookLease(ctx, c, now)
						l2, err2 := mem.LookLease(ctx, c, now)
						log = append(log, fmt.Sprintf("%d look: redis %+v memory %+v", now, l1, l2))
						if err1 != nil || err2 != nil {
							fail("look: %v / %v", err1, err2)
						}
						if !reflect.DeepEqual(l1, l2) {
							fail("looks differ")
						}
					case op < 18:
						err1 := rs.ResetLease(ctx, c, now)
						err2 := mem.ResetLease(ctx, c, now)
						log = append(log, fmt.Sprintf("%d reset", now))
						if err1 != nil || err2 != nil {
							fail("reset: %v / %v", err1, err2)
						}
						counts["reset"]++
					case op < 19:
						renumber()
						log = append(log, fmt.Sprintf("%d rule now L=%d P=%d B=%d", now, c.Limit, c.PeriodUS, c.Burst))
					}
					if n := persistAll(t, client, key, limits.LeaseKey(key)); n != expired {
						// Redis expired a key on its own clock (a TTL of a
						// millisecond or two): this round cannot go on.
						counts["lost"]++
						break
					}
					p1, err1 := rs.PeekAt(ctx, c, now)
					p2, err2 := mem.PeekAt(c, now)
					if err1 != nil || err2 != nil {
						fail("peek: %v / %v", err1, err2)
					}
					if p1 != p2 {
						raw := testredis.KeyState(t, client, key)
						log = append(log, fmt.Sprintf("%d peek: redis %+v memory %+v (redis holds %v)", now, p1, p2, raw))
						fail("peeks differ")
					}
				}
			}
			t.Logf("%s: %v", algo, counts)
			// A round is lost when Redis expires a key on its own clock
			// between a step and the PERSIST after it (TTLs of a
			// millisecond or two); a loaded machine (CI under -race) lost
			// 6 of 25. Half the rounds must run to their end.
			if counts["granted"] == 0 || counts["denied"] == 0 || counts["returned"] == 0 || counts["lost"] > rounds/2 {
				t.Fatalf("the timelines did not exercise takes, denials and returns, or lost too many rounds to Redis's clock: %v", counts)
			}
		})
	}
}
