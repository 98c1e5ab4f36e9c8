package memstore

import (
	"math"

	"github.com/rategate/rategate/limits"
)

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

// level is tb_level: the whole tokens a bucket of capacity limit holds at
// now when it held tokens at ts, and rho = ri + rf/L, the time already
// earned towards the next one (0 when full).
func (t interval) level(tokens, ts, now, capacity int64) (have, ri, rf int64) {
	if tokens >= capacity {
		return capacity, 0, 0
	}
	e := max(now-ts, 0)
	need := capacity - tokens
	if fi, ff := t.times(need); e > fi || (e == fi && ff == 0) {
		return capacity, 0, 0
	}
	k := t.refilled(e, need-1)
	ki, kf := t.times(k)
	if kf > 0 {
		return tokens + k, e - ki - 1, t.l - kf
	}
	return tokens + k, e - ki, 0
}

// convert is tb_convert: the level at now, under t and burst, of a bucket
// of tokens at ts written under limit sl, period sp and burst sb: whole
// tokens (below 0 when more was used than burst holds), rho = ri + rf/L
// µs earned towards the next one, and whether the debt was held at the
// bound (not to be written); what was used is carried in tokens, and
// under another rate rho is scaled to t, rounded down.
func (t interval) convert(tokens, ts, sl, sp, sb, now, burst int64) (have, ri, rf int64, held bool) {
	if sl == t.l && sp == t.p {
		have, ri, rf = t.level(tokens, ts, now, sb)
		if sb == burst {
			return have, ri, rf, false
		}
		if have = have - sb + burst; have >= burst {
			return burst, 0, 0, false
		}
		return have, ri, 0, false
	}
	old := newInterval(sl, sp)
	h, hri, hrf := old.level(tokens, ts, now, sb)
	if have = h - sb + burst; have >= burst {
		return burst, 0, 0, false
	}
	// a debt is read within 2^45 µs of refill and 2^30 tokens, and then
	// not written back (held)
	if most := t.refilled(1<<45, 1<<30-1); burst-have > most {
		have, held = burst-most, true
	}
	if hri > 0 || hrf > 0 {
		// rho at t: T less the rest of the token still to refill, scaled
		// as backlog scales gcra's part-unit (equal to the µs)
		xi, xf := old.q-hri, old.r-hrf
		if xf < 0 {
			xi, xf = xi-1, xf+sl
		}
		whole, _ := t.times(1)
		x := float64(float64(float64(xi)+float64(float64(xf)/float64(sl)))*float64(float64(t.p)/float64(t.l))) / float64(float64(sp)/float64(sl))
		ri = min(max(whole-int64(math.Ceil(x)), 0), max(whole-1, 0))
	}
	return have, ri, 0, held
}

// tokenBucket: capacity B refilled at L per P, starting full; allow iff
// tokens_now >= c, then take c. The state is a = ts (µs), b = the whole
// tokens at ts, c, d, e = the limit, period and burst it was written under;
// the key expires when the bucket is full again. A bucket written under
// other numbers keeps what was used (brought up to now at its old rate,
// convert); under another rate it is rewritten by the first decision that
// costs something unless below empty, under another burst only by an
// admission.
func tokenBucket(st *state, now int64, c *limits.Check, _ bool) outcome {
	t := newInterval(c.Limit, c.PeriodUS)
	// have = whole tokens now; rho = ri + rf/L µs earned towards the next one
	have, ri, rf := c.Burst, int64(0), int64(0)
	norm := false
	if st.expireUS > now {
		tokens := st.b
		sl, sp, sb := st.c, st.d, st.e
		if sl == 0 {
			sl = c.Limit
		}
		if sp == 0 {
			sp = c.PeriodUS
		}
		if sb == 0 {
			sb = c.Burst
		}
		var held bool
		have, ri, rf, held = t.convert(tokens, st.a, sl, sp, sb, now, c.Burst)
		if c.Cost > 0 && (sl != c.Limit || sp != c.PeriodUS) && !held {
			*st = state{}
			if have < c.Burst {
				full := t.after(c.Burst-have, ri, 0)
				*st = state{expireUS: now + full, a: now - ri, b: have, c: c.Limit, d: c.PeriodUS, e: c.Burst}
			}
			norm = true
		}
	}
	reset := t.after(c.Burst-have, ri, rf)
	rem := max(have, 0)
	switch {
	case c.Cost > c.Burst:
		return outcome{r: limits.Result{Remaining: rem, ResetUS: reset, RetryUS: limits.NeverFits}, normalized: norm}
	case c.Cost == 0:
		return outcome{r: limits.Result{Allowed: true, Remaining: rem, ResetUS: reset}, normalized: norm}
	case have < c.Cost:
		return outcome{r: limits.Result{Remaining: rem, ResetUS: reset, RetryUS: t.after(c.Cost-have, ri, rf)}, normalized: norm}
	}
	left := have - c.Cost
	// stored state: left tokens at now - ri (rf is the dropped sub-µs part)
	ttl := t.after(c.Burst-left, ri, 0)
	r := limits.Result{Allowed: true, Remaining: left, ResetUS: ttl}
	next := state{expireUS: now + ttl, a: now - ri, b: left, c: c.Limit, d: c.PeriodUS, e: c.Burst}
	return outcome{r: r, next: next, commit: true, normalized: norm}
}

func init() { algos[limits.TokenBucket] = tokenBucket }
