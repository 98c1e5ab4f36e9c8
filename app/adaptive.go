package app

import (
	"github.com/rategate/rategate/adaptive"
	"github.com/rategate/rategate/adaptive/signal"
	"github.com/rategate/rategate/limits/redisstore"
	"github.com/rategate/rategate/metrics"
	"github.com/rategate/rategate/policy"
)

// adaptiveOptions are the policy manager's adaptive limits: with Redis the
// records and leases live there (one instance at a time evaluates each
// rule, every instance applies its decision); with the memory store this
// instance decides alone.
func adaptiveOptions(rs *redisstore.Store, prefix string) (policy.AdaptiveOptions, error) {
	o := policy.AdaptiveOptions{Instance: policy.DefaultInstance(), Signals: signal.NewReader()}
	if rs == nil {
		o.Store = policy.NewMemoryAdaptive()
		return o, nil
	}
	st, err := redisstore.NewAdaptive(rs.Client(), prefix)
	if err != nil {
		return o, err
	}
	o.Store = st
	return o, nil
}

// exportAdaptive exports the adaptive rules' factor, signal, leadership
// and evaluations (docs/adaptive.md, "Metrics").
func exportAdaptive(m *metrics.Metrics, rules *policy.Manager) {
	each := func(f func(s policy.AdaptiveStatus) []metrics.Sample) func() []metrics.Sample {
		return func() []metrics.Sample {
			var out []metrics.Sample
			for _, s := range rules.AdaptiveStatuses() {
				out = append(out, f(s)...)
			}
			return out
		}
	}
	one := func(rule string, v float64) []metrics.Sample {
		return []metrics.Sample{{Labels: []string{"rule", rule}, Value: v}}
	}
	m.AddFamilyFunc("rategate_adaptive_factor", "gauge", each(func(s policy.AdaptiveStatus) []metrics.Sample {
		return one(s.Rule, s.Factor)
	}))
	m.AddFamilyFunc("rategate_adaptive_signal", "gauge", each(func(s policy.AdaptiveStatus) []metrics.Sample {
		if !s.HasSignal {
			return nil
		}
		return one(s.Rule, s.Signal)
	}))
	m.AddFamilyFunc("rategate_adaptive_leader", "gauge", each(func(s policy.AdaptiveStatus) []metrics.Sample {
		v := 0.0
		if s.Leader {
			v = 1
		}
		return one(s.Rule, v)
	}))
	m.AddFamilyFunc("rategate_adaptive_evaluations_total", "counter", each(func(s policy.AdaptiveStatus) []metrics.Sample {
		return one(s.Rule, float64(s.Evaluations))
	}))
	m.AddFamilyFunc("rategate_adaptive_evaluation_errors_total", "counter", each(func(s policy.AdaptiveStatus) []metrics.Sample {
		out := make([]metrics.Sample, adaptive.NumReasons)
		for r := range adaptive.NumReasons {
			out[r] = metrics.Sample{Labels: []string{"rule", s.Rule, "reason", r.String()}, Value: float64(s.Errors[r])}
		}
		return out
	}))
}
