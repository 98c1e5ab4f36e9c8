package metrics

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/rategate/rategate/limits"
)

func parse(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	var sb strings.Builder
	m.WritePrometheus(&sb)
	text := sb.String()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, text)
	}
	return fams
}

func TestHistogramBuckets(t *testing.T) {
	m := New()
	for _, d := range []time.Duration{0, time.Millisecond, time.Millisecond + 1, 10 * time.Millisecond, time.Second, 5 * time.Second} {
		m.StoreCall(limits.OpPeek, d, nil)
	}
	h := parse(t, m)["rategate_store_duration_seconds"]
	var got []string
	for _, s := range h.GetMetric() {
		if s.GetLabel()[0].GetValue() != "peek" {
			continue
		}
		for _, b := range s.GetHistogram().GetBucket() {
			if ub := b.GetUpperBound(); ub == 0.001 || ub == 0.01 || ub == 1 {
				got = append(got, fmt.Sprintf("le=%g:%d", ub, b.GetCumulativeCount()))
			}
		}
		got = append(got, fmt.Sprintf("count=%d", s.GetHistogram().GetSampleCount()))
	}
	if strings.Join(got, " ") != "le=0.001:2 le=0.01:4 le=1:5 count=6" {
		t.Fatalf("buckets %v: le is inclusive and the last sample is above every bound", got)
	}
}

// notSentError is a store call refused before it was sent (limits.NotSent).
type notSentError struct{}

func (notSentError) Error() string { return "primary down" }
func (notSentError) NotSent() bool { return true }

// TestExposition: every family parses with Prometheus's parser, has the
// right type, and the observer's counts land under the right labels.
func TestExposition(t *testing.T) {
	m := New()
	m.SetRules([]RuleInfo{{Name: "login", Limit: 5, Period: time.Minute, Burst: 5}, {Name: "sh", Limit: 1, Period: time.Second, Burst: 1, Shadow: true, Override: true}})
	login := &limits.Rule{Name: "login"}
	sh := &limits.Rule{Name: "sh", Shadow: true}
	m.Decided(&limits.Decision{Admitted: true, Verdicts: []limits.Verdict{{Rule: login, Result: limits.Result{Allowed: true}}, {Rule: sh}}}, 30*time.Microsecond)
	m.Decided(&limits.Decision{Admitted: false, Verdicts: []limits.Verdict{{Rule: login}}, Local: true, Fallback: limits.FallbackCallFailed}, 2*time.Millisecond)
	m.Decided(&limits.Decision{Admitted: true}, time.Microsecond)
	m.Rejected(limits.RejectCost, time.Microsecond)
	m.Decided(&limits.Decision{Undecided: true, Mode: limits.FailDeny, Verdicts: []limits.Verdict{{Rule: login}, {Rule: sh}}}, time.Microsecond)
	m.StoreCall(limits.OpDecide, time.Millisecond, context.DeadlineExceeded)
	m.StoreCall(limits.OpDecide, time.Millisecond, errors.New("boom"))
	m.StoreCall(limits.OpDecide, time.Microsecond, fmt.Errorf("refused: %w", notSentError{}))
	m.Reloaded(true)
	m.Reloaded(false)
	m.AddGaugeFunc("rategate_test_gauge", "A gauge read at scrape time.", func() float64 { return 2.5 })
	m.AddCounterFunc("rategate_test_total", "A counter read at scrape time.", func() float64 { return 7 })
	fams := parse(t, m)
	if v := fams["rategate_test_gauge"].GetMetric()[0].GetGauge().GetValue(); v != 2.5 {
		t.Errorf("gauge func %v, want 2.5", v)
	}
	if v := fams["rategate_test_total"].GetMetric()[0].GetCounter().GetValue(); v != 7 {
		t.Errorf("counter func %v, want 7", v)
	}

	get := func(name string, labels ...string) float64 {
		t.Helper()
		f := fams[name]
		if f == nil {
			t.Fatalf("no family %s", name)
		}
	next:
		for _, s := range f.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				ok := false
				for _, l := range s.GetLabel() {
					ok = ok || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !ok {
					continue next
				}
			}
			switch {
			case s.Counter != nil:
				return s.GetCounter().GetValue()
			case s.Gauge != nil:
				return s.GetGauge().GetValue()
			case s.Histogram != nil:
				return float64(s.GetHistogram().GetSampleCount())
			}
		}
		t.Fatalf("no sample %s%v", name, labels)
		return 0
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"rategate_decisions_total", []string{"rule", "login", "decision", "allowed"}, 1},
		{"rategate_decisions_total", []string{"rule", "login", "decision", "limited"}, 1},
		{"rategate_decisions_total", []string{"rule", "sh", "decision", "shadow_limited"}, 1},
		{"rategate_decisions_total", []string{"rule", "sh", "decision", "limited"}, 0},
		{"rategate_requests_total", []string{"outcome", "allowed"}, 1},
		{"rategate_requests_total", []string{"outcome", "limited"}, 1},
		{"rategate_requests_total", []string{"outcome", "no_match"}, 1},
		{"rategate_requests_total", []string{"outcome", "bad_request"}, 1},
		{"rategate_requests_total", []string{"outcome", "unavailable"}, 1},
		{"rategate_bad_requests_total", []string{"reason", "invalid_cost"}, 1},
		{"rategate_failure_mode_decisions_total", []string{"mode", "local"}, 1},
		{"rategate_failure_mode_decisions_total", []string{"mode", "deny"}, 1},
		{"rategate_failure_mode_decisions_total", []string{"mode", "allow"}, 0},
		{"rategate_local_decisions_total", []string{"reason", "call_failed"}, 1},
		{"rategate_local_decisions_total", []string{"reason", "store_down"}, 0},
		{"rategate_store_errors_total", []string{"op", "decide", "kind", "timeout"}, 1},
		{"rategate_store_errors_total", []string{"op", "decide", "kind", "other"}, 2},
		{"rategate_store_errors_total", []string{"op", "peek", "kind", "other"}, 0},
		// the call never sent is an error, not a duration
		{"rategate_store_duration_seconds", []string{"op", "decide"}, 2},
		{"rategate_failure_mode_rule_decisions_total", []string{"rule", "login", "mode", "local"}, 1},
		{"rategate_failure_mode_rule_decisions_total", []string{"rule", "login", "mode", "deny"}, 1},
		{"rategate_failure_mode_rule_decisions_total", []string{"rule", "sh", "mode", "deny"}, 1},
		{"rategate_failure_mode_rule_decisions_total", []string{"rule", "sh", "mode", "local"}, 0},
		{"rategate_failure_mode_rule_decisions_total", []string{"rule", "login", "mode", "allow"}, 0},
		{"rategate_config_reloads_total", []string{"result", "success"}, 1},
		{"rategate_config_reloads_total", []string{"result", "error"}, 1},
		{"rategate_config_last_reload_successful", nil, 0},
		{"rategate_request_duration_seconds", []string{"outcome", "limited"}, 1},
		{"rategate_rule_limit", []string{"rule", "login"}, 5},
		{"rategate_rule_period_seconds", []string{"rule", "login"}, 60},
		{"rategate_rule_override_active", []string{"rule", "sh"}, 1},
		{"rategate_rules", nil, 2},
	} {
		if got := get(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	types := map[string]dto.MetricType{
		"rategate_decisions_total":          dto.MetricType_COUNTER,
		"rategate_request_duration_seconds": dto.MetricType_HISTOGRAM,
		"rategate_store_duration_seconds":   dto.MetricType_HISTOGRAM,
		"rategate_store_errors_total":       dto.MetricType_COUNTER,
		"rategate_rule_limit":               dto.MetricType_GAUGE,
		"go_goroutines":                     dto.MetricType_GAUGE,
		"process_cpu_seconds_total":         dto.MetricType_COUNTER,
	}
	for name, typ := range types {
		if fams[name].GetType() != typ {
			t.Errorf("%s is %v, want %v", name, fams[name].GetType(), typ)
		}
	}
	// The histogram's buckets resolve sub-millisecond decisions.
	h := fams["rategate_request_duration_seconds"].GetMetric()[0].GetHistogram()
	below := 0
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() < 0.001 {
			below++
		}
	}
	if below < 4 {
		t.Errorf("%d buckets below 1ms, want >= 4", below)
	}
	if _, ok := fams["rategate_redis_up"]; ok {
		t.Errorf("redis gauges exported without a Redis poller")
	}
}

// TestRuleSeriesBounded: rule names past MaxRuleSeries share one series.
func TestRuleSeriesBounded(t *testing.T) {
	m := New()
	for i := 0; i < MaxRuleSeries+50; i++ {
		r := &limits.Rule{Name: fmt.Sprintf("r%d", i)}
		m.Decided(&limits.Decision{Admitted: true, Verdicts: []limits.Verdict{{Rule: r, Result: limits.Result{Allowed: true}}}}, 0)
	}
	names, _ := m.ruleNames()
	if len(names) != MaxRuleSeries || m.other.Load().allowed.Get() != 50 {
		t.Fatalf("%d rule series, %d in %s; want %d and 50", len(names), m.other.Load().allowed.Get(), OtherRule, MaxRuleSeries)
	}
	fams := parse(t, m)
	if n := len(fams["rategate_decisions_total"].GetMetric()); n != 3*(MaxRuleSeries+1) {
		t.Fatalf("%d decision series, want %d", n, 3*(MaxRuleSeries+1))
	}
}

// TestRedisGauges: the rategate_redis_* gauges appear with the first INFO
// and keep the last known values when Redis stops answering.
func TestRedisGauges(t *testing.T) {
	m := New()
	if _, ok := parse(t, m)["rategate_redis_up"]; ok {
		t.Fatal("redis gauges exported before any INFO")
	}
	m.SetRedisInfo(RedisInfo{Up: true, MaxMemory: 10 << 20, EvictedKeys: 3})
	m.RedisDown()
	fams := parse(t, m)
	if v := fams["rategate_redis_up"].GetMetric()[0].GetGauge().GetValue(); v != 0 {
		t.Fatalf("rategate_redis_up %v after Redis stopped, want 0", v)
	}
	if v := fams["rategate_redis_maxmemory_bytes"].GetMetric()[0].GetGauge().GetValue(); v != 10<<20 {
		t.Fatalf("maxmemory %v, want the last known value", v)
	}
	if v := fams["rategate_redis_evicted_keys_total"].GetMetric()[0].GetCounter().GetValue(); v != 3 {
		t.Fatalf("evicted %v, want 3", v)
	}
}

// TestRuleGaugesFollowTheRules: a rule removed by a reload loses its
// gauges (rategate_rules and rategate_rule_* describe what is in force) and
// keeps its counters (they must not go backwards).
func TestRuleGaugesFollowTheRules(t *testing.T) {
	m := New()
	m.SetRules([]RuleInfo{{Name: "a", Limit: 1, Period: time.Second, Burst: 1}, {Name: "b", Limit: 2, Period: time.Second, Burst: 2}})
	m.SetRules([]RuleInfo{{Name: "b", Limit: 3, Period: time.Second, Burst: 3}})
	fams := parse(t, m)
	if n := len(fams["rategate_rule_limit"].GetMetric()); n != 1 {
		t.Fatalf("%d rategate_rule_limit series after a reload to one rule", n)
	}
	if v := fams["rategate_rule_limit"].GetMetric()[0].GetGauge().GetValue(); v != 3 {
		t.Fatalf("limit %v, want 3", v)
	}
	found := false
	for _, s := range fams["rategate_decisions_total"].GetMetric() {
		for _, l := range s.GetLabel() {
			found = found || l.GetName() == "rule" && l.GetValue() == "a"
		}
	}
	if !found {
		t.Fatal("the removed rule's counters are gone")
	}
}

// TestCounterFuncs: a labelled family read at scrape time has one TYPE line
// and one sample per label value, and parses.
func TestCounterFuncs(t *testing.T) {
	m := New()
	m.AddCounterFuncs("rategate_test_things_total", "kind", func() []LabeledValue {
		return []LabeledValue{{Label: "a", Value: 1}, {Label: "b", Value: 2.5}}
	})
	fams := parse(t, m)
	f := fams["rategate_test_things_total"]
	if f.GetType() != dto.MetricType_COUNTER || len(f.GetMetric()) != 2 {
		t.Fatalf("family %v", f)
	}
	for _, s := range f.GetMetric() {
		want := map[string]float64{"a": 1, "b": 2.5}[s.GetLabel()[0].GetValue()]
		if s.GetCounter().GetValue() != want {
			t.Errorf("%v = %v, want %v", s.GetLabel(), s.GetCounter().GetValue(), want)
		}
	}
}
