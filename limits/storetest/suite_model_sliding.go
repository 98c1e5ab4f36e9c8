package storetest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// windowBoundaryBehaviour measures, for the three window algorithms, the
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
func windowBoundaryBehaviour(t *testing.T, s Store) {
	seed := Seed(t)
	const limit = 10
	p := limits.PeriodUS(time.Minute)
	// Ahead of the wall clock so the memory store's sweeper keeps every key.
	boundary := WindowStart(time.Minute) + 2*p

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
		for _, algo := range []limits.Algorithm{limits.FixedWindow, limits.SlidingLog, limits.SlidingWindow} {
			c := limits.Check{Key: fmt.Sprintf("rg:{edge:%s}:%s", strings.ReplaceAll(run.name, " ", "-"), algo.Suffix()),
				Algorithm: algo, Limit: limit, PeriodUS: p, Burst: limit, Cost: 1}
			admitted := burstAll(t, s.Store, c, run.bursts)
			worst, end := maxInWindow(admitted, p)
			t.Logf("%s %-14s %-14s admitted %3d; most in any 60s window: %2d = L%+d (window ending %+.3fs from the first boundary)",
				s.Name, run.name, algo, len(admitted), worst, worst-limit, float64(end-boundary)/1e6)
			switch algo {
			case limits.FixedWindow:
				if worst > 2*limit || (run.name == "boundary burst" && worst != 2*limit) {
					t.Errorf("fixed_window: %d in one window, want %d on the boundary burst and never more", worst, 2*limit)
				}
			case limits.SlidingLog:
				if worst > limit || (run.name == "boundary burst" && worst != limit) {
					t.Errorf("sliding_log: %d in one window, want exactly the limit %d at most", worst, limit)
				}
			case limits.SlidingWindow:
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
}

// burstAll sends, at each instant of bursts, requests until one is denied,
// and returns the admitted ones.
func burstAll(t *testing.T, s limits.Store, c limits.Check, bursts []int64) []logEntry {
	t.Helper()
	var admitted []logEntry
	for _, at := range bursts {
		for n := int64(0); n <= c.Limit; n++ {
			if !DecideOne(t, s, c, at).Allowed {
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
