package metrics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// TestLeaseMetrics: a real limiter's leases appear per rule, with the
// values its counters hold, in an exposition Prometheus parses; a leased
// rule has its series before its first decision.
func TestLeaseMetrics(t *testing.T) {
	mem := memstore.New()
	defer mem.Close()
	used := &limits.Rule{Name: "whole-api", Algorithm: limits.FixedWindow, Limit: 1000, Period: time.Hour, Burst: 1000, Cost: 1, Lease: true}
	idle := &limits.Rule{Name: "idle", Match: limits.Match{PathPrefix: "/never"}, Algorithm: limits.GCRA, Limit: 10, Period: time.Second, Burst: 10, Cost: 1, Lease: true}
	l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: []*limits.Rule{used, idle}, Leaser: mem,
		// Takes in the request, not in the background: the counters hold still
		// between the exposition and LeaseStats.
		Lease: limits.LeaseOptions{SyncPrefetch: true}})
	m := New()
	m.ObserveLeases(l)
	var d limits.Decision
	for i := 0; i < 50; i++ {
		if err := l.Decide(context.Background(), &limits.Request{Route: []byte("/x")}, &d); err != nil || !d.Admitted {
			t.Fatalf("decision %d: %v %+v", i, err, d)
		}
	}
	fams := parse(t, m)
	value := func(family string, labels map[string]string) float64 {
		t.Helper()
		f := fams[family]
		if f == nil {
			t.Fatalf("no %s", family)
		}
	next:
		for _, s := range f.GetMetric() {
			for _, lp := range s.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			if c := s.GetCounter(); c != nil {
				return c.GetValue()
			}
			return s.GetGauge().GetValue()
		}
		t.Fatalf("no %s%v", family, labels)
		return 0
	}
	st := l.LeaseStats()
	var ws limits.LeaseRuleStats
	for _, s := range st {
		if s.Rule == "whole-api" {
			ws = s
		}
	}
	slice := value("rategate_lease_decisions_total", map[string]string{"rule": "whole-api", "served": "slice"})
	take := value("rategate_lease_decisions_total", map[string]string{"rule": "whole-api", "served": "take"})
	if slice+take != 50 || slice != float64(ws.ServedLocal) || slice == 0 {
		t.Fatalf("decisions: slice %v take %v, stats %+v", slice, take, ws)
	}
	if got := value("rategate_lease_takes_total", map[string]string{"rule": "whole-api"}); got != float64(ws.Takes) || got == 0 {
		t.Fatalf("takes %v, stats %+v", got, ws)
	}
	if got := value("rategate_lease_units_total", map[string]string{"rule": "whole-api"}); got != float64(ws.Units) || got < 50 {
		t.Fatalf("units %v, stats %+v", got, ws)
	}
	for _, f := range []string{"rategate_lease_returned_units_total", "rategate_lease_wasted_units_total", "rategate_lease_return_errors_total"} {
		if got := value(f, map[string]string{"rule": "idle"}); got != 0 {
			t.Fatalf("%s{rule=idle} = %v", f, got)
		}
	}
	_, units := l.LeasesHeld()
	if got := value("rategate_lease_held_units", nil); got != float64(units) {
		t.Fatalf("held units %v, want %d", got, units)
	}
}

// fakeLeases has many rules.
type fakeLeases struct{ n int }

func (f fakeLeases) LeaseStats() []limits.LeaseRuleStats {
	out := make([]limits.LeaseRuleStats, f.n)
	for i := range out {
		out[i] = limits.LeaseRuleStats{Rule: fmt.Sprintf("r%05d", i), Takes: 1}
	}
	return out
}
func (fakeLeases) LeasesHeld() (int, int64) { return 0, 0 }

// TestLeaseMetricsSeriesCap: however many rule names, at most
// MaxRuleSeries (plus OtherRule) get series of their own.
func TestLeaseMetricsSeriesCap(t *testing.T) {
	m := New()
	m.ObserveLeases(fakeLeases{n: 3 * MaxRuleSeries})
	if n := len(parse(t, m)["rategate_lease_takes_total"].GetMetric()); n > MaxRuleSeries+1 {
		t.Fatalf("%d series of rategate_lease_takes_total, want at most %d", n, MaxRuleSeries+1)
	}
}
