package limits

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

var slidingSeed = flag.Int64("sliding.seed", 0, "seed of the randomized sliding_log/sliding_window tests (0 = from the clock)")

// modelSeed returns the seed of a randomized test and prints it if the
// test fails, with the flag that replays it.
func modelSeed(t *testing.T) int64 {
	t.Helper()
	seed := *slidingSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: replay with go test ./limits/ -run '^%s$' -sliding.seed=%d", seed, t.Name(), seed)
		}
	})
	return seed
}

// refModel is a reference implementation of one algorithm for one key,
// written for clarity rather than speed and shaped differently from the
// stores' code: it keeps the whole history and recomputes from it.
type refModel interface {
	decide(now, cost int64) Result
}

// slModel: the log of every admitted request, never trimmed. The window
// is (now-P, now]; retry is the first time t at which everything admitted
// after t, plus the cost, fits, and the request can go at t + P.
type slModel struct {
	limit, period int64
	log           []logEntry
}

func (m *slModel) decide(now, cost int64) Result {
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
		return Result{Allowed: true, Remaining: m.limit - used - cost, ResetUS: reset}
	}
	r := Result{Remaining: max(m.limit-used, 0), ResetUS: reset, RetryUS: NeverFits}
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

func (m *swModel) decide(now, cost int64) Result {
	w, e := now/m.period, now%m.period
	prev := m.count[w-1]
	r := Result{Allowed: m.fits(prev, m.count[w], e, cost), RetryUS: NeverFits}
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

func newRefModel(algo Algorithm, limit, period int64) refModel {
	if algo == SlidingLog {
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
	p := PeriodUS(modelPeriods[rng.IntN(len(modelPeriods))])
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

func TestSlidingLogMatchesModel(t *testing.T)    { testMatchesModel(t, SlidingLog) }
func TestSlidingWindowMatchesModel(t *testing.T) { testMatchesModel(t, SlidingWindow) }

// testMatchesModel runs thousands of random sequences on the memory store
// against the reference model, then a bounded number on Redis and memory in
// lockstep: every step must give the same Result on both, and the model's.
func testMatchesModel(t *testing.T, algo Algorithm) {
	seed := modelSeed(t)
	t.Run("memory", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(uint64(seed), 1))
		m := MSNewSweep(time.Hour)
		defer m.Close()
		const sequences, steps = 2000, 60
		for i := 0; i < sequences; i++ {
			s := randomSeq(rng, steps)
			c := Check{Key: fmt.Sprintf("rg:{model:%d}:%s", i, algo.Suffix()), Algorithm: algo, Limit: s.limit, PeriodUS: s.period, Burst: s.limit}
			ref := newRefModel(algo, s.limit, s.period)
			for j := range s.now {
				c.Cost = s.cost[j]
				got := STDecideOne(t, m, c, s.now[j])
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
		srv := testredis.Start(t)
		rs, err := NewRedisStore(srv.Client(t), "redis "+srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		m := MSNewSweep(time.Hour)
		defer m.Close()
		const sequences, steps = 50, 60
		for i := 0; i < sequences; i++ {
			s := randomSeq(rng, steps)
			c := Check{Key: fmt.Sprintf("rg:{lockstep:%d}:%s", i, algo.Suffix()), Algorithm: algo, Limit: s.limit, PeriodUS: s.period, Burst: s.limit}
			ref := newRefModel(algo, s.limit, s.period)
			for j := range s.now {
				c.Cost = s.cost[j]
				onRedis := STDecideOne(t, rs, c, s.now[j])
				inMemory := STDecideOne(t, m, c, s.now[j])
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

// TestWindowBoundaryBehaviour measures, for the three window algorithms, the
// most they admit within any window of length P (t-P, t], on an adversarial
// burst around a boundary and on random bursts.
//
// The bound for sliding_window, derived: take a window (t-P, t] with t in
// aligned window w, e = t - wP, and A = what window w-1 admitted. The window
// holds B <= A of w-1's requests (those after w-1's own elapsed e) plus
// curr, what w admitted by t. The last admission in w, at elapsed e' <= e,
// passed A*(1 - e'/P) + curr <= L, so curr <= L - A*(1 - e/P). Hence
//
//	count(t-P, t] <= B + L - A + A*e/P <= L + A*e/P  (< 2L, as A <= L, e < P)
//
// so the excess over L is at most floor(A*e/P) <= L - 1. It is reached when
// w-1's whole quota lands in its last instant: the estimate assumes w-1's
// requests were spread evenly and lets them "decay" before they have left.
// fixed_window's excess reaches L; sliding_log's is 0.
func TestWindowBoundaryBehaviour(t *testing.T) {
	seed := modelSeed(t)
	const limit = 10
	p := PeriodUS(time.Minute)
	STForEach(t, func(t *testing.T, s STStore) {
		// Ahead of the wall clock so the memory store's sweeper keeps every key.
		boundary := STWindowStart(time.Minute) + 2*p

		// No burst starts within 1 s of a window's end: fixed_window's key
		// gets the rest of its window on this fake clock as its real Redis
		// TTL, and a burst must be over before that, even under -race.
		const margin = 1_000_000
		awayFromEnd := func(at int64) int64 {
			if end := (at/p + 1) * p; end-at < margin {
				return end - margin
			}
			return at
		}
		// Adversarial: bursts (until the first denial: a burst's later
		// requests meet the same state) 1 s before a boundary, then every P/20.
		adversarial := []int64{boundary - margin}
		for k := int64(0); k < 20; k++ {
			adversarial = append(adversarial, boundary+k*p/20)
		}
		// Random: 40 bursts over 12 periods, half of them within 2 s of a boundary.
		rng := rand.New(rand.NewPCG(uint64(seed), 4))
		var random []int64
		at := boundary
		for k := 0; k < 40; k++ {
			if rng.IntN(2) == 0 {
				at = (at/p+1)*p + rng.Int64N(4*margin) - 2*margin
			} else {
				at += rng.Int64N(p / 2)
			}
			random = append(random, awayFromEnd(at))
		}

		for _, run := range []struct {
			name   string
			bursts []int64
		}{{"boundary burst", adversarial}, {"random bursts", random}} {
			for _, algo := range []Algorithm{FixedWindow, SlidingLog, SlidingWindow} {
				c := Check{Key: fmt.Sprintf("rg:{edge:%s}:%s", strings.ReplaceAll(run.name, " ", "-"), algo.Suffix()),
					Algorithm: algo, Limit: limit, PeriodUS: p, Burst: limit, Cost: 1}
				admitted := burstAll(t, s.Store, c, run.bursts)
				worst, end := maxInWindow(admitted, p)
				t.Logf("%s %-14s %-14s admitted %3d; most in any 60s window: %2d = L%+d (window ending %+.3fs from the first boundary)",
					s.Name, run.name, algo, len(admitted), worst, worst-limit, float64(end-boundary)/1e6)
				switch algo {
				case FixedWindow:
					if worst > 2*limit || (run.name == "boundary burst" && worst != 2*limit) {
						t.Errorf("fixed_window: %d in one window, want %d on the boundary burst and never more", worst, 2*limit)
					}
				case SlidingLog:
					if worst > limit || (run.name == "boundary burst" && worst != limit) {
						t.Errorf("sliding_log: %d in one window, want exactly the limit %d at most", worst, limit)
					}
				case SlidingWindow:
					excess, bound := slidingWindowExcess(t, admitted, p, limit)
					t.Logf("%s %-14s sliding_window worst excess %d (derived bound: floor(A*e/P) in each window, at most L-1 = %d)",
						s.Name, run.name, excess, bound)
					if excess > bound {
						t.Errorf("sliding_window: excess %d above L-1 = %d", excess, bound)
					}
					if run.name == "boundary burst" && excess != limit-1 {
						t.Errorf("sliding_window: the boundary burst reached excess %d, the derived worst case is %d", excess, limit-1)
					}
				}
			}
		}
	})
}

// burstAll sends, at each instant of bursts, requests until one is denied,
// and returns the admitted ones.
func burstAll(t *testing.T, s Store, c Check, bursts []int64) []logEntry {
	t.Helper()
	var admitted []logEntry
	for _, at := range bursts {
		for n := int64(0); n <= c.Limit; n++ {
			if !STDecideOne(t, s, c, at).Allowed {
				break
			}
			admitted = append(admitted, logEntry{at: at, cost: c.Cost})
		}
	}
	return admitted
}

// slidingWindowExcess checks every window ending at an admitted request
// against the derived bound L + floor(A*e/P) and returns the largest excess
// over L seen and the global bound L-1.
func slidingWindowExcess(t *testing.T, admitted []logEntry, p, limit int64) (excess, bound int64) {
	t.Helper()
	for _, end := range admitted {
		w, e := end.at/p, end.at%p
		var in, prevWindow int64
		for _, a := range admitted {
			if a.at > end.at-p && a.at <= end.at {
				in += a.cost
			}
			if a.at/p == w-1 {
				prevWindow += a.cost
			}
		}
		if perWindow := limit + int64(math.Floor(float64(prevWindow)*float64(e)/float64(p)+1e-9)); in > perWindow {
			t.Errorf("sliding_window: %d in the window ending at %d, above L + floor(A*e/P) = %d (A = %d, e = %dµs)",
				in, end.at, perWindow, prevWindow, e)
		}
		excess = max(excess, in-limit)
	}
	return excess, limit - 1
}
