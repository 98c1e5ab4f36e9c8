package limits_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"
	"github.com/rategate/rategate/limits/storetest"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/race"
	"github.com/rategate/rategate/internal/testredis"
)

// dcStore is one store under the deny cache property test.
type dcStore struct {
	name  string
	store limits.Store
	// settle runs after every step that may have written to keys. It
	// reports whether the store lost state the timeline still counts on.
	settle func(t *testing.T, keys map[string]bool) (lost bool)
	// lostShare: at most steps/lostShare timelines may lose state (0: 50)
	// before the test says too little
	lostShare int
}

// redisDCStore is a real Redis for the property test. The timeline runs on
// a fake clock but Redis expires keys on its own, so settle removes the
// TTLs of every key the timeline touched (the scripts keep enough state to
// decide without them: window indexes, TATs, timestamps, scores) and
// reports a key that expired before that, which is Redis losing state the
// fake timeline still needs, not a cache error.
func redisDCStore(t *testing.T) dcStore {
	srv := testredis.Start(t)
	client := srv.Client(t)
	rs, err := redisstore.New(client, "redis "+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	var expired int64
	return dcStore{name: "redis", store: rs, settle: func(t *testing.T, keys map[string]bool) bool {
		ctx := context.Background()
		var info *redis.StringCmd
		_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k := range keys {
				p.Persist(ctx, k)
			}
			info = p.Info(ctx, "stats")
			return nil
		})
		if err != nil {
			t.Fatalf("persist: %v", err)
		}
		n := infoField(t, info.Val(), "expired_keys")
		lost := n != expired
		expired = n
		return lost
	}}
}

// clusterDCStore is a Redis Cluster for the property test: the mixed
// rules' keys are in different slots, so a request one slot denies after
// another admitted is refunded there (within the decision: the timeline's
// next step sees the refunded state). settle works as redisDCStore's, over
// every primary; the cluster is the test's own, since keys other tests
// let expire on a shared one would count as state this test lost.
func clusterDCStore(t *testing.T) dcStore {
	c := testredis.StartCluster(t)
	rs, err := redisstore.Open(redisstore.Options{ClusterAddrs: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	client := c.Client(t)
	var expired int64
	// Its settle reads three primaries, and under -race on a busy machine
	// more short-lived keys expire before it than on one Redis: 5%.
	return dcStore{name: "cluster", store: rs, lostShare: 20, settle: func(t *testing.T, keys map[string]bool) bool {
		ctx := context.Background()
		_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k := range keys {
				p.Persist(ctx, k)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("persist: %v", err)
		}
		var mu sync.Mutex
		var n int64
		err = client.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			info, err := node.Info(ctx, "stats").Result()
			if err != nil {
				return err
			}
			mu.Lock()
			n += infoField(t, info, "expired_keys")
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Fatalf("INFO stats: %v", err)
		}
		lost := n != expired
		expired = n
		return lost
	}}
}

func infoField(t *testing.T, info, field string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %q", field, v)
			}
			return n
		}
	}
	t.Fatalf("INFO has no %s", field)
	return 0
}

// dcPoint is a time worth landing on: a cached denial's last microsecond or
// its end, with the user and cost that were denied.
type dcPoint struct {
	at   int64
	user int
	cost int64
}

// dcStats counts what a timeline exercised.
type dcStats struct {
	steps, decided, denials, hits, lastMicro, others, lost int
}

func (s *dcStats) add(o dcStats) {
	s.steps += o.steps
	s.decided += o.decided
	s.denials += o.denials
	s.hits += o.hits
	s.lastMicro += o.lastMicro
	s.others += o.others
	s.lost += o.lost
}

var dcPeriods = []int64{1_000, 7_919, 100_000, 1_000_000, 60_000_000}

// dcRule returns a random rule for the property test.
func dcRule(rng *rand.Rand, name string, algo limits.Algorithm, key []limits.KeyPart, shadow bool) *limits.Rule {
	p := dcPeriods[rng.Intn(len(dcPeriods))]
	if rng.Intn(3) == 0 {
		p = 500 + rng.Int63n(5_000_000)
	}
	limit := 1 + rng.Int63n(8)
	burst := limit
	if algo.UsesBurst() {
		burst = 1 + rng.Int63n(10)
	}
	return &limits.Rule{Name: name, Key: key, Algorithm: algo, Limit: limit, Period: time.Duration(p) * time.Microsecond,
		Burst: burst, Cost: 1, Shadow: shadow}
}

func dcDescribe(rules []*limits.Rule) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "[%s %s L=%d P=%dµs B=%d shadow=%v] ", r.Name, r.Algorithm, r.Limit, limits.PeriodUS(r.Period), r.Burst, r.Shadow)
	}
	return b.String()
}

// dcTimeline runs one random timeline. Every request of "this instance" goes
// through a limiter with a deny cache; whenever the cache answers, the same
// request is put to the store through a limiter without one, which must deny
// it under the same rule and no sooner than the cache said. Some requests
// come from "another instance" (no cache) and consume behind the cache's back.
func dcTimeline(t *testing.T, rng *rand.Rand, s dcStore, prefix string, rules []*limits.Rule, steps int) dcStats {
	t.Helper()
	ctx := context.Background()
	cache := limits.NewDenyCache(1024)
	cached := limits.New(limits.Options{Store: s.store, Prefix: prefix, Rules: rules, DenyCache: cache})
	truth := limits.NewLimiter(s.store, prefix, rules)
	users := []string{"u0", "u1", "u2"}
	maxCost := int64(1)
	for _, r := range rules {
		maxCost = max(maxCost, r.Burst+1, r.Limit+1)
	}
	now := time.Now().UnixMicro() + rng.Int63n(1_000_000)
	keys := map[string]bool{}
	var points []dcPoint
	var last *dcPoint // the last request the store denied
	var st dcStats
	var d, dt limits.Decision
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s: rules %s\nstep %d at %d: %s", s.name, dcDescribe(rules), st.steps, now, fmt.Sprintf(format, args...))
	}
	for st.steps = 0; st.steps < steps; st.steps++ {
		user := rng.Intn(len(users))
		cost := int64(1)
		if rng.Intn(3) == 0 {
			cost = 1 + rng.Int63n(maxCost)
		}
		if last != nil && rng.Intn(3) == 0 {
			// A client that was just denied tries again, as clients do.
			user, cost = last.user, last.cost
		}
		// Move the clock (never backwards).
		switch x := rng.Intn(100); {
		case x < 30 && len(points) > 0:
			live := points[:0]
			for _, p := range points {
				if p.at > now {
					live = append(live, p)
				}
			}
			points = live
			if len(points) > 0 {
				p := points[rng.Intn(len(points))]
				now, user, cost = p.at, p.user, p.cost
			}
		case x < 45:
			// On, just before or just after a window boundary.
			p := limits.PeriodUS(rules[rng.Intn(len(rules))].Period)
			b := (now/p+1)*p + int64(rng.Intn(3)) - 1
			now = max(now, b)
		case x < 55:
		case x < 90:
			p := limits.PeriodUS(rules[rng.Intn(len(rules))].Period)
			now += rng.Int63n(p/4 + 1)
		default:
			p := limits.PeriodUS(rules[rng.Intn(len(rules))].Period)
			now += p/2 + rng.Int63n(2*p)
		}
		req := limits.Request{User: []byte(users[user]), Cost: cost}

		if rng.Intn(8) == 0 {
			st.others++
			if err := truth.DecideAt(ctx, &req, &dt, now); err != nil {
				fail("other instance: %v", err)
			}
			for _, v := range dt.Verdicts {
				keys[v.Key] = true
			}
		} else if err := cached.DecideAt(ctx, &req, &d, now); err != nil {
			fail("decide: %v", err)
		} else if d.Cached {
			st.hits++
			if d.Admitted || d.Denier < 0 || d.Denier >= len(d.Verdicts) || d.Verdicts[d.Denier].Rule.Shadow || d.Verdicts[d.Denier].Result.Allowed {
				fail("malformed cached decision %+v", d)
			}
			// Every matching rule is listed (the headers name them all):
			// the others as allowing (they were not asked), or as cached
			// denials of their own whose quota returns no later than the
			// denier's (the answer names the latest, as the store's does);
			// a shadow rule as the store last saw it (it only reports).
			for i, v := range d.Verdicts {
				if i != d.Denier && !v.Result.Allowed && !v.Rule.Shadow &&
					(v.Result.RetryUS == 0 || limits.RetryLater(v.Result.RetryUS, d.Verdicts[d.Denier].Result.RetryUS)) {
					fail("cached decision: rule %q not the denier, not allowing, and not an earlier cached denial: %+v", v.Rule.Name, d)
				}
			}
			cv := d.Verdicts[d.Denier]
			if cv.Result.RetryUS == 1 {
				st.lastMicro++
			}
			if err := truth.DecideAt(ctx, &req, &dt, now); err != nil {
				fail("truth: %v", err)
			}
			if dt.Admitted {
				fail("the cache denied user %s cost %d under %q (retry %dµs) but the store admits it: %+v",
					users[user], cost, cv.Rule.Name, cv.Result.RetryUS, dt.Verdicts)
			}
			found := false
			for _, tv := range dt.Verdicts {
				if tv.Rule != cv.Rule {
					continue
				}
				found = true
				tr, cr := tv.Result.RetryUS, cv.Result.RetryUS
				switch {
				case tv.Result.Allowed:
					fail("the cache denied under %q, the store's rule allows: %+v", cv.Rule.Name, dt.Verdicts)
				case cr == limits.NeverFits && tr != limits.NeverFits:
					fail("the cache says cost %d never fits %q, the store says retry in %dµs", cost, cv.Rule.Name, tr)
				case tr != limits.NeverFits && cr > tr:
					fail("the cache says retry in %dµs under %q, the store %dµs", cr, cv.Rule.Name, tr)
				}
			}
			if !found {
				fail("the cached rule %q is not among the store's verdicts", cv.Rule.Name)
			}
		} else {
			st.decided++
			if !d.Admitted {
				st.denials++
				last = &dcPoint{user: user, cost: cost}
			}
			for _, v := range d.Verdicts {
				keys[v.Key] = true
				if !v.Result.Allowed && !v.Rule.Shadow && !d.Admitted && v.Result.RetryUS > 0 {
					end := now + v.Result.RetryUS
					points = append(points, dcPoint{end - 1, user, cost}, dcPoint{end, user, cost})
				}
			}
		}
		if s.settle != nil && s.settle(t, keys) {
			// Redis expired a key on its own clock: it forgot state the
			// timeline still counts on, and so must the cache.
			cache.Clear()
			st.lost++
		}
	}
	return st
}

// TestDenyCacheNeverDeniesWhatStoreAdmits is the deny cache's exactness
// proof by random timelines: every algorithm alone, and mixed rule sets
// (per-user, global and shadow rules together), on the memory store and on
// a real Redis, with other instances consuming and clocks landing on window
// boundaries and on the last microsecond and the end of cached denials.
func TestDenyCacheNeverDeniesWhatStoreAdmits(t *testing.T) {
	seed := storetest.Seed(t)
	user := []limits.KeyPart{{Kind: limits.KeyUser}}

	type config struct {
		name  string
		rules func(rng *rand.Rand) []*limits.Rule
	}
	var configs []config
	for _, a := range limits.Algorithms {
		configs = append(configs, config{string(a), func(rng *rand.Rand) []*limits.Rule {
			return []*limits.Rule{dcRule(rng, "per-user", a, user, false)}
		}})
	}
	configs = append(configs, config{"mixed", func(rng *rand.Rand) []*limits.Rule {
		pick := func() limits.Algorithm { return limits.Algorithms[rng.Intn(len(limits.Algorithms))] }
		rules := []*limits.Rule{
			dcRule(rng, "per-user", pick(), user, false),
			dcRule(rng, "global", pick(), nil, false),
			dcRule(rng, "shadow", pick(), user, true),
		}
		rules[1].Limit += 4 // shared by every user
		if !rules[1].Algorithm.UsesBurst() {
			rules[1].Burst = rules[1].Limit
		}
		rng.Shuffle(len(rules), func(i, j int) { rules[i], rules[j] = rules[j], rules[i] })
		return rules
	}})

	memory := func(t *testing.T) dcStore {
		m := memstore.NewSweeping(time.Hour)
		t.Cleanup(func() { m.Close() })
		return dcStore{name: "memory", store: m}
	}
	for _, sc := range []struct {
		name          string
		open          func(t *testing.T) dcStore
		rounds, steps int
	}{
		{"memory", memory, 40, 400},
		{"redis", redisDCStore, 6, 300},
		{"cluster", clusterDCStore, 6, 300},
	} {
		t.Run(sc.name, func(t *testing.T) {
			s := sc.open(t)
			var all dcStats
			for ci, c := range configs {
				t.Run(c.name, func(t *testing.T) {
					var sum dcStats
					for round := 0; round < sc.rounds; round++ {
						rng := rand.New(rand.NewSource(seed + int64(ci*1000+round)))
						prefix := fmt.Sprintf("dc%d-%d-%d", seed%1000, ci, round)
						sum.add(dcTimeline(t, rng, s, prefix, c.rules(rng), sc.steps))
					}
					t.Logf("%d steps: %d decided by the store (%d denied), %d answered by the cache (%d in their last µs), %d by other instances; %d lost-state resets",
						sum.steps, sum.decided, sum.denials, sum.hits, sum.lastMicro, sum.others, sum.lost)
					// Not vacuous: the cache must answer a fair share of
					// the requests the store would otherwise deny.
					if sum.hits < sum.steps/20 || sum.hits < 20 {
						t.Errorf("only %d of %d requests answered by the cache", sum.hits, sum.steps)
					}
					share := s.lostShare
					if share == 0 {
						share = 50
					}
					if sum.lost > sum.steps/share {
						t.Errorf("%d timelines lost Redis state; the test says little", sum.lost)
					}
					all.add(sum)
				})
			}
			if all.lastMicro == 0 {
				t.Errorf("no cached denial was tested in its last microsecond")
			}
		})
	}
}

// dcLimiter is a limiter over a fresh memory store with a deny cache.
func dcLimiter(t *testing.T, maxEntries int, rules ...*limits.Rule) (*limits.Limiter, *limits.DenyCache) {
	t.Helper()
	m := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { m.Close() })
	c := limits.NewDenyCache(maxEntries)
	return limits.New(limits.Options{Store: m, Prefix: "rg", Rules: rules, DenyCache: c}), c
}

func dcFixed(limit int64, period time.Duration) *limits.Rule {
	return &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.FixedWindow,
		Limit: limit, Period: period, Burst: limit, Cost: 1}
}

// dcAsk decides one request of user with cost at now.
func dcAsk(t *testing.T, l *limits.Limiter, user string, cost, now int64) limits.Decision {
	t.Helper()
	var d limits.Decision
	if err := l.DecideAt(context.Background(), &limits.Request{User: []byte(user), Cost: cost}, &d, now); err != nil {
		t.Fatal(err)
	}
	return d
}

func dcWant(t *testing.T, what string, d limits.Decision, admitted, cached bool) {
	t.Helper()
	if d.Admitted != admitted || d.Cached != cached {
		t.Fatalf("%s: admitted=%v cached=%v, want admitted=%v cached=%v (%+v)", what, d.Admitted, d.Cached, admitted, cached, d.Verdicts)
	}
}

// TestDenyCacheCost: a denial cached for cost 5 answers costs 5 and 7
// locally; cost 1 may fit earlier, so it still asks the store.
func TestDenyCacheCost(t *testing.T) {
	l, c := dcLimiter(t, 100, dcFixed(5, time.Hour))
	start := storetest.WindowStart(time.Hour)
	now := start + 1000
	dcWant(t, "cost 3", dcAsk(t, l, "u", 3, now), true, false)
	d := dcAsk(t, l, "u", 5, now)
	dcWant(t, "cost 5 (store)", d, false, false)
	end := start + limits.PeriodUS(time.Hour)
	if d.Verdicts[0].Result.RetryUS != end-now {
		t.Fatalf("store retry %d, want %d", d.Verdicts[0].Result.RetryUS, end-now)
	}
	if c.Len() != 1 {
		t.Fatalf("Len %d after a denial, want 1", c.Len())
	}
	now += 10
	d = dcAsk(t, l, "u", 5, now)
	dcWant(t, "cost 5 again", d, false, true)
	v := d.Verdicts[0]
	if d.Denier != 0 || len(d.Verdicts) != 1 || v.Result.RetryUS != end-now || v.Result.Remaining != 2 || v.Cost != 5 ||
		v.Key != "rg:{per-user:u}:fw2" {
		t.Fatalf("cached verdict %+v (denier %d), want retry %d remaining 2 cost 5", v, d.Denier, end-now)
	}
	// Cost 7 exceeds the limit: denied from the cache, reported as never fitting.
	d = dcAsk(t, l, "u", 7, now)
	dcWant(t, "cost 7", d, false, true)
	if d.Verdicts[0].Result.RetryUS != limits.NeverFits {
		t.Fatalf("cost 7 > limit 5: retry %d, want NeverFits", d.Verdicts[0].Result.RetryUS)
	}
	dcWant(t, "cost 1", dcAsk(t, l, "u", 1, now), true, false)
	dcWant(t, "other user", dcAsk(t, l, "v", 5, now), true, false)
	// The entry holds until its last microsecond and not a microsecond more.
	dcWant(t, "cost 5 at the last µs", dcAsk(t, l, "u", 5, end-1), false, true)
	dcWant(t, "cost 5 at the window end", dcAsk(t, l, "u", 5, end), true, false)
	if c.Len() != 0 {
		t.Fatalf("Len %d after the entry expired on lookup, want 0", c.Len())
	}
}

// TestDenyCacheShadow: a shadow rule that would deny is never cached, and
// a request it alone denies is admitted.
func TestDenyCacheShadow(t *testing.T) {
	sh := dcFixed(1, time.Hour)
	sh.Name, sh.Shadow = "shadow", true
	l, c := dcLimiter(t, 100, sh)
	now := storetest.WindowStart(time.Hour) + 1
	dcWant(t, "first", dcAsk(t, l, "u", 1, now), true, false)
	dcWant(t, "second (shadow would deny)", dcAsk(t, l, "u", 1, now), true, false)
	if c.Len() != 0 {
		t.Fatalf("Len %d, want 0: shadow denials are not cached", c.Len())
	}
}

// TestDenyCacheClearedBySetRules: rules changed (an override or a reload)
// may admit what the old ones denied.
func TestDenyCacheClearedBySetRules(t *testing.T) {
	r := dcFixed(1, time.Hour)
	l, c := dcLimiter(t, 100, r)
	now := storetest.WindowStart(time.Hour) + 1
	dcAsk(t, l, "u", 1, now)
	dcWant(t, "denied", dcAsk(t, l, "u", 1, now), false, false)
	dcWant(t, "cached", dcAsk(t, l, "u", 1, now), false, true)
	bigger := *r
	bigger.Limit, bigger.Burst = 2, 2
	l.SetRules([]*limits.Rule{&bigger})
	if c.Len() != 0 {
		t.Fatalf("Len %d after SetRules, want 0", c.Len())
	}
	dcWant(t, "under the new limit", dcAsk(t, l, "u", 1, now), true, false)
}

// TestDenyCacheNeverFits: a cost above the burst is denied until the rules
// change, whatever the time.
func TestDenyCacheNeverFits(t *testing.T) {
	tb := &limits.Rule{Name: "tb", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.TokenBucket, Limit: 10, Period: time.Second, Burst: 3, Cost: 1}
	l, c := dcLimiter(t, 100, tb)
	now := time.Now().UnixMicro()
	d := dcAsk(t, l, "u", 4, now)
	dcWant(t, "cost 4 > burst 3", d, false, false)
	if d.Verdicts[0].Result.RetryUS != limits.NeverFits {
		t.Fatalf("retry %d, want NeverFits", d.Verdicts[0].Result.RetryUS)
	}
	later := now + limits.PeriodUS(24*365*time.Hour)
	d = dcAsk(t, l, "u", 4, later)
	dcWant(t, "a year later", d, false, true)
	if d.Verdicts[0].Result.RetryUS != limits.NeverFits {
		t.Fatalf("cached retry %d, want NeverFits", d.Verdicts[0].Result.RetryUS)
	}
	dcWant(t, "cost 3", dcAsk(t, l, "u", 3, later), true, false)
	l.SetRules([]*limits.Rule{tb})
	dcWant(t, "after SetRules", dcAsk(t, l, "u", 4, later), false, false)
	if c.Len() != 1 {
		t.Fatalf("Len %d, want 1", c.Len())
	}
}

// TestDenyCacheForget: a key reset is forgotten, locally and through the
// announcer.
func TestDenyCacheForget(t *testing.T) {
	// room for several entries per shard: u and v share one 1 time in 64
	l, c := dcLimiter(t, 1000, dcFixed(1, time.Hour))
	now := storetest.WindowStart(time.Hour) + 1
	dcAsk(t, l, "u", 1, now)
	dcAsk(t, l, "u", 1, now)
	dcAsk(t, l, "v", 1, now)
	dcAsk(t, l, "v", 1, now)
	if c.Len() != 2 {
		t.Fatalf("Len %d, want 2", c.Len())
	}
	c.Forget("rg:{per-user:u}:fw2")
	if c.Len() != 1 {
		t.Fatalf("Len %d after Forget, want 1", c.Len())
	}
	dcWant(t, "u after Forget", dcAsk(t, l, "u", 1, now), false, false) // cached again
	dcWant(t, "v still cached", dcAsk(t, l, "v", 1, now), false, true)

	var heard []string
	c.SetAnnouncer(announcerFunc(func(_ context.Context, key string) error {
		heard = append(heard, key)
		return errors.New("no peers")
	}))
	if err := c.KeyReset(context.Background(), "rg:{per-user:v}:fw2"); err == nil {
		t.Fatal("KeyReset hid the announcer's error")
	}
	if len(heard) != 1 || heard[0] != "rg:{per-user:v}:fw2" || c.Len() != 1 {
		t.Fatalf("announced %q, Len %d; want the key announced and forgotten (u's entry left)", heard, c.Len())
	}
}

type announcerFunc func(ctx context.Context, key string) error

func (f announcerFunc) AnnounceReset(ctx context.Context, key string) error { return f(ctx, key) }

// gateStore holds one Decide, after the inner store has decided, until
// released: a store reply still on its way back.
type gateStore struct {
	limits.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *gateStore) Decide(ctx context.Context, b *limits.Batch, res []limits.Result) (bool, error) {
	ok, err := g.Store.Decide(ctx, b, res)
	if g.armed.CompareAndSwap(true, false) {
		g.entered <- struct{}{}
		<-g.release
	}
	return ok, err
}

// TestDenyCacheGenerationRace: a denial the store made before a rule change
// or a reset, whose decision finishes after it, is not cached.
func TestDenyCacheGenerationRace(t *testing.T) {
	r := dcFixed(1, time.Hour)
	for _, tc := range []struct {
		name    string
		between func(l *limits.Limiter, c *limits.DenyCache)
		cached  bool
	}{
		{"nothing in between", func(*limits.Limiter, *limits.DenyCache) {}, true},
		{"SetRules", func(l *limits.Limiter, _ *limits.DenyCache) { l.SetRules([]*limits.Rule{r}) }, false},
		{"Clear", func(_ *limits.Limiter, c *limits.DenyCache) { c.Clear() }, false},
		{"Forget", func(_ *limits.Limiter, c *limits.DenyCache) { c.Forget("rg:{per-user:u}:fw2") }, false},
		// A reset of a key in another shard (a refund on a cluster, many a
		// second under a flood) does not hold back this key's insert.
		{"Forget elsewhere", func(_ *limits.Limiter, c *limits.DenyCache) {
			for i := range 1000 {
				if k := fmt.Sprintf("rg:{per-user:v%d}:fw2", i); !c.SameShard(k, "rg:{per-user:u}:fw2") {
					c.Forget(k)
					return
				}
			}
			t.Fatal("no key in another shard")
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := memstore.NewSweeping(time.Hour)
			defer m.Close()
			g := &gateStore{Store: m, entered: make(chan struct{}), release: make(chan struct{})}
			c := limits.NewDenyCache(100)
			l := limits.New(limits.Options{Store: g, Prefix: "rg", Rules: []*limits.Rule{r}, DenyCache: c})
			now := storetest.WindowStart(time.Hour) + 1
			dcWant(t, "first", dcAsk(t, l, "u", 1, now), true, false)
			g.armed.Store(true)
			done := make(chan limits.Decision)
			go func() {
				var d limits.Decision
				if err := l.DecideAt(context.Background(), &limits.Request{User: []byte("u"), Cost: 1}, &d, now); err != nil {
					t.Error(err)
				}
				done <- d
			}()
			<-g.entered
			tc.between(l, c)
			close(g.release)
			dcWant(t, "in flight", <-done, false, false)
			if got := c.Len() == 1; got != tc.cached {
				t.Fatalf("Len %d: cached=%v, want %v", c.Len(), got, tc.cached)
			}
			dcWant(t, "next", dcAsk(t, l, "u", 1, now), false, tc.cached)
		})
	}
}

// TestDenyCacheBound: the cache never holds more than maxEntries; expired
// entries make room before live ones are evicted.
func TestDenyCacheBound(t *testing.T) {
	l, c := dcLimiter(t, 256, dcFixed(1, time.Minute))
	now := storetest.WindowStart(time.Minute) + 1
	for i := 0; i < 2000; i++ {
		u := "u" + strconv.Itoa(i)
		dcAsk(t, l, u, 1, now)
		dcAsk(t, l, u, 1, now)
		if c.Len() > 256 {
			t.Fatalf("Len %d after %d denied identities, want <= 256", c.Len(), i+1)
		}
	}
	if c.Evictions() == 0 {
		t.Fatal("2000 live denials in a cache of 256 evicted none")
	}

	// One shard of one entry: a live entry is evicted for a new one, an
	// expired one makes room without an eviction.
	l, c = dcLimiter(t, 1, dcFixed(1, time.Minute))
	dcAsk(t, l, "a", 1, now)
	dcAsk(t, l, "a", 1, now)
	dcAsk(t, l, "b", 1, now)
	dcAsk(t, l, "b", 1, now)
	if c.Len() != 1 || c.Evictions() != 1 {
		t.Fatalf("Len %d evictions %d, want 1 and 1", c.Len(), c.Evictions())
	}
	dcWant(t, "b cached", dcAsk(t, l, "b", 1, now), false, true)
	next := now + limits.PeriodUS(time.Minute)
	dcAsk(t, l, "c", 1, next)
	dcAsk(t, l, "c", 1, next)
	if c.Len() != 1 || c.Evictions() != 1 {
		t.Fatalf("Len %d evictions %d, want 1 and 1: the expired entry should have made room", c.Len(), c.Evictions())
	}
	dcWant(t, "c cached", dcAsk(t, l, "c", 1, next), false, true)
}

// TestDenyCacheFullSweepsAmortized: a full cache whose denials expire one
// by one (each identity denied until a minute after its own first request)
// reads a bounded number of entries per new denial. Sweeping the whole
// shard whenever its earliest entry has expired read all of its 1,024
// entries at about one insert in seven here (some 140 entries a denial
// measured; fewer where no entry had expired yet, up to the whole shard
// for every insert where one always had): an attacker with many
// identities made every denial that reaches the store pay for it.
func TestDenyCacheFullSweepsAmortized(t *testing.T) {
	const size = 64 * 1024 // 64 shards of 1,024
	bucket := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.TokenBucket,
		Limit: 1, Period: time.Minute, Burst: 1, Cost: 1}
	l, c := dcLimiter(t, size, bucket)
	now := storetest.WindowStart(time.Hour) + 1
	step := limits.PeriodUS(time.Minute) / size // the first denials expire while the last are cached
	deny := func(i int) {
		t.Helper()
		u := "u" + strconv.Itoa(i)
		dcWant(t, u+" first", dcAsk(t, l, u, 1, now), true, false)
		dcWant(t, u+" second", dcAsk(t, l, u, 1, now), false, false)
		now += step
	}
	for i := range size {
		deny(i)
	}
	before := c.Scanned()
	const more = size / 2
	for i := range more {
		deny(size + i)
		if c.Len() > size {
			t.Fatalf("Len %d, want <= %d", c.Len(), size)
		}
	}
	per := float64(c.Scanned()-before) / more
	t.Logf("%.1f entries read per new denial", per)
	if per > 16 {
		t.Fatalf("sweeps read %.0f entries per new denial once full, want at most 16", per)
	}
	// the newest denials are cached
	dcWant(t, "newest cached", dcAsk(t, l, "u"+strconv.Itoa(size+more-1), 1, now), false, true)
}

// TestDenyCacheRealClock: on the process clock (production), a cached
// denial holds until the store's retry time shortened by the drift margin,
// measured from before the store call, and reports the store's own retry
// time (Retry-After is not shortened).
func TestDenyCacheRealClock(t *testing.T) {
	l, c := dcLimiter(t, 100, dcFixed(1, storetest.SteadyDuration()))
	var d limits.Decision
	ask := func() {
		t.Helper()
		if err := l.Decide(context.Background(), &limits.Request{User: []byte("u")}, &d); err != nil {
			t.Fatal(err)
		}
	}
	ask()
	ask()
	if d.Admitted || d.Cached {
		t.Fatalf("second request: admitted=%v cached=%v, want a store denial", d.Admitted, d.Cached)
	}
	storeRetry := d.Verdicts[0].Result.RetryUS
	ask()
	if !d.Cached {
		t.Fatalf("third request not answered by the cache (Len %d)", c.Len())
	}
	got := d.Verdicts[0].Result.RetryUS
	if got > storeRetry || got < storeRetry-int64(time.Minute/time.Microsecond) {
		t.Fatalf("cached retry %dµs, want the store's %dµs less the time since", got, storeRetry)
	}
	// until runs from before the store call, the retry time from its
	// answer: they are the drift's margin apart, and the call's time
	span, ok := c.EntrySpan(d.Verdicts[0].Key)
	if want := storeRetry >> limits.DriftShift; !ok || span < want || span > want+int64(time.Second/time.Microsecond) || want <= 0 {
		t.Fatalf("entry holds until %dµs before the store's retry time, want %d (1/1024 of %d) and the call's time", span, want, storeRetry)
	}
}

// TestDenyCacheAllocs: with the cache on, a request the cache does not
// answer allocates no more than without it, and one it answers allocates
// nothing.
func TestDenyCacheAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	now := storetest.WindowStart(time.Hour) + 1
	measure := func(l *limits.Limiter, user string) float64 {
		req := &limits.Request{User: []byte(user)}
		var d limits.Decision
		ctx := context.Background()
		_ = l.DecideAt(ctx, req, &d, now)
		return testing.AllocsPerRun(500, func() { _ = l.DecideAt(ctx, req, &d, now) })
	}
	m := memstore.NewSweeping(time.Hour)
	defer m.Close()
	big := dcFixed(math.MaxInt32, time.Hour)
	big.Name = "big"
	small := dcFixed(1, time.Hour)
	small.Name = "small"
	plain := measure(limits.NewLimiter(m, "rg", []*limits.Rule{big}), "a")

	// Two limiters share one cache: the small rule's denial fills it, so
	// the big rule's requests really look it up, and miss.
	c := limits.NewDenyCache(100)
	ls := limits.New(limits.Options{Store: m, Prefix: "rg", Rules: []*limits.Rule{small}, DenyCache: c})
	lb := limits.New(limits.Options{Store: m, Prefix: "rg", Rules: []*limits.Rule{big}, DenyCache: c})
	dcAsk(t, ls, "denied", 1, now)
	dcAsk(t, ls, "denied", 1, now)
	if c.Len() != 1 {
		t.Fatalf("Len %d, want 1", c.Len())
	}
	miss := measure(lb, "b")
	hit := measure(ls, "denied")
	t.Logf("allocations per decision: %v without a cache, %v on a cache miss, %v on a cache hit", plain, miss, hit)
	if miss > plain {
		t.Errorf("a cache miss allocates %v, more than the %v without a cache", miss, plain)
	}
	if hit != 0 {
		t.Errorf("a cache hit allocates %v, want 0", hit)
	}
}
