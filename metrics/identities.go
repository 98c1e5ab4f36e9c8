package metrics

import (
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"

	vm "github.com/VictoriaMetrics/metrics"

	"github.com/rategate/rategate/limits"
)

// IdentityCount is one rule's number of identity overrides: runtime ones
// stored (the admin API) and the config file's exceptions.
type IdentityCount struct {
	Rule            string
	Runtime, Config int
}

// identityMetrics counts the decisions made under identity overrides, by
// rule and action (rategate_identity_decisions_total), and exports the
// number of overrides per rule (rategate_identity_overrides). Labels are
// rule names and the three actions: never an identity.
type identityMetrics struct {
	mu     sync.Mutex                                 // serializes adding rules
	series atomic.Pointer[map[string]*identitySeries] // copy on write
	counts atomic.Pointer[func() []IdentityCount]
}

// identitySeries are one rule's counters, by limits.IdentityAction.
type identitySeries [limits.NumIdentityActions]atomic.Uint64

// identityActions are the actions that are counted, in label order.
var identityActions = []limits.IdentityAction{limits.IdentityLimit, limits.IdentityExempt, limits.IdentityBlock}

// ObserveIdentities exports, at each scrape, the number of identity
// overrides per rule that counts returns.
func (m *Metrics) ObserveIdentities(counts func() []IdentityCount) { m.ids.counts.Store(&counts) }

// identityDecided counts d's verdicts decided under an identity override
// and the rules d's identity was exempt from. It allocates nothing once a
// rule has its counters.
func (m *Metrics) identityDecided(d *limits.Decision) {
	for i := range d.Verdicts {
		if r := d.Verdicts[i].Rule; r.Identity != limits.IdentityNone {
			m.identitySeries(r.Name)[r.Identity%limits.NumIdentityActions].Add(1)
		}
	}
	for _, r := range d.Exempt {
		m.identitySeries(r.Name)[limits.IdentityExempt].Add(1)
	}
}

// identitySeries returns the counters of a rule name, creating them on
// first use (past MaxRuleSeries names, under OtherRule).
func (m *Metrics) identitySeries(name string) *identitySeries {
	if p := m.ids.series.Load(); p != nil {
		if s := (*p)[name]; s != nil {
			return s
		}
	}
	x := &m.ids
	x.mu.Lock()
	defer x.mu.Unlock()
	old := map[string]*identitySeries{}
	if p := x.series.Load(); p != nil {
		old = *p
	}
	if s := old[name]; s != nil {
		return s
	}
	if len(old) >= MaxRuleSeries {
		name = OtherRule
		if s := old[name]; s != nil {
			return s
		}
	}
	next := make(map[string]*identitySeries, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	s := &identitySeries{}
	next[name] = s
	x.series.Store(&next)
	return s
}

// writeIdentities writes both families: a zero series for every rule in
// force and action, so that rate() works from the first scrape.
func (m *Metrics) writeIdentities(w io.Writer) {
	names := map[string]bool{}
	for _, r := range *m.ruleInfo.Load() {
		names[r.Name] = true
	}
	series := map[string]*identitySeries{}
	if p := m.ids.series.Load(); p != nil {
		series = *p
	}
	for n := range series {
		names[n] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	vm.WriteMetadataIfNeeded(w, "rategate_identity_decisions_total", "counter")
	for _, n := range sorted {
		s := series[n]
		for _, a := range identityActions {
			var v uint64
			if s != nil {
				v = s[a].Load()
			}
			fmt.Fprintf(w, "rategate_identity_decisions_total{rule=%q,action=%q} %d\n", n, a, v)
		}
	}
	if f := m.ids.counts.Load(); f != nil {
		vm.WriteMetadataIfNeeded(w, "rategate_identity_overrides", "gauge")
		for _, c := range (*f)() {
			fmt.Fprintf(w, "rategate_identity_overrides{rule=%q,source=\"runtime\"} %d\n", c.Rule, c.Runtime)
			fmt.Fprintf(w, "rategate_identity_overrides{rule=%q,source=\"config\"} %d\n", c.Rule, c.Config)
		}
	}
}
