package limits

// This file holds the Go twins of the Lua scripts in lua/: the in-memory
// store runs them, and their arithmetic is written to match the scripts
// operation for operation so that the same timeline gives the same decisions
// on both stores. Every function is pure: it reads a state and returns the
// result and the state to store if the request is admitted.

// state is one key's stored value in the memory store. Which fields mean what
// depends on the algorithm that owns the key (the key suffix names it).
type state struct {
	// expireUS is when the key vanishes (store clock); 0 = absent.
	expireUS int64
	// fixed_window: a = window index, b = count.
	// sliding_window: a = window index, b = current count, c = previous count.
	// gcra: a = theoretical arrival time, whole µs; b = its fraction in 1/L µs.
	// token_bucket: a = the time the stored count refers to (µs), f = whole tokens.
	a, b, c int64
	f       float64
	// sliding_log: the admitted requests of the last period, oldest first.
	log []logEntry
}

// logEntry is one admitted request of a sliding log.
type logEntry struct {
	at   int64
	cost int64
}

// algoFunc decides one check against the current state of its key (expired
// states are passed as the zero state). It returns the result and the state
// to store when the request is admitted; when store is false nothing changes.
type algoFunc func(st *state, now int64, c *Check) (r Result, next state, store bool)

// algos maps each algorithm to its Go implementation. Algorithms register
// themselves from their own file's init.
var algos = map[Algorithm]algoFunc{}

// fixedWindow: window w = floor(now/P) aligned to the epoch; allow iff
// count_w + c <= L. The key expires at the end of its window.
func fixedWindow(st *state, now int64, c *Check) (Result, state, bool) {
	w := now / c.PeriodUS
	count := int64(0)
	if st.expireUS > now && st.a == w {
		count = st.b
	}
	end := (w + 1) * c.PeriodUS
	reset := end - now
	if count+c.Cost > c.Limit {
		r := Result{Remaining: c.Limit - count, ResetUS: reset, RetryUS: reset}
		if c.Cost > c.Limit {
			r.RetryUS = NeverFits
		}
		if count == 0 {
			r.ResetUS = 0
		}
		return r, state{}, false
	}
	count += c.Cost
	r := Result{Allowed: true, Remaining: c.Limit - count, ResetUS: reset}
	if count == 0 {
		// A zero-cost peek on an empty window: nothing to restore.
		r.ResetUS = 0
		return r, state{}, false
	}
	return r, state{expireUS: end, a: w, b: count}, true
}

func init() { algos[FixedWindow] = fixedWindow }
