package limits

import "math"

// This file holds tokenBucket, the twin of lua/token_bucket.lua. It uses the
// exact interval arithmetic of algo_gcra.go (see there why int64 here gives
// the script's numbers).
//
// Rounding rule (both files): the refill is counted exactly, as k whole tokens
// plus rho, the time already earned towards the next one (0 <= rho < T). The
// stored count is always whole; rho is kept as elapsed time by storing
// ts = now - floor(rho) on an admission, so the part of rho below one µs is
// dropped. When T is a whole number of µs (or one µs refills whole tokens) rho
// is whole, nothing is dropped, and the bucket is exact and decides exactly
// like gcra with the same L, P, B. Otherwise each admission gives up less than
// one µs of refill (and less than one token): conservative, never admitting
// more than the exact bucket would. Reported times round up, remaining down.

// after returns ceil(n*T - (ri + rf/L)): how long n more tokens take when rho
// of the next one is already earned.
func (t interval) after(n, ri, rf int64) int64 {
	ni, nf := t.times(n)
	if nf > rf {
		return ni - ri + 1
	}
	return ni - ri
}

// refilled returns the largest n in [0, hi] with n*T <= e µs.
func (t interval) refilled(e, hi int64) int64 {
	est := math.Floor(float64(float64(e)*float64(t.l)) / float64(t.p))
	if est > float64(hi) {
		est = float64(hi)
	}
	if est < 0 {
		est = 0
	}
	n := int64(est)
	for n > 0 {
		ni, nf := t.times(n)
		if ni < e || (ni == e && nf == 0) {
			break
		}
		n--
	}
	for n < hi {
		ni, nf := t.times(n + 1)
		if ni > e || (ni == e && nf > 0) {
			break
		}
		n++
	}
	return n
}

// tokenBucket: capacity B refilled at L per P, starting full; allow iff
// tokens_now >= c, then take c. The state is a = ts (µs) and f = the whole
// tokens at ts; the key expires when the bucket is full again.
func tokenBucket(st *state, now int64, c *Check) (Result, state, bool) {
	t := newInterval(c.Limit, c.PeriodUS)
	// have = whole tokens now; rho = ri + rf/L µs earned towards the next one
	have, ri, rf := c.Burst, int64(0), int64(0)
	if st.expireUS != 0 {
		tokens := int64(math.Floor(st.f))
		if tokens < 0 {
			tokens = 0
		}
		e := now - st.a
		if e < 0 {
			e = 0
		}
		if tokens < c.Burst {
			need := c.Burst - tokens
			fi, ff := t.times(need)
			if e < fi || (e == fi && ff > 0) {
				k := t.refilled(e, need-1)
				ki, kf := t.times(k)
				have, ri, rf = tokens+k, e-ki, 0
				if kf > 0 {
					ri, rf = ri-1, c.Limit-kf
				}
			}
		}
	}
	reset := t.after(c.Burst-have, ri, rf)
	switch {
	case c.Cost > c.Burst:
		return Result{Remaining: have, ResetUS: reset, RetryUS: NeverFits}, state{}, false
	case c.Cost == 0:
		return Result{Allowed: true, Remaining: have, ResetUS: reset}, state{}, false
	case have < c.Cost:
		return Result{Remaining: have, ResetUS: reset, RetryUS: t.after(c.Cost-have, ri, rf)}, state{}, false
	}
	left := have - c.Cost
	// stored state: left tokens at now - ri (rf is the dropped sub-µs part)
	ttl := t.after(c.Burst-left, ri, 0)
	r := Result{Allowed: true, Remaining: left, ResetUS: ttl}
	return r, state{expireUS: now + ttl, a: now - ri, f: float64(left)}, true
}

func init() { algos[TokenBucket] = tokenBucket }
