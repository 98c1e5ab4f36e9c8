package memstore

import (
	"math"

	"github.com/rategate/rategate/limits"
)

// This file holds gcra, the twin of lua/gcra.lua, and the exact interval
// arithmetic it shares with token_bucket.
//
// Rounding rule (both files): the decision is exact. T = P/L is held as
// q + r/L µs and a TAT as whole µs + f/L, so a fractional interval (L=3 per
// second; L=1e9 per ms, T = 1e-6 µs) neither drifts nor admits early, and a
// burst of B always fits on a fresh key. Only reported values are rounded,
// against the client: reset, retry and TTL up to the next µs, remaining down.
//
// Why int64 here matches the script: every value the script computes is an
// integer below 2^53 (bounds in the script's header: now < 2^52 µs,
// P <= 2^45 µs, L, B, c < 2^30, B*P/L <= 2^45 µs), so a Lua double holds it
// exactly and int64 arithmetic gives the same numbers. The script's divisions
// are math.floor(x / y) with 0 <= x < 2^53, which is the exact quotient (the
// gap to the next integer, >= 1/y, exceeds the rounding error, x/y * 2^-53),
// i.e. Go's x / y. The floating estimates (interval.count, interval.refilled)
// are corrected to the exact answer before use, and are computed with the same
// float64 operations anyway, each rounded separately (no fused multiply-add).

// interval is a period divided by a limit, T = P/L = q + r/L µs, 0 <= r < L.
type interval struct {
	q, r, l, p int64
}

func newInterval(limit, period int64) interval {
	q := period / limit
	return interval{q: q, r: period - q*limit, l: limit, p: period}
}

// times returns k*T as whole µs plus a numerator over L, for 0 <= k < 2^30.
// k*r can reach 2^60; k is split in 15-bit halves as in the script.
func (t interval) times(k int64) (whole, frac int64) {
	kh := k / 32768
	kl := k - kh*32768
	x := kh * t.r
	a1 := x / t.l
	s := (x-a1*t.l)*32768 + kl*t.r
	a2 := s / t.l
	return k*t.q + a1*32768 + a2, s - a2*t.l
}

// count returns the largest n in [0, hi] with n*T <= xi + xf/L.
func (t interval) count(xi, xf, hi int64) int64 {
	est := math.Floor(float64(float64(xi)*float64(t.l)+float64(xf)) / float64(t.p))
	if est > float64(hi) {
		est = float64(hi)
	}
	if est < 0 {
		est = 0
	}
	n := int64(est)
	for n > 0 {
		ni, nf := t.times(n)
		if ni < xi || (ni == xi && nf <= xf) {
			break
		}
		n--
	}
	for n < hi {
		ni, nf := t.times(n + 1)
		if ni > xi || (ni == xi && nf > xf) {
			break
		}
		n++
	}
	return n
}

// left returns floor((tau - d) / T) where tau = ti + tf/L and d = di + df/L,
// or 0 when d > tau.
func (t interval) left(ti, tf, di, df, burst int64) int64 {
	xi, xf := ti-di, tf-df
	if xf < 0 {
		xi, xf = xi-1, xf+t.l
	}
	if xi < 0 {
		return 0
	}
	return t.count(xi, xf, burst)
}

// backlog is gc_backlog: the backlog d = tat - now (whole µs + numerator
// over L, >= 0) that a TAT tat + f/sl written under limit sl and period sp
// means under t: as it is when sl and sp are t's (even beyond the
// tolerance: a burst that shrank leaves what was used to wait out), else
// d in units of the old interval queued at t, rounded up to the µs.
// changed says the TAT is to be rewritten (the rate changed), held that
// it must not be (d read at t passes 2^45 µs).
func (t interval) backlog(tat, f, sl, sp, now, burst, ti, tf int64) (di, df int64, changed, held bool) {
	if sl == t.l && sp == t.p {
		if tat >= now {
			di, df = tat-now, f
		}
		return di, df, false, false
	}
	if tat < now || (tat == now && f == 0) {
		return 0, 0, true, false
	}
	xi := tat - now
	old := newInterval(sl, sp)
	n := old.count(xi, f, 1<<30-1)
	ni, nf := old.times(n)
	ri, rf := xi-ni, f-nf
	if rf < 0 {
		ri, rf = ri-1, rf+sl
	}
	if float64(float64(n)*float64(float64(t.p)/float64(t.l))) >= 1<<45 {
		// beyond 2^45 µs (407 days): read as that, never written so
		return 1 << 45, 0, false, true
	} else {
		di, df = t.times(n)
		if ri > 0 || rf > 0 {
			x := float64(float64(float64(ri)+float64(float64(rf)/float64(sl)))*float64(float64(t.p)/float64(t.l))) / float64(float64(sp)/float64(sl))
			di += int64(math.Ceil(x))
		}
	}
	return di, df, true, false
}

// gcra: T = P/L, tau = B*T; tat = max(stored, now), new = tat + c*T; allow iff
// new - now <= tau, then store new. The state is a = TAT in whole µs,
// b = its fraction in units of 1/L µs, c and d = the limit and period it was
// written under; the key expires when the TAT passes. A TAT written under
// another rate is converted (backlog) and rewritten by the first decision
// that costs something; under another burst it stands as it is.
func gcra(st *state, now int64, c *limits.Check, _ bool) outcome {
	t := newInterval(c.Limit, c.PeriodUS)
	ti, tf := t.times(c.Burst)
	// d = tat - now >= 0 as di + df/L; an absent key has a = 0, in the past.
	var di, df int64
	norm := false
	if st.expireUS > now {
		sl, sp := st.c, st.d
		if sl == 0 {
			sl = c.Limit
		}
		if sp == 0 {
			sp = c.PeriodUS
		}
		var changed bool
		di, df, changed, _ = t.backlog(st.a, st.b, sl, sp, now, c.Burst, ti, tf)
		if changed && c.Cost > 0 {
			*st = state{}
			if di > 0 || df > 0 {
				ttl := di
				if df > 0 {
					ttl++
				}
				*st = state{expireUS: now + ttl, a: now + di, b: df, c: c.Limit, d: c.PeriodUS}
			}
			norm = true
		}
	}
	reset := di
	if df > 0 {
		reset = di + 1
	}
	if c.Cost == 0 || c.Cost > c.Burst {
		r := limits.Result{Allowed: c.Cost == 0, Remaining: t.left(ti, tf, di, df, c.Burst), ResetUS: reset}
		if c.Cost != 0 {
			r.RetryUS = limits.NeverFits
		}
		return outcome{r: r, normalized: norm}
	}
	ci, cf := t.times(c.Cost)
	ni, nf := di+ci, df+cf
	if nf >= c.Limit {
		ni, nf = ni+1, nf-c.Limit
	}
	if ni > ti || (ni == ti && nf > tf) {
		retry := ni - ti
		if nf > tf {
			retry++
		}
		r := limits.Result{Remaining: t.left(ti, tf, di, df, c.Burst), ResetUS: reset, RetryUS: retry}
		return outcome{r: r, normalized: norm}
	}
	ttl := ni
	if nf > 0 {
		ttl = ni + 1
	}
	r := limits.Result{Allowed: true, Remaining: t.left(ti, tf, ni, nf, c.Burst), ResetUS: ttl}
	next := state{expireUS: now + ttl, a: now + ni, b: nf, c: c.Limit, d: c.PeriodUS}
	return outcome{r: r, next: next, commit: true, normalized: norm}
}

func init() { algos[limits.GCRA] = gcra }
