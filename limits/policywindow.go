package limits

import "time"

// PolicyWindow returns the quota q and the window w, in whole seconds, that
// RateLimit-Policy states for a rule of limit per period. The draft's
// windows are whole seconds, so a period that is not one (500ms, 1500ms) is
// stated over the smallest whole number of periods that is: k periods, q =
// k*limit and w = k*period. The rate q/w is then exactly the rule's, and a
// fixed window admits exactly q in any w seconds that start on a window
// boundary. scaled reports k > 1.
//
//	5 per 1m       -> q=5;w=60
//	10 per 500ms   -> q=20;w=1     (2 periods)
//	7 per 1500ms   -> q=14;w=3     (2 periods)
//	1 per 999ms    -> q=1000;w=999 (1000 periods)
//
// period is a whole number of milliseconds, as config validation demands;
// k is then at most 1000. A finer period is rounded up to milliseconds.
func PolicyWindow(limit int64, period time.Duration) (q, w int64, scaled bool) {
	if period > 0 && period%time.Second == 0 {
		return limit, int64(period / time.Second), false
	}
	ms := max((int64(period)+int64(time.Millisecond)-1)/int64(time.Millisecond), 1)
	k := 1000 / gcd(ms, 1000)
	return k * limit, k * ms / 1000, k > 1
}

// gcd is the greatest common divisor of a, b > 0.
func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
