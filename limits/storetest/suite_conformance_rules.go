package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

func ruleChangeCarriesCounts(t *testing.T, s Store) {
	start := ruleChangeEpoch() + limits.PeriodUS(10*time.Second)
	cases := ruleChanges
	for _, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
		for _, b := range bucketRuleChanges {
			cases = append(cases[:len(cases):len(cases)], ruleChange{algo, b.name, b.phases})
		}
	}
	for _, tc := range cases {
		t.Run(string(tc.algo)+"/"+tc.name, func(t *testing.T) {
			runPhases(t, s.Store, fmt.Sprintf("rg:{chg-%s:%s}:%s", tc.name, tc.algo, tc.algo.Suffix()), tc.algo, start, tc.phases)
		})
	}
}

// periodChangeGivesNoFreshQuota is the reported case, counted: an
// identity exhausted under 10 per minute, then the period overridden to 2m
// and to 5m within a second. Every algorithm admits nothing more within the
// second; the window algorithms and the log admit nothing more for the rest
// of the 5-minute window either (the 10 stay in force: at most 10 within
// the 5-minute rule), and sliding_log not until its entries are 5 minutes
// old.
func periodChangeGivesNoFreshQuota(t *testing.T, s Store) {
	w := ruleChangeEpoch()
	for _, algo := range limits.Algorithms {
		t.Run(string(algo), func(t *testing.T) {
			c := limits.Check{Key: "rg:{fresh:" + string(algo) + "}:" + algo.Suffix(), Algorithm: algo, Limit: 10, Burst: 10, Cost: 1}
			send := func(p time.Duration, now int64, n int) (admitted int) {
				c.PeriodUS = limits.PeriodUS(p)
				for i := 0; i < n; i++ {
					if DecideOne(t, s.Store, c, now).Allowed {
						admitted++
					}
				}
				return admitted
			}
			t0 := w + limits.PeriodUS(10*time.Second)
			if got := send(time.Minute, t0, 20); got != 10 {
				t.Fatalf("under 10 per minute: %d of 20 admitted, want 10", got)
			}
			if got := send(2*time.Minute, t0+300_000, 20) + send(5*time.Minute, t0+600_000, 20); got != 0 {
				t.Fatalf("after the period changed to 2m, then 5m: %d more admitted within the second, want 0", got)
			}
			if algo.UsesBurst() {
				return // a bucket refills at 10 per 5m from here (TestRuleChangeCarriesCounts)
			}
			total := 10
			for now := t0 + limits.PeriodUS(time.Second); now < w+limits.PeriodUS(5*time.Minute); now += limits.PeriodUS(5 * time.Second) {
				total += send(5*time.Minute, now, 10)
			}
			if total > 10 {
				t.Fatalf("%d admitted within the 5-minute window [W, W+5m), want <= 10", total)
			}
		})
	}
}

// ruleChange is one algorithm's timeline of rule changes.
type ruleChange struct {
	algo   limits.Algorithm
	name   string
	phases []phase
}

// ruleChanges: per algorithm, "grow" is the brief's case (10 per minute
// exhausted, then period 2m, then 5m), "shrink" a 5m rule shortened to 1m,
// "limit" a larger then a smaller limit, "burst" (gcra, token_bucket) a
// larger then a smaller burst.
var ruleChanges = []ruleChange{
	{limits.FixedWindow, "grow", []phase{
		{10, d("1m0s"), 10, cat(
			admits(0, 10, 9, d("50s"), 0),           // from t=W+10s
			one(0, 1, false, 0, d("50s"), d("50s")), // t=W+10s
		)},
		{10, d("2m0s"), 10, cat(
			one(d("500ms"), 1, false, 0, d("1m49.5s"), d("1m49.5s")), // t=W+10.5s
		)},
		{10, d("5m0s"), 10, cat(
			one(d("500ms"), 1, false, 0, d("4m49s"), d("4m49s")), // t=W+11s
			one(d("1m0s"), 1, false, 0, d("3m49s"), d("3m49s")),  // t=W+1m11s
			one(d("3m49s"), 1, true, 9, 0, d("5m0s")),            // t=W+5m0s
		)},
	}},
	{limits.FixedWindow, "shrink", []phase{
		{10, d("5m0s"), 10, cat(
			admits(0, 10, 9, d("4m50s"), 0),             // from t=W+10s
			one(0, 1, false, 0, d("4m50s"), d("4m50s")), // t=W+10s
		)},
		{10, d("1m0s"), 10, cat(
			one(d("1m0s"), 1, false, 0, d("3m50s"), d("3m50s")), // t=W+1m10s
			one(d("3m50s"), 1, true, 9, 0, d("1m0s")),           // t=W+5m0s
			admits(d("30s"), 6, 8, d("30s"), 0),                 // from t=W+5m30s
		)},
	}},
	{limits.FixedWindow, "limit", []phase{
		{10, d("1m0s"), 10, cat(
			admits(0, 6, 9, d("50s"), 0), // from t=W+10s
		)},
		{15, d("1m0s"), 15, cat(
			admits(d("1s"), 9, 8, d("49s"), 0),      // from t=W+11s
			one(0, 1, false, 0, d("49s"), d("49s")), // t=W+11s
		)},
		{5, d("1m0s"), 5, cat(
			one(d("1s"), 1, false, 0, d("48s"), d("48s")), // t=W+12s
			one(d("40s"), 1, false, 0, d("8s"), d("8s")),  // t=W+52s
			one(d("10s"), 1, true, 4, 0, d("58s")),        // t=W+1m2s
		)},
	}},
	{limits.SlidingLog, "grow", []phase{
		{10, d("1m0s"), 10, cat(
			admits(0, 10, 9, d("1m0s"), 0),            // from t=W+10s
			one(0, 1, false, 0, d("1m0s"), d("1m0s")), // t=W+10s
		)},
		{10, d("2m0s"), 10, cat(
			one(d("500ms"), 1, false, 0, d("1m59.5s"), d("1m59.5s")), // t=W+10.5s
		)},
		{10, d("5m0s"), 10, cat(
			one(d("500ms"), 1, false, 0, d("4m59s"), d("4m59s")), // t=W+11s
			one(d("1m0s"), 1, false, 0, d("3m59s"), d("3m59s")),  // t=W+1m11s
			one(d("3m49s"), 1, false, 0, d("10s"), d("10s")),     // t=W+5m0s
			one(d("10s"), 1, true, 9, 0, d("5m0s")),              // t=W+5m10s: the t0 entries have left
		)},
	}},
	{limits.SlidingLog, "shrink", []phase{
		{10, d("5m0s"), 10, cat(
			admits(0, 10, 9, d("5m0s"), 0),            // from t=W+10s
			one(0, 1, false, 0, d("5m0s"), d("5m0s")), // t=W+10s
		)},
		{10, d("1m0s"), 10, cat(
			one(d("1m0s"), 1, true, 9, 0, d("1m0s")),  // t=W+1m10s
			one(d("3m50s"), 1, true, 9, 0, d("1m0s")), // t=W+5m0s
			admits(d("30s"), 6, 8, d("1m0s"), 0),      // from t=W+5m30s
		)},
	}},
	{limits.SlidingLog, "limit", []phase{
		{10, d("1m0s"), 10, cat(
			admits(0, 6, 9, d("1m0s"), 0), // from t=W+10s
		)},
		{15, d("1m0s"), 15, cat(
			admits(d("1s"), 9, 8, d("1m0s"), 0),      // from t=W+11s
			one(0, 1, false, 0, d("59s"), d("1m0s")), // t=W+11s
		)},
		{5, d("1m0s"), 5, cat(
			one(d("1s"), 1, false, 0, d("59s"), d("59s")),  // t=W+12s
			one(d("40s"), 1, false, 0, d("19s"), d("19s")), // t=W+52s
			one(d("10s"), 1, false, 0, d("9s"), d("9s")),   // t=W+1m2s
			one(d("9s"), 1, true, 4, 0, d("1m0s")),         // t=W+1m11s: all 15 have left
		)},
	}},
	{limits.SlidingWindow, "grow", []phase{
		{10, d("1m0s"), 10, cat(
			admits(0, 10, 9, d("1m50s"), 0),           // from t=W+10s
			one(0, 1, false, 0, d("56s"), d("1m50s")), // t=W+10s
		)},
		{10, d("2m0s"), 10, cat(
			one(d("500ms"), 1, false, 0, d("2m1.5s"), d("3m49.5s")), // t=W+10.5s
		)},
		{10, d("5m0s"), 10, cat(
			one(d("500ms"), 1, false, 0, d("5m19s"), d("9m49s")), // t=W+11s
			one(d("1m0s"), 1, false, 0, d("4m19s"), d("8m49s")),  // t=W+1m11s
			one(d("3m49s"), 1, false, 0, d("30s"), d("5m0s")),    // t=W+5m0s
		)},
	}},
	{limits.SlidingWindow, "shrink", []phase{
		{10, d("5m0s"), 10, cat(
			admits(0, 10, 9, d("9m50s"), 0),             // from t=W+10s
			one(0, 1, false, 0, d("5m20s"), d("9m50s")), // t=W+10s
		)},
		{10, d("1m0s"), 10, cat(
			one(d("1m0s"), 1, false, 0, d("3m56s"), d("4m50s")), // t=W+1m10s
			one(d("3m50s"), 1, false, 0, d("6s"), d("1m0s")),    // t=W+5m0s
			admits(d("30s"), 5, 4, d("1m30s"), 0),               // from t=W+5m30s
			one(0, 1, false, 0, d("6s"), d("1m30s")),            // t=W+5m30s
		)},
	}},
	{limits.SlidingWindow, "limit", []phase{
		{10, d("1m0s"), 10, cat(
			admits(0, 6, 9, d("1m50s"), 0), // from t=W+10s
		)},
		{15, d("1m0s"), 15, cat(
			admits(d("1s"), 9, 8, d("1m49s"), 0),      // from t=W+11s
			one(0, 1, false, 0, d("53s"), d("1m49s")), // t=W+11s
		)},
		{5, d("1m0s"), 5, cat(
			one(d("1s"), 1, false, 0, d("1m32.000001s"), d("1m48s")), // t=W+12s
			one(d("40s"), 1, false, 0, d("52.000001s"), d("1m8s")),   // t=W+52s
			one(d("10s"), 1, false, 0, d("42.000001s"), d("58s")),    // t=W+1m2s
		)},
	}},
}

// bucketRuleChanges are the timelines of gcra and token_bucket, which
// answer them alike (cost 1: one token is one emission interval), so both
// run this one table.
var bucketRuleChanges = []struct {
	name   string
	phases []phase
}{
	{"grow", []phase{
		{10, d("1m0s"), 10, cat(
			admits(0, 10, 9, d("6s"), d("6s")),      // from t=W+10s
			one(0, 1, false, 0, d("6s"), d("1m0s")), // t=W+10s
		)},
		// what was used carries over in units: 9 whole and 5.5 s of the
		// next 6 s one are 9 of 12 s and 11 s
		{10, d("2m0s"), 10, cat(
			one(d("500ms"), 1, false, 0, d("11s"), d("1m59s")), // t=W+10.5s
		)},
		{10, d("5m0s"), 10, cat(
			one(d("500ms"), 1, false, 0, d("26.25s"), d("4m56.25s")), // t=W+11s
			one(d("1m0s"), 1, true, 1, 0, d("4m26.25s")),             // t=W+1m11s
			one(d("3m49s"), 1, true, 7, 0, d("1m7.25s")),             // t=W+5m0s
		)},
	}},
	{"shrink", []phase{
		{10, d("5m0s"), 10, cat(
			admits(0, 10, 9, d("30s"), d("30s")),     // from t=W+10s
			one(0, 1, false, 0, d("30s"), d("5m0s")), // t=W+10s
		)},
		// 8 of the 10 units are still queued a minute on (30 s each):
		// 48 s at 6 s each, so 2 are free
		{10, d("1m0s"), 10, cat(
			one(d("1m0s"), 1, true, 1, 0, d("54s")),  // t=W+1m10s
			one(d("3m50s"), 1, true, 9, 0, d("6s")),  // t=W+5m0s
			admits(d("30s"), 6, 9, d("6s"), d("6s")), // from t=W+5m30s
		)},
	}},
	{"limit", []phase{
		{10, d("1m0s"), 10, cat(
			admits(0, 6, 9, d("6s"), d("6s")), // from t=W+10s
		)},
		// 5 whole units and 5 s of the next 6 s one are 5 of 4 s and
		// 3.333334 s: 9 more fit under 15
		{15, d("1m0s"), 15, cat(
			admits(d("1s"), 9, 8, d("27.333334s"), d("4s")),      // from t=W+11s
			one(0, 1, false, 0, d("3.333334s"), d("59.333334s")), // t=W+11s
		)},
		// 14 whole units and 2.333334 s are 14 of 12 s and 7.000002 s:
		// more than the burst of 5 holds, waited out
		{5, d("1m0s"), 5, cat(
			one(d("1s"), 1, false, 0, d("2m7.000002s"), d("2m55.000002s")),   // t=W+12s
			one(d("40s"), 1, false, 0, d("1m27.000002s"), d("2m15.000002s")), // t=W+52s
			one(d("1m27.000002s"), 1, true, 0, 0, d("1m0s")),                 // t=W+2m19.000002s
		)},
	}},
	{"burst", []phase{
		{10, d("1m0s"), 10, cat(
			admits(0, 10, 9, d("6s"), d("6s")),      // from t=W+10s
			one(0, 1, false, 0, d("6s"), d("1m0s")), // t=W+10s
		)},
		{10, d("1m0s"), 20, cat(
			admits(d("1s"), 10, 9, d("1m5s"), d("6s")), // from t=W+11s
			one(0, 1, false, 0, d("5s"), d("1m59s")),   // t=W+11s
		)},
		// what was used beyond the smaller burst is waited out, not forgiven
		{10, d("1m0s"), 5, cat(
			one(d("1s"), 1, false, 0, d("1m34s"), d("1m58s")), // t=W+12s
			one(d("6s"), 1, false, 0, d("1m28s"), d("1m52s")), // t=W+18s
			one(d("1m28s"), 1, true, 0, 0, d("30s")),          // t=W+1m46s
		)},
	}},
}

func runPhases(t *testing.T, s limits.Store, key string, algo limits.Algorithm, start int64, phases []phase) {
	t.Helper()
	now := start
	for pi, ph := range phases {
		c := limits.Check{Key: key, Algorithm: algo, Limit: ph.limit, PeriodUS: limits.PeriodUS(ph.period), Burst: ph.burst}
		for i, st := range ph.steps {
			now += int64(st.advance / time.Microsecond)
			c.Cost = st.cost
			r := DecideOne(t, s, c, now)
			got := Step{advance: st.advance, cost: st.cost, wantAllowed: r.Allowed, wantRemaining: r.Remaining,
				wantRetry: time.Duration(r.RetryUS) * time.Microsecond, wantReset: time.Duration(r.ResetUS) * time.Microsecond}
			if got != st {
				t.Fatalf("phase %d (L=%d P=%v B=%d) step %d (t=start+%v): got %+v\nwant %+v", pi, ph.limit, ph.period, ph.burst, i,
					time.Duration(now-start)*time.Microsecond, got, st)
			}
		}
	}
}

// ruleChangeEpoch returns W: a 10-minute boundary ahead of the wall clock.
func ruleChangeEpoch() int64 {
	return WindowStart(10*time.Minute) + limits.PeriodUS(10*time.Minute)
}

// phase is a rule's numbers and the requests sent under them.
type phase struct {
	limit  int64
	period time.Duration
	burst  int64
	steps  []Step
}

func d(s string) time.Duration {
	v, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return v
}

// one is one request of cost c and what it must get.
func one(advance time.Duration, c int64, allowed bool, remaining int64, retry, reset time.Duration) []Step {
	return []Step{{advance, c, allowed, remaining, retry, reset}}
}

// admits is n admitted requests of cost 1, the first after advance, the
// rest at the same instant: remaining counts down from rem, reset starts at
// reset and grows by dr per request.
func admits(advance time.Duration, n int, rem int64, reset, dr time.Duration) []Step {
	out := make([]Step, n)
	for i := range out {
		out[i] = Step{0, 1, true, rem - int64(i), 0, reset + time.Duration(i)*dr}
	}
	out[0].advance = advance
	return out
}

func cat(parts ...[]Step) []Step {
	var out []Step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// mixedBurstsHoldTheLooser is a fleet mid-reload: two instances decide on
// one key under the same rate with bursts 10 and 1, a client alternating
// between them every 60 ms for 2 s. The fleet admits no more than the
// looser rule alone (10, then one a second: 12). The tighter side's
// denials once wrote their capped backlog, which the looser side read as
// a nearly empty bucket: 30 of 33.
func mixedBurstsHoldTheLooser(t *testing.T, s Store) {
	for _, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
		t.Run(string(algo), func(t *testing.T) {
			key := "rg:{mixed-burst:" + string(algo) + "}:" + algo.Suffix()
			loose := limits.Check{Key: key, Algorithm: algo, Limit: 1, PeriodUS: limits.PeriodUS(time.Second), Burst: 10, Cost: 1}
			tight := loose
			tight.Burst = 1
			start := ruleChangeEpoch() + limits.PeriodUS(10*time.Second)
			admitted, sent := 0, 0
			for at := int64(0); at <= 2_000_000; at += 60_000 {
				c := loose
				if sent%2 == 1 {
					c = tight
				}
				sent++
				r := DecideOne(t, s.Store, c, start+at)
				if r.Allowed {
					admitted++
					continue
				}
				if r.RetryUS <= 0 {
					t.Fatalf("a denial at +%dms under burst %d without a retry: %+v", at/1000, c.Burst, r)
				}
			}
			if admitted > 12 {
				t.Fatalf("%d of %d admitted in 2 s under bursts 10 and 1 at 1/s, want at most 12 (the looser alone)", admitted, sent)
			}
			if admitted < 11 {
				t.Fatalf("%d of %d admitted in 2 s, want the looser side's burst and refill (11 or 12)", admitted, sent)
			}
		})
	}
}

// mixedRatesHoldTheLoosest is a fleet mid-reload with two rates on one
// key: requests alternate between the two numbers for 2 s. What was used
// carries over in units both ways, so the fleet admits no more than the
// loosest numbers of the two (the larger burst, then the faster rate),
// and a busy key does not stall: reading each other's records by time
// under a cap, two rates once converted them to the stricter reading
// round after round (100/s and 110/s with burst 100: 61 admitted in 2 s,
// none after the first 50 ms), and two bursts and rates together
// admitted several times either rule.
func mixedRatesHoldTheLoosest(t *testing.T, s Store) {
	for _, tc := range []struct {
		name    string
		a, b    [3]int64 // limit, period µs, burst
		every   int64    // µs between requests
		atLeast int
	}{
		{"busy", [3]int64{100, 1_000_000, 100}, [3]int64{110, 1_000_000, 100}, 2_000, 300},
		{"crossed", [3]int64{10, 1_000_000, 2}, [3]int64{2, 1_000_000, 20}, 20_000, 21},
		{"periods", [3]int64{5, 1_000_000, 5}, [3]int64{30, 10_000_000, 30}, 10_000, 10},
	} {
		for _, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
			t.Run(string(algo)+"/"+tc.name, func(t *testing.T) {
				key := "rg:{mixed-rate-" + tc.name + ":" + string(algo) + "}:" + algo.Suffix()
				side := func(n [3]int64) limits.Check {
					return limits.Check{Key: key, Algorithm: algo, Limit: n[0], PeriodUS: n[1], Burst: n[2], Cost: 1}
				}
				a, b := side(tc.a), side(tc.b)
				start := ruleChangeEpoch() + limits.PeriodUS(10*time.Second)
				const window = 2_000_000
				admitted, sent := 0, 0
				for at := int64(0); at < window; at += tc.every {
					c := a
					if sent%2 == 1 {
						c = b
					}
					sent++
					if DecideOne(t, s.Store, c, start+at).Allowed {
						admitted++
					}
				}
				// the loosest of both: the larger burst at once, then the
				// faster rate over the window
				rate := max(float64(tc.a[0])/float64(tc.a[1]), float64(tc.b[0])/float64(tc.b[1]))
				bound := int(max(tc.a[2], tc.b[2])) + int(rate*window) + 1
				t.Logf("%d of %d admitted in 2 s; the loosest numbers of both allow %d", admitted, sent, bound)
				if admitted > bound {
					t.Fatalf("%d of %d admitted in 2 s between %v and %v, want at most %d (the larger burst, then the faster rate)", admitted, sent, tc.a, tc.b, bound)
				}
				if admitted < tc.atLeast {
					t.Fatalf("%d of %d admitted in 2 s between %v and %v, want at least %d (what the stricter alone admits)", admitted, sent, tc.a, tc.b, tc.atLeast)
				}
			})
		}
	}
}
