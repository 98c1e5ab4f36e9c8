package memstore

import (
	"math"

	"github.com/rategate/rategate/limits"
)

// slidingWindow is the twin of lua/sliding_window.lua: the two-window
// estimate est = prev * (1 - elapsed/P) + curr over epoch-aligned windows;
// allow iff est + c <= L, then curr += c. State: a = e, the end of the
// window the current count b was counted in; c = the previous count, whose
// window ended at e - d; d = the period both were counted under. It expires
// when its newest count no longer counts (swGone).
//
// A stored count is curr while its window ends after the current window's
// start, prev while it ended within the period before, gone before that;
// with the period unchanged that is the textbook algorithm. Under another
// period the record is rewritten under the current one by the first
// decision that costs something (see the script's header).
//
// Every float step mirrors the Lua one (see swEstimate), so both stores
// reach the same verdicts, remaining counts and retry times bit for bit.
func slidingWindow(st *state, now int64, c *limits.Check, _ bool) outcome {
	p := c.PeriodUS
	ws := floorDiv(now, p) * p
	we := ws + p
	elapsed := now - ws
	var prev, curr int64
	cend := we
	norm := false
	if st.expireUS > now {
		e, sc, sp, d := st.a, st.b, st.c, st.d
		if d == 0 {
			d = p
		}
		gone := swGone(e-d, d)
		if sc > 0 {
			gone = swGone(e, d)
		}
		if now < gone {
			if sc > 0 {
				if e > ws {
					curr = sc
					cend = max(cend, e)
				} else if e > ws-p {
					prev = sc
				}
			}
			if sp > 0 {
				if pe := e - d; pe > ws {
					curr += sp
					cend = max(cend, pe)
				} else if pe > ws-p {
					prev += sp
				}
			}
			if cend > we && prev > 0 {
				curr, prev = curr+prev, 0
			}
			if d != p && c.Cost > 0 && (curr > 0 || prev > 0) {
				gone := swGone(cend-p, p)
				if curr > 0 {
					gone = swGone(cend, p)
				}
				*st = state{expireUS: gone, a: cend, b: curr, c: prev, d: p}
				norm = true
			}
		}
	}

	est := swEstimate(prev, curr, elapsed, p)
	if !swFits(est, c.Cost, c.Limit) {
		r := limits.Result{
			Remaining: swRemaining(est, c.Limit),
			ResetUS:   swReset(prev, curr, cend, we, p, now),
			RetryUS:   limits.NeverFits,
		}
		if c.Cost <= c.Limit {
			// curr stays curr until window k1, is prev in it, gone after.
			k1 := floorDiv(cend-ws-1, p) + 1
			if e := swEarliest(prev, curr, elapsed, c); e >= 0 {
				r.RetryUS = e - elapsed
			} else if e := swEarliest(curr, 0, 0, c); e >= 0 {
				r.RetryUS = k1*p + e - elapsed
			} else {
				// The window after k1 starts empty and any cost <= L fits there.
				r.RetryUS = (k1+1)*p - elapsed
			}
		}
		return outcome{r: r, normalized: norm}
	}

	curr += c.Cost
	est = swEstimate(prev, curr, elapsed, p)
	r := limits.Result{Allowed: true, Remaining: swRemaining(est, c.Limit), ResetUS: swReset(prev, curr, cend, we, p, now)}
	if c.Cost == 0 {
		return outcome{r: r, normalized: norm}
	}
	next := state{expireUS: swGone(cend, p), a: cend, b: curr, c: prev, d: p}
	return outcome{r: r, next: next, commit: true, normalized: norm}
}

// swGone is the start of the first window of length p in which a count
// whose window ended at x no longer counts, not even as prev.
func swGone(x, p int64) int64 {
	return (floorDiv(x-1, p) + 2) * p
}

// swEstimate is est = prev * (1 - elapsed / P) + curr as four separately
// rounded double operations, left to right, exactly as Lua evaluates it. The
// explicit float64 conversion of the product forbids the compiler to fuse
// x*y + z into one FMA (Go spec, "Floating-point operators"), which would
// round once instead of twice and could flip a verdict against Redis.
func swEstimate(prev, curr, elapsed, period int64) float64 {
	q := float64(elapsed) / float64(period)
	k := 1 - q
	x := float64(float64(prev) * k)
	return float64(x + float64(curr))
}

// swFits is the verdict est + c <= L, as Lua computes it.
func swFits(est float64, cost, limit int64) bool {
	return float64(est+float64(cost)) <= float64(limit)
}

// swRemaining is floor(L - est), never below 0.
func swRemaining(est float64, limit int64) int64 {
	return max(int64(math.Floor(float64(limit)-est)), 0)
}

// swReset is the time until est reaches 0: until the current count no
// longer counts (the end of the window after the one its window ends in),
// or the end of this window when only prev is left.
func swReset(prev, curr, cend, we, period, now int64) int64 {
	switch {
	case curr > 0:
		return swGone(cend, period) - now
	case prev > 0:
		return we - now
	}
	return 0
}

// swEarliest returns the smallest elapsed in [lo, P) at which c.Cost fits a
// window holding prev and curr, or -1. The verdict is monotone in elapsed
// (prev's weight only decays), so a binary search over the float verdict
// itself finds the exact first microsecond the script would admit.
func swEarliest(prev, curr, lo int64, c *limits.Check) int64 {
	p := c.PeriodUS
	hi := p - 1
	if !swFits(swEstimate(prev, curr, hi, p), c.Cost, c.Limit) {
		return -1
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if swFits(swEstimate(prev, curr, mid, p), c.Cost, c.Limit) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return hi
}

func init() { algos[limits.SlidingWindow] = slidingWindow }
