package admin

import (
	"time"

	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/metrics"
)

// Observer is the handler.Observer rategate runs with: it feeds the metrics
// and, for every rule that denied (or, in shadow, would have denied), the
// top-denied sketch. Either part may be nil.
type Observer struct {
	Metrics *metrics.Metrics
	Top     *Top
}

var _ handler.Observer = Observer{}

// Decided implements handler.Observer.
func (o Observer) Decided(d *limits.Decision, elapsed time.Duration) {
	if o.Metrics != nil {
		o.Metrics.Decided(d, elapsed)
	}
	if o.Top != nil {
		for i := range d.Verdicts {
			if v := &d.Verdicts[i]; !v.Result.Allowed {
				o.Top.Record(v.Rule.Name, v.Key)
			}
		}
	}
}

// BadRequest implements handler.Observer.
func (o Observer) BadRequest(reason handler.BadRequestReason, elapsed time.Duration) {
	if o.Metrics != nil {
		o.Metrics.BadRequest(reason, elapsed)
	}
}

// Undecided implements handler.Observer.
func (o Observer) Undecided(mode string, d *limits.Decision, elapsed time.Duration) {
	if o.Metrics != nil {
		o.Metrics.Undecided(mode, d, elapsed)
	}
}
