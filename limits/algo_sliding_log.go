package limits

// slidingLog is the twin of lua/sliding_log.lua: the exact log of the
// requests admitted in the window (now-P, now]. Allow iff the costs still in
// the window plus c fit in L; then append {now, c}.
//
// The log is kept sorted by time, like the Redis sorted set, so trimming is
// a prefix and the retry walk goes oldest first. Entries that share a time
// may sit in a different order than in Redis (where ties sort by member), but
// nothing here depends on that order: the retry is the time of the entry at
// which the running sum of freed costs first covers the excess, and that time
// is the same for every order within a tie.
//
// st.log aliases the stored state, so it is only read: an admitted request
// gets a fresh slice (copy on write), and a request that is then denied by
// another rule leaves the stored log exactly as it was.
func slidingLog(st *state, now int64, c *Check) (Result, state, bool) {
	log := st.log
	if st.expireUS <= now {
		log = nil
	}
	cut := now - c.PeriodUS
	i := 0
	for i < len(log) && log[i].at <= cut {
		i++
	}
	live := log[i:]
	used := int64(0)
	for _, e := range live {
		used += e.cost
	}
	var last int64
	if len(live) > 0 {
		last = live[len(live)-1].at
	}

	if used+c.Cost > c.Limit {
		r := Result{Remaining: max(c.Limit-used, 0), RetryUS: NeverFits}
		if len(live) > 0 {
			r.ResetUS = last + c.PeriodUS - now
		}
		if c.Cost <= c.Limit {
			// need <= used because cost <= limit, so the walk always ends.
			need, freed := used+c.Cost-c.Limit, int64(0)
			for _, e := range live {
				freed += e.cost
				if freed >= need {
					r.RetryUS = e.at + c.PeriodUS - now
					break
				}
			}
		}
		return r, state{}, false
	}

	if c.Cost == 0 {
		r := Result{Allowed: true, Remaining: c.Limit - used}
		if len(live) > 0 {
			r.ResetUS = last + c.PeriodUS - now
		}
		return r, state{}, false
	}
	// After a clock step back the newest entry can be later than now.
	if len(live) == 0 || last < now {
		last = now
	}
	reset := last + c.PeriodUS - now
	j := len(live)
	for j > 0 && live[j-1].at > now {
		j--
	}
	next := make([]logEntry, 0, len(live)+1)
	next = append(next, live[:j]...)
	next = append(next, logEntry{at: now, cost: c.Cost})
	next = append(next, live[j:]...)
	r := Result{Allowed: true, Remaining: c.Limit - used - c.Cost, ResetUS: reset}
	return r, state{expireUS: now + reset, log: next}, true
}

func init() { algos[SlidingLog] = slidingLog }
