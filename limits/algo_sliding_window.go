package limits

import "math"

// slidingWindow is the twin of lua/sliding_window.lua: the two-window
// estimate est = prev * (1 - elapsed/P) + curr over epoch-aligned windows;
// allow iff est + c <= L, then curr += c. State: a = window index w,
// b = count of w, c = count of w-1; it expires at the end of w+1.
//
// Every float step mirrors the Lua one (see swEstimate), so both stores
// reach the same verdicts, remaining counts and retry times bit for bit.
func slidingWindow(st *state, now int64, c *Check) (Result, state, bool) {
	p := c.PeriodUS
	w := now / p
	elapsed := now - w*p
	var prev, curr int64
	if st.expireUS > now {
		switch st.a {
		case w:
			curr, prev = st.b, st.c
		case w - 1:
			prev = st.b
		}
	}

	est := swEstimate(prev, curr, elapsed, p)
	if !swFits(est, c.Cost, c.Limit) {
		r := Result{
			Remaining: swRemaining(est, c.Limit),
			ResetUS:   swReset(prev, curr, w, p, now),
			RetryUS:   NeverFits,
		}
		if c.Cost <= c.Limit {
			if e := swEarliest(prev, curr, elapsed, c); e >= 0 {
				r.RetryUS = e - elapsed
			} else if e := swEarliest(curr, 0, 0, c); e >= 0 {
				r.RetryUS = p + e - elapsed
			} else {
				// Window w+2 starts empty and any cost <= L fits there.
				r.RetryUS = 2*p - elapsed
			}
		}
		return r, state{}, false
	}

	curr += c.Cost
	est = swEstimate(prev, curr, elapsed, p)
	r := Result{Allowed: true, Remaining: swRemaining(est, c.Limit), ResetUS: swReset(prev, curr, w, p, now)}
	if c.Cost == 0 {
		return r, state{}, false
	}
	return r, state{expireUS: (w + 2) * p, a: w, b: curr, c: prev}, true
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

// swReset is the time until est reaches 0: the end of window w+1 while the
// current window holds requests (they are the next window's prev), the end
// of w when only prev is left.
func swReset(prev, curr, w, period, now int64) int64 {
	switch {
	case curr > 0:
		return (w+2)*period - now
	case prev > 0:
		return (w+1)*period - now
	}
	return 0
}

// swEarliest returns the smallest elapsed in [lo, P) at which c.Cost fits a
// window holding prev and curr, or -1. The verdict is monotone in elapsed
// (prev's weight only decays), so a binary search over the float verdict
// itself finds the exact first microsecond the script would admit.
func swEarliest(prev, curr, lo int64, c *Check) int64 {
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

func init() { algos[SlidingWindow] = slidingWindow }
