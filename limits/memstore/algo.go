package memstore

import (
	"github.com/rategate/rategate/limits"
)

// This file holds the Go twins of the Lua scripts in lua/: the in-memory
// store runs them, and their arithmetic is written to match the scripts
// operation for operation so that the same timeline gives the same decisions
// on both stores. Every function reads a state and returns the result and
// the state to store if the request is admitted; the only change it makes
// to the state it reads is the rewrite a script makes while it decides (a
// record written under another limit or period, see normalized).

// state is one key's stored value in the memory store. Which fields mean what
// depends on the algorithm that owns the key (the key suffix names it); the
// field names in brackets are the Redis hash fields of the same values.
type state struct {
	// expireUS is when the key vanishes (store clock); 0 = absent.
	expireUS int64
	// fixed_window: a = the end of the window the count was counted in [e],
	// b = the count [n].
	// sliding_window: a = the end of the current count's window [e], b = the
	// current count [c], c = the previous count [p], d = the period both
	// were counted under [d].
	// gcra: a = theoretical arrival time, whole µs [t]; b = its fraction in
	// 1/L µs [f]; c, d = the limit and period it was written under [l, p].
	// token_bucket: a = the time the stored count refers to, µs [ts]; b = the
	// whole tokens then [tokens]; c, d, e = the limit, period and burst it
	// was written under [l, p, b].
	a, b, c, d, e int64
	// sliding_log: the admitted requests of the last period, oldest first;
	// a = the capacity of the array behind log, from its first element
	// (log may start inside it: keepLog).
	log []logEntry
	// a lease record (memlease.go): the slices not yet ended.
	lease []memSlice
}

// logEntry is one admitted request of a sliding log: its time, its cost and
// the running total of the costs admitted to the key up to and including it
// (the K of the Redis member).
type logEntry struct {
	at, cost, k int64
}

// outcome is what an algorithm decided for one check.
type outcome struct {
	r limits.Result
	// next is the state to store when the whole request is admitted and
	// commit is set.
	next   state
	commit bool
	// normalized says the algorithm rewrote the state it read (*st) the way
	// its script rewrites a record written under another limit or period:
	// the rewritten state is stored whatever the request's verdict. It is
	// only ever set for checks that cost something.
	normalized bool
}

// algoFunc decides one check against the current state of its key (expired
// states are passed as the zero state). solo says the check is the request's
// only one, as decide.lua tells its scripts.
type algoFunc func(st *state, now int64, c *limits.Check, solo bool) outcome

// algos maps each algorithm to its Go implementation. Algorithms register
// themselves from their own file's init.
var algos = map[limits.Algorithm]algoFunc{}

// floorDiv is Lua's math.floor(x / y) for y > 0, also for negative x.
func floorDiv(x, y int64) int64 {
	q := x / y
	if x%y < 0 {
		q--
	}
	return q
}

// fixedWindow: window [ws, we) with ws = floor(now/P)*P; allow iff
// count + c <= L. The count is in force while now < e, the end of the window
// it was counted in, and the key expires at e. A count from a shorter window
// (the period grew) is in force to we: the first decision that costs
// something moves e there (see lua/fixed_window.lua).
func fixedWindow(st *state, now int64, c *limits.Check, _ bool) outcome {
	we := floorDiv(now, c.PeriodUS)*c.PeriodUS + c.PeriodUS
	var count, e int64
	norm := false
	if st.expireUS > now && st.a > now {
		count, e = st.b, st.a
		if e < we {
			e = we
			if c.Cost > 0 {
				st.a, st.expireUS = we, we
				norm = true
			}
		}
	}
	end := we
	if e != 0 {
		end = e
	}
	reset := end - now
	if count+c.Cost > c.Limit {
		r := limits.Result{Remaining: max(c.Limit-count, 0), ResetUS: reset, RetryUS: reset}
		if c.Cost > c.Limit {
			r.RetryUS = limits.NeverFits
		}
		if count == 0 {
			r.ResetUS = 0
		}
		return outcome{r: r, normalized: norm}
	}
	count += c.Cost
	if count == 0 {
		// A zero-cost peek on an empty window: nothing to restore.
		return outcome{r: limits.Result{Allowed: true, Remaining: c.Limit}, normalized: norm}
	}
	r := limits.Result{Allowed: true, Remaining: c.Limit - count, ResetUS: reset}
	if c.Cost == 0 {
		return outcome{r: r, normalized: norm}
	}
	return outcome{r: r, next: state{expireUS: end, a: end, b: count}, commit: true, normalized: norm}
}

func init() { algos[limits.FixedWindow] = fixedWindow }
