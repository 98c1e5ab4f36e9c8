package metrics

import (
	"fmt"
	"io"

	vm "github.com/VictoriaMetrics/metrics"

	"github.com/rategate/rategate/limits"
)

// LeaseSource is what the lease metrics read at each scrape; the limiter
// (*limits.Limiter) is one.
type LeaseSource interface {
	LeaseStats() []limits.LeaseRuleStats
	LeasesHeld() (keys int, units int64)
}

// ObserveLeases exports the leases of rules with lease: true (limits/lease.go),
// per rule, read from src at each scrape:
//
//	rategate_lease_takes_total{rule}                 slices taken from the store
//	rategate_lease_units_total{rule}                 units those slices held
//	rategate_lease_returned_units_total{rule}        unspent units given back
//	rategate_lease_wasted_units_total{rule}          units that ended unspent without
//	rategate_lease_decisions_total{rule,served}      served = slice (no store call),
//	                                                 take (waited for a take), denied
//	                                                 (denied here: nothing left to lease)
//	rategate_lease_take_failures_total{rule,result}  result = denied (nothing to lease),
//	                                                 error (the store did not answer)
//	rategate_lease_return_errors_total{rule}
//	rategate_lease_keys, rategate_lease_held_units   what this instance holds now
//
// The rule label follows the decisions' per-rule cap: the limiter keeps at
// most MaxRuleSeries rule names and counts the rest under OtherRule.
func (m *Metrics) ObserveLeases(src LeaseSource) {
	m.set.RegisterMetricsWriter(func(w io.Writer) { writeLeases(w, src) })
}

func writeLeases(w io.Writer, src LeaseSource) {
	stats := src.LeaseStats()
	if len(stats) > MaxRuleSeries+1 {
		stats = stats[:MaxRuleSeries+1]
	}
	counter := func(family string, line func(s *limits.LeaseRuleStats)) {
		if len(stats) == 0 {
			return
		}
		vm.WriteMetadataIfNeeded(w, family, "counter")
		for i := range stats {
			line(&stats[i])
		}
	}
	one := func(family string, v func(s *limits.LeaseRuleStats) int64) {
		counter(family, func(s *limits.LeaseRuleStats) {
			fmt.Fprintf(w, "%s{rule=%q} %d\n", family, s.Rule, v(s))
		})
	}
	one("rategate_lease_takes_total", func(s *limits.LeaseRuleStats) int64 { return s.Takes })
	one("rategate_lease_units_total", func(s *limits.LeaseRuleStats) int64 { return s.Units })
	one("rategate_lease_returned_units_total", func(s *limits.LeaseRuleStats) int64 { return s.Returned })
	one("rategate_lease_wasted_units_total", func(s *limits.LeaseRuleStats) int64 { return s.Wasted })
	counter("rategate_lease_decisions_total", func(s *limits.LeaseRuleStats) {
		fmt.Fprintf(w, "rategate_lease_decisions_total{rule=%q,served=\"slice\"} %d\n", s.Rule, s.ServedLocal)
		fmt.Fprintf(w, "rategate_lease_decisions_total{rule=%q,served=\"take\"} %d\n", s.Rule, s.ServedTake)
		fmt.Fprintf(w, "rategate_lease_decisions_total{rule=%q,served=\"denied\"} %d\n", s.Rule, s.DeniedLocal)
	})
	counter("rategate_lease_take_failures_total", func(s *limits.LeaseRuleStats) {
		fmt.Fprintf(w, "rategate_lease_take_failures_total{rule=%q,result=\"denied\"} %d\n", s.Rule, s.TakesDenied)
		fmt.Fprintf(w, "rategate_lease_take_failures_total{rule=%q,result=\"error\"} %d\n", s.Rule, s.TakesFailed)
	})
	one("rategate_lease_return_errors_total", func(s *limits.LeaseRuleStats) int64 { return s.ReturnsFailed })
	keys, units := src.LeasesHeld()
	vm.WriteGaugeUint64(w, "rategate_lease_keys", uint64(max(keys, 0)))
	vm.WriteGaugeUint64(w, "rategate_lease_held_units", uint64(max(units, 0)))
}
