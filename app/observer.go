package app

import (
	"time"

	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/metrics"
	"github.com/rategate/rategate/top"
)

// observer is the handler.Observer rategate runs with: it feeds the metrics
// and, for every rule that denied (or, in shadow, would have denied), the
// top-denied sketch.
type observer struct {
	metrics *metrics.Metrics
	top     *top.Top
}

var _ handler.Observer = observer{}

// Decided implements handler.Observer.
func (o observer) Decided(d *limits.Decision, elapsed time.Duration) {
	o.metrics.Decided(d, elapsed)
	if d.Undecided {
		return
	}
	for i := range d.Verdicts {
		if v := &d.Verdicts[i]; !v.Result.Allowed {
			o.top.Record(v.Rule.Name, v.Key)
		}
	}
}

// Rejected implements handler.Observer.
func (o observer) Rejected(reason limits.RejectReason, elapsed time.Duration) {
	o.metrics.Rejected(reason, elapsed)
}

// identityCounts reports the identity overrides per rule for the metrics.
func (a *App) identityCounts() []metrics.IdentityCount {
	counts := a.rules.Identities().Counts()
	out := make([]metrics.IdentityCount, len(counts))
	for i, c := range counts {
		out[i] = metrics.IdentityCount{Rule: c.Rule, Runtime: c.Runtime, Config: c.Config}
	}
	return out
}
