package memstore

import (
	"sort"

	"github.com/rategate/rategate/limits"
)

// slTrim is how many departed entries an admission drops at most, as
// lua/sliding_log.lua's sliding_log_put does.
const slTrim = 128

// slidingLog is the twin of lua/sliding_log.lua: the exact log of the
// requests admitted in the window (now-P, now]. Allow iff the costs still in
// the window plus c fit in L; then append {now, c}.
//
// The log is kept in admission order, which is time order (an entry is timed
// max(now, newest)), and every entry carries the running total k of the
// costs admitted up to and including it, as the Redis members do. So the
// window's sum is k(newest) - (k(oldest) - cost(oldest)), the oldest entry in
// the window is found by binary search, and so is a denial's retry: the
// first entry whose k reaches k(oldest) - cost(oldest) + need. Entries that
// have left are dropped by admissions only, as many as the script drops (up
// to slTrim, the oldest first, or all of them when none is left in the
// window), so both stores hold the same entries whatever the verdicts, and
// count the same ones after a longer period or a clock step back.
//
// st.log aliases the stored state, so it is only read: an admission appends
// to the slice of the entries it keeps, which at most writes past the stored
// length, where nothing reads; a request that is then denied by another rule
// leaves the stored log exactly as it was.
func slidingLog(st *state, now int64, c *limits.Check, solo bool) outcome {
	var log []logEntry
	if st.expireUS > now {
		log = st.log
	}
	cut := now - c.PeriodUS
	i := sort.Search(len(log), func(j int) bool { return log[j].at > cut })
	live := log[i:]
	var used, base, lastk, last int64
	if len(live) > 0 {
		base = live[0].k - live[0].cost
		newest := log[len(log)-1]
		lastk, last = newest.k, newest.at
		used = lastk - base
	}
	norm := false
	// keep is sl_keep: the key lives until its newest entry leaves this
	// rule's window, if it would expire earlier (a longer period).
	keep := func() {
		if exp := last + c.PeriodUS; st.expireUS < exp {
			st.expireUS = exp
			norm = true
		}
	}

	if used+c.Cost > c.Limit {
		r := limits.Result{Remaining: max(c.Limit-used, 0), RetryUS: limits.NeverFits}
		if len(live) > 0 {
			r.ResetUS = last + c.PeriodUS - now
		}
		if c.Cost <= c.Limit {
			// 1 <= need <= used because cost <= limit, so the entry exists.
			need := used + c.Cost - c.Limit
			j := sort.Search(len(live), func(j int) bool { return live[j].k-base >= need })
			r.RetryUS = live[j].at + c.PeriodUS - now
		}
		if c.Cost > 0 && len(live) > 0 {
			keep()
		}
		return outcome{r: r, normalized: norm}
	}

	if c.Cost == 0 {
		r := limits.Result{Allowed: true, Remaining: c.Limit - used}
		if len(live) > 0 {
			r.ResetUS = last + c.PeriodUS - now
		}
		return outcome{r: r}
	}
	if len(live) > 0 && !solo {
		keep()
	}
	// After a clock step back the newest entry can be later than now.
	at := now
	if len(live) > 0 && last > now {
		at = last
	}
	reset := at + c.PeriodUS - now
	entry := logEntry{at: at, cost: c.Cost, k: lastk + c.Cost}
	next := state{expireUS: at + c.PeriodUS, log: []logEntry{entry}, a: 1}
	if len(live) > 0 {
		next.log, next.a = keepLog(log[min(i, slTrim):], st.a, entry)
	}
	r := limits.Result{Allowed: true, Remaining: c.Limit - used - c.Cost, ResetUS: reset}
	return outcome{r: r, next: next, commit: true, normalized: norm}
}

// keepLog returns kept with entry appended, and the capacity of the array
// behind it, from its first element (state.a of a sliding_log): kept
// starts inside an array of capacity full, the entries before it dropped
// (reslicing leaves them in the array). When most of that array lies
// unused (its capacity at least 4 times the entries, and past 64), the
// entries move to an array of twice their number: the store weighs a log
// by its array (weight), and an array kept whole behind a few live entries
// is memory the bound would not see. A move copies the entries once per
// three quarters of the array dropped: O(1) per admission.
func keepLog(kept []logEntry, full int64, entry logEntry) ([]logEntry, int64) {
	n := int64(len(kept)) + 1
	if full >= 4*n && full > 64 {
		fresh := make([]logEntry, len(kept), 2*n)
		copy(fresh, kept)
		kept = fresh
		full = int64(cap(fresh))
	}
	next := append(kept, entry)
	if cap(next) != cap(kept) {
		// a new array, which next starts
		full = int64(cap(next))
	}
	return next, max(full, int64(cap(next)))
}

func init() { algos[limits.SlidingLog] = slidingLog }
