package storetest

import "testing"

// cases is the conformance suite: every case runs on each store, a fresh
// empty one per case, and must pass alike on all of them.
var cases = []struct {
	name string
	fn   func(t *testing.T, s Store)
}{
	{"RuleChangeCarriesCounts", ruleChangeCarriesCounts},
	{"PeriodChangeGivesNoFreshQuota", periodChangeGivesNoFreshQuota},
	{"MixedBurstsHoldTheLooser", mixedBurstsHoldTheLooser},
	{"MixedRatesHoldTheLoosest", mixedRatesHoldTheLoosest},
	{"SlowRateKeepsUnits", slowRateKeepsUnits},
	{"MixedRatesFarApart", mixedRatesFarApart},
	{"FixedWindowTimeline", fixedWindowTimeline},
	{"FixedWindowTTL", fixedWindowTTL},
	{"MultiRuleAllOrNothing", multiRuleAllOrNothing},
	{"ShadowRuleNeverDenies", shadowRuleNeverDenies},
	{"ConcurrentAdmitsExactlyLimit", concurrentAdmitsExactlyLimit},
	{"GCRATimeline", gcraTimeline},
	{"GCRAFractionalInterval", gcraFractionalInterval},
	{"GCRATTL", gcraTTL},
	{"WindowBoundaryBehaviour", windowBoundaryBehaviour},
	{"SlidingLogTimeline", slidingLogTimeline},
	{"SlidingLogSameMicrosecond", slidingLogSameMicrosecond},
	{"SlidingLogNeverExceedsLimit", slidingLogNeverExceedsLimit},
	{"SlidingLogTTL", slidingLogTTL},
	{"SlidingDeniedByOtherRuleConsumesNothing", slidingDeniedByOtherRuleConsumesNothing},
	{"SlidingWindowTimeline", slidingWindowTimeline},
	{"SlidingWindowTTL", slidingWindowTTL},
	{"SlidingWindowFloatConvention", slidingWindowFloatConvention},
	{"RecordRaw", recordRaw},
	{"TokenBucketTimeline", tokenBucketTimeline},
	{"TokenBucketFractionalRefill", tokenBucketFractionalRefill},
	{"TokenBucketTTL", tokenBucketTTL},
}

// Run runs every conformance case as a subtest of t against a store open
// returns: it is called once per case and must return a fresh, empty store
// (closed at the case's cleanup).
func Run(t *testing.T, open func(t *testing.T) Store) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open(t)) })
	}
}
