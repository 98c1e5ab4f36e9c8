package storetest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"

	"github.com/rategate/rategate/internal/testredis"
)

// refModel is a reference implementation of one algorithm for one key,
// written for clarity rather than speed and shaped differently from the
// stores' code: it keeps the whole history and recomputes from it.
type refModel interface {
	decide(now, cost int64) limits.Result
}

// slModel: the log of every admitted request, never trimmed. The window
// is (now-P, now]; retry is the first time t at which everything admitted
// after t, plus the cost, fits, and the request can go at t + P.
type slModel struct {
	limit, period int64
	log           []logEntry
}

func (m *slModel) decide(now, cost int64) limits.Result {
	live := func(e logEntry) bool { return e.at > now-m.period }
	used, newest := int64(0), int64(-1)
	for _, e := range m.log {
		if live(e) {
			used, newest = used+e.cost, max(newest, e.at)
		}
	}
	reset := int64(0)
	if newest >= 0 {
		reset = newest + m.period - now
	}
	if used+cost <= m.limit {
		if cost > 0 {
			m.log = append(m.log, logEntry{at: now, cost: cost})
			reset = m.period
		}
		return limits.Result{Allowed: true, Remaining: m.limit - used - cost, ResetUS: reset}
	}
	r := limits.Result{Remaining: max(m.limit-used, 0), ResetUS: reset, RetryUS: limits.NeverFits}
	for _, e := range m.log {
		if !live(e) || cost > m.limit {
			continue
		}
		after := int64(0)
		for _, f := range m.log {
			if live(f) && f.at > e.at {
				after += f.cost
			}
		}
		if after+cost <= m.limit {
			r.RetryUS = e.at + m.period - now
			break
		}
	}
	return r
}

// swModel: admitted cost per epoch-aligned window index. The float
// expression of the estimate is part of the contract, so it is the same
// one; the retry is found differently: the real-number solution of
// prev*(1 - e/P) + curr + cost = L, rounded up, then moved to the exact
// microsecond the float verdict flips at.
type swModel struct {
	limit, period int64
	count         map[int64]int64
}

func (m *swModel) fits(prev, curr, e, cost int64) bool {
	est := float64(float64(prev)*(1-float64(e)/float64(m.period))) + float64(curr)
	return est+float64(cost) <= float64(m.limit)
}

func (m *swModel) firstFit(prev, curr, lo, cost int64) int64 {
	room := m.limit - cost - curr
	if room < 0 {
		return -1
	}
	e := lo
	if prev > room {
		e = max(lo, (m.period*(prev-room)+prev-1)/prev) // ceil
	}
	for e > lo && m.fits(prev, curr, e-1, cost) {
		e--
	}
	for e < m.period && !m.fits(prev, curr, e, cost) {
		e++
	}
	if e >= m.period {
		return -1
	}
	return e
}

func (m *swModel) decide(now, cost int64) limits.Result {
	w, e := now/m.period, now%m.period
	prev := m.count[w-1]
	r := limits.Result{Allowed: m.fits(prev, m.count[w], e, cost), RetryUS: limits.NeverFits}
	if r.Allowed {
		m.count[w] += cost
		r.RetryUS = 0
	} else if cost <= m.limit {
		if f := m.firstFit(prev, m.count[w], e, cost); f >= 0 {
			r.RetryUS = f - e
		} else if f := m.firstFit(m.count[w], 0, 0, cost); f >= 0 {
			r.RetryUS = m.period + f - e
		} else {
			r.RetryUS = 2*m.period - e
		}
	}
	est := float64(float64(prev)*(1-float64(e)/float64(m.period))) + float64(m.count[w])
	r.Remaining = max(int64(math.Floor(float64(m.limit)-est)), 0)
	switch {
	case m.count[w] > 0:
		r.ResetUS = (w+2)*m.period - now
	case prev > 0:
		r.ResetUS = (w+1)*m.period - now
	}
	return r
}

func newRefModel(algo limits.Algorithm, limit, period int64) refModel {
	if algo == limits.SlidingLog {
		return &slModel{limit: limit, period: period}
	}
	return &swModel{limit: limit, period: period, count: map[int64]int64{}}
}

// modelSeq is one random request sequence against one key.
type modelSeq struct {
	limit, period int64
	now, cost     []int64
}

var modelPeriods = []time.Duration{5 * time.Second, 7*time.Second + 123*time.Microsecond, time.Minute, time.Hour, 24 * time.Hour}

// randomSeq mixes same-microsecond bursts, small and large steps, exact
// window boundaries (and 1µs before them), simple fractions of a window,
// and exact log departures (an earlier request's time + P, ±1µs), with
// costs 0, 1, up to L and above.
func randomSeq(rng *rand.Rand, n int) modelSeq {
	p := limits.PeriodUS(modelPeriods[rng.IntN(len(modelPeriods))])
	s := modelSeq{limit: 1 + rng.Int64N(12), period: p, now: make([]int64, n), cost: make([]int64, n)}
	// Ahead of the wall clock, so the memory store never sweeps a live key.
	now := time.Now().UnixMicro() + p + rng.Int64N(p)
	for i := 0; i < n; i++ {
		switch r := rng.IntN(100); {
		case r < 25: // same microsecond
		case r < 40:
			now += 1 + rng.Int64N(1000)
		case r < 60:
			now += rng.Int64N(p / 8)
		case r < 72:
			now += rng.Int64N(p)
		case r < 77:
			now += p + rng.Int64N(2*p)
		case r < 84:
			now = (now/p+1)*p - rng.Int64N(2)
		case r < 92:
			// j/d of the way into the next window, where prev's weight is
			// a simple fraction and the estimate lands on (or one ulp off)
			// an integer: the instants where float conventions differ.
			d := 2 + rng.Int64N(11)
			now = (now/p+1)*p + p*(1+rng.Int64N(d-1))/d
		default:
			if i > 0 {
				now = max(now, s.now[rng.IntN(i)]+p+rng.Int64N(3)-1)
			}
		}
		s.now[i] = now
		switch r := rng.IntN(100); {
		case r < 5:
			s.cost[i] = 0
		case r < 65:
			s.cost[i] = 1
		case r < 87:
			s.cost[i] = 1 + rng.Int64N(s.limit)
		case r < 93:
			s.cost[i] = s.limit
		default:
			s.cost[i] = s.limit + 1 + rng.Int64N(2)
		}
	}
	return s
}

// describe prints a sequence up to step upto for a failure message.
func (s modelSeq) describe(upto int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "limit %d, period %dµs; steps (µs since the first, cost):", s.limit, s.period)
	for i := 0; i <= upto && i < len(s.now); i++ {
		fmt.Fprintf(&b, " (%d,%d)", s.now[i]-s.now[0], s.cost[i])
	}
	return b.String()
}

func TestSlidingLogMatchesModel(t *testing.T)    { testMatchesModel(t, limits.SlidingLog) }
func TestSlidingWindowMatchesModel(t *testing.T) { testMatchesModel(t, limits.SlidingWindow) }

// testMatchesModel runs thousands of random sequences on the memory store
// against the reference model, then a bounded number on Redis and memory in
// lockstep: every step must give the same Result on both, and the model's.
func testMatchesModel(t *testing.T, algo limits.Algorithm) {
	seed := Seed(t)
	t.Run("memory", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(uint64(seed), 1))
		m := memstore.NewSweeping(time.Hour)
		defer m.Close()
		const sequences, steps = 2000, 60
		for i := 0; i < sequences; i++ {
			s := randomSeq(rng, steps)
			c := limits.Check{Key: fmt.Sprintf("rg:{model:%d}:%s", i, algo.Suffix()), Algorithm: algo, Limit: s.limit, PeriodUS: s.period, Burst: s.limit}
			ref := newRefModel(algo, s.limit, s.period)
			for j := range s.now {
				c.Cost = s.cost[j]
				got := DecideOne(t, m, c, s.now[j])
				if want := ref.decide(s.now[j], s.cost[j]); got != want {
					t.Fatalf("sequence %d step %d: memory %+v, model %+v\n%s", i, j, got, want, s.describe(j))
				}
			}
			if err := m.Reset(context.Background(), c); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("redis=memory", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(uint64(seed), 2))
		m, rs := gtStores(t)
		const sequences, steps = 50, 60
		for i := 0; i < sequences; i++ {
			s := randomSeq(rng, steps)
			c := limits.Check{Key: fmt.Sprintf("rg:{lockstep:%d}:%s", i, algo.Suffix()), Algorithm: algo, Limit: s.limit, PeriodUS: s.period, Burst: s.limit}
			ref := newRefModel(algo, s.limit, s.period)
			for j := range s.now {
				c.Cost = s.cost[j]
				onRedis := DecideOne(t, rs, c, s.now[j])
				inMemory := DecideOne(t, m, c, s.now[j])
				if onRedis != inMemory {
					t.Fatalf("sequence %d step %d: redis %+v, memory %+v\n%s", i, j, onRedis, inMemory, s.describe(j))
				}
				if want := ref.decide(s.now[j], s.cost[j]); onRedis != want {
					t.Fatalf("sequence %d step %d: both stores %+v, model %+v\n%s", i, j, onRedis, want, s.describe(j))
				}
			}
		}
	})
}

// TestSlidingLogBacklogMatchesModel: sliding_log on Redis removes at most
// 128 departed entries per admission (or drops a log whose window has
// emptied), so after a large burst leaves, departed entries stay behind for
// a while. They must never count: limits of a few hundred, bursts in one
// microsecond with stragglers after them, departures of whole bursts at
// once (exactly, 1µs early or late, or of everything), every step against
// the reference model; the key never holds more entries than the limit, and
// the sequences reach the bounded removal.
func TestSlidingLogBacklogMatchesModel(t *testing.T) {
	seed := Seed(t)
	rng := rand.New(rand.NewPCG(uint64(seed), 3))
	srv := testredis.Start(t)
	client := srv.Client(t)
	rs, err := redisstore.New(client, "redis "+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testredis.Ctx(t)
	p := limits.PeriodUS(time.Minute)
	var bounded, steps int
	for i := 0; i < 4; i++ {
		limit := 150 + rng.Int64N(350)
		c := limits.Check{Key: fmt.Sprintf("rg:{backlog:%d}:sl2", i), Algorithm: limits.SlidingLog, Limit: limit, PeriodUS: p, Burst: limit}
		ref := &slModel{limit: limit, period: p}
		now := time.Now().UnixMicro() + p // ahead of Redis's clock: nothing expires by itself
		var hist strings.Builder
		j := 0
		step := func(cost int64) {
			t.Helper()
			c.Cost = cost
			gone, err := client.ZCount(ctx, c.Key, "-inf", fmt.Sprint(now-p)).Result()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&hist, " (%d,%d)", now, cost)
			got := DecideOne(t, rs, c, now)
			if want := ref.decide(now, cost); got != want {
				t.Fatalf("sequence %d (limit %d) step %d: redis %+v, model %+v; %d departed entries were in the key before it\nsteps (µs, cost):%s", i, limit, j, got, want, gone, hist.String())
			}
			if got.Allowed && cost > 0 && gone > 128 {
				bounded++
			}
			if n := client.ZCard(ctx, c.Key).Val(); n > limit {
				t.Fatalf("sequence %d step %d: the key holds %d entries, more than the limit %d", i, j, n, limit)
			}
			j++
		}
		cost := func() int64 {
			switch r := rng.IntN(100); {
			case r < 3:
				return 0
			case r < 15:
				return 2 + rng.Int64N(4)
			}
			return 1
		}
		for episode := 0; episode < 8; episode++ {
			burstAt := now
			for k := 50 + rng.Int64N(limit); k > 0; k-- { // a burst in one µs, until denied
				step(1)
			}
			for k := rng.IntN(4); k > 0; k-- { // stragglers
				now += 1 + rng.Int64N(1000)
				step(cost())
			}
			switch r := rng.IntN(10); {
			case r < 6: // the burst leaves: exactly, 1µs early or late
				now = max(now, burstAt+p+rng.Int64N(3)-1)
			case r < 8: // everything leaves
				now += p + rng.Int64N(p)
			default:
				now += rng.Int64N(p / 2)
			}
			for k := 20 + rng.IntN(200); k > 0; k-- {
				if rng.IntN(3) == 0 {
					now += 1 + rng.Int64N(p/200)
				}
				step(cost())
			}
		}
		steps += j
	}
	t.Logf("%d steps; %d admissions found more than 128 departed entries", steps, bounded)
	if bounded < 5 {
		t.Fatalf("only %d admissions found more than 128 departed entries: the sequences miss the bounded removal", bounded)
	}
}

// TestSlidingLogBacklogRedisMatchesMemory: the departed entries an admission
// leaves behind count again under a longer period or after the clock steps
// back, so both stores must leave the same ones. Redis and memory in
// lockstep on bursts of up to a few hundred in one µs leaving at once, with
// the rule's period switching between one and two minutes and the clock
// stepping back now and then: every step gives the same Result on both.
func TestSlidingLogBacklogRedisMatchesMemory(t *testing.T) {
	seed := Seed(t)
	rng := rand.New(rand.NewPCG(uint64(seed), 4))
	m, rs := gtStores(t)
	p := limits.PeriodUS(time.Minute)
	var longer, back int
	for i := 0; i < 4; i++ {
		limit := 150 + rng.Int64N(350)
		c := limits.Check{Key: fmt.Sprintf("rg:{backlog-lockstep:%d}:sl2", i), Algorithm: limits.SlidingLog, Limit: limit, PeriodUS: p, Burst: limit}
		now := time.Now().UnixMicro() + 4*p // ahead of the wall clock, past every step back
		// In lockstep: Redis expires the key on its own clock, which this
		// one outruns, so where the key's time is up on this clock it is
		// dropped from Redis too (a burst that left the window and was not
		// written since expires, P after its newest entry, before a longer
		// period could count it again).
		ls := newLockstep(t, m, rs, c.Key)
		step := func(cost int64) {
			t.Helper()
			c.Cost = cost
			ls.step(c, now)
		}
		for episode := 0; episode < 8; episode++ {
			burstAt := now
			for k := 50 + rng.Int64N(limit); k > 0; k-- {
				step(1)
			}
			for k := rng.IntN(4); k > 0; k-- {
				now += 1 + rng.Int64N(1000)
				step(1 + rng.Int64N(3))
			}
			now = max(now, burstAt+c.PeriodUS+rng.Int64N(3)-1) // the burst leaves
			step(1)
			switch rng.IntN(4) { // what it left behind counts again
			case 0, 1:
				if c.PeriodUS == p {
					c.PeriodUS, longer = 2*p, longer+1
				}
			case 2:
				now -= rng.Int64N(p / 2)
				back++
			}
			for k := 20 + rng.IntN(100); k > 0; k-- {
				switch r := rng.IntN(100); {
				case r < 4: // a reload changes the period
					if c.PeriodUS == p {
						c.PeriodUS, longer = 2*p, longer+1
					} else {
						c.PeriodUS = p
					}
				case r < 7: // the clock steps back
					now -= rng.Int64N(p / 2)
					back++
				case r < 40:
					now += 1 + rng.Int64N(p/100)
				}
				cost := int64(1)
				if rng.IntN(10) == 0 {
					cost = 0
				}
				step(cost)
			}
		}
	}
	t.Logf("periods lengthened %d times, clock stepped back %d times", longer, back)
}
