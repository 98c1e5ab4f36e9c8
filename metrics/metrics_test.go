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
	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

func parse(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	text := string(m.AppendText(nil))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, text)
	}
	return fams
}

func TestHistogramBuckets(t *testing.T) {
	h := NewHistogram([]float64{0.001, 0.01})
	for _, d := range []time.Duration{0, time.Millisecond, time.Millisecond + 1, 10 * time.Millisecond, time.Second, -5} {
		h.Observe(d)
	}
	cum, total, sum := h.snapshot(nil)
	if fmt.Sprint(cum) != "[3 5 6]" || total != 6 {
		t.Fatalf("cumulative %v total %d, want [3 5 6] 6 (le is inclusive, negatives count as 0)", cum, total)
	}
	if want := 0.001 + 0.001000001 + 0.01 + 1; sum < want-1e-9 || sum > want+1e-9 {
		t.Fatalf("sum %v, want %v", sum, want)
	}
}

// TestExposition: every family parses with Prometheus's parser, has the
// right type, and the observer's counts land under the right labels.
func TestExposition(t *testing.T) {
	m := New()
	m.SetRules([]RuleInfo{{Name: "login", Limit: 5, Period: time.Minute, Burst: 5}, {Name: "sh", Limit: 1, Period: time.Second, Burst: 1, Shadow: true, Override: true}})
	login := &limits.Rule{Name: "login"}
	sh := &limits.Rule{Name: "sh", Shadow: true}
	m.Decided(&limits.Decision{Admitted: true, Verdicts: []limits.Verdict{{Rule: login, Result: limits.Result{Allowed: true}}, {Rule: sh}}}, 30*time.Microsecond)
	m.Decided(&limits.Decision{Admitted: false, Verdicts: []limits.Verdict{{Rule: login}}, Local: true}, 2*time.Millisecond)
	m.Decided(&limits.Decision{Admitted: true}, time.Microsecond)
	m.BadRequest(handler.BadCost, time.Microsecond)
	m.Undecided(handler.FailDeny, &limits.Decision{Verdicts: []limits.Verdict{{Rule: login}, {Rule: sh}}}, time.Microsecond)
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
	if len(names) != MaxRuleSeries || m.other.allowed.Load() != 50 {
		t.Fatalf("%d rule series, %d in %s; want %d and 50", len(names), m.other.allowed.Load(), OtherRule, MaxRuleSeries)
	}
	fams := parse(t, m)
	if n := len(fams["rategate_decisions_total"].GetMetric()); n != 3*(MaxRuleSeries+1) {
		t.Fatalf("%d decision series, want %d", n, 3*(MaxRuleSeries+1))
	}
}

// TestErrorKinds classifies errors from a real Redis, a real closed port
// and a real cluster-mode Redis without slots.
func TestErrorKinds(t *testing.T) {
	rs := testredis.Start(t)
	c := rs.Client(t)
	ctx := testredis.Ctx(t)

	_, scriptErr := c.Eval(ctx, "return redis.error_reply('ERR boom')", nil).Result()
	_, noScript := c.EvalSha(ctx, strings.Repeat("0", 40), nil).Result()
	_, runtimeErr := c.Eval(ctx, "return redis.call('INCR', KEYS[1], 'x')", []string{"k"}).Result()

	if err := c.Do(ctx, "CLIENT", "PAUSE", "400").Err(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, timeoutErr := c.Get(tctx, "k").Result()
	cancel()

	closed := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", testredis.FreePort(t)), DialerRetries: 1})
	defer closed.Close()
	refused := closed.Ping(ctx).Err()

	cl := testredis.Start(t, "cluster-enabled yes")
	_, clusterDown := cl.Client(t).Get(ctx, "k").Result()

	for _, c := range []struct {
		err  error
		want string
	}{
		{scriptErr, KindScript},
		{noScript, KindScript},
		{runtimeErr, KindScript},
		{fmt.Errorf("redis store: decide: %w", scriptErr), KindScript},
		{errors.New("redis store: reply is string, want array"), KindScript},
		{timeoutErr, KindTimeout},
		{context.DeadlineExceeded, KindTimeout},
		{refused, KindConnection},
		{redis.ErrClosed, KindConnection},
		{clusterDown, KindCluster},
		{redis.ErrCrossSlot, KindCluster},
		{context.Canceled, KindOther},
	} {
		if c.err == nil {
			t.Fatalf("expected an error for kind %s", c.want)
		}
		if got := ErrorKind(c.err); got != c.want {
			t.Errorf("ErrorKind(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

// TestInstrumentStore: calls are timed and errors counted by op and kind,
// the optional Inspector survives the wrapper, Unwrap finds the store.
func TestInstrumentStore(t *testing.T) {
	m := New()
	mem := limits.NewMemoryStore()
	defer mem.Close()
	s := InstrumentStore(mem, m)
	if _, ok := s.(limits.Inspector); !ok {
		t.Fatal("the wrapper hides the memory store's Inspector")
	}
	if Unwrap(s) != limits.Store(mem) {
		t.Fatal("Unwrap does not return the memory store")
	}
	ctx := context.Background()
	res := make([]limits.Result, 1)
	b := &limits.Batch{Checks: []limits.Check{{Key: "k", Algorithm: limits.FixedWindow, Limit: 1, PeriodUS: 1e6, Burst: 1, Cost: 1}}}
	if _, err := s.Decide(ctx, b, res); err != nil {
		t.Fatal(err)
	}
	b.Checks[0].Algorithm = "nope"
	if _, err := s.Decide(ctx, b, res); err == nil {
		t.Fatal("want an error for an unknown algorithm")
	}
	s.Peek(ctx, limits.Check{Key: "k", Algorithm: limits.FixedWindow, Limit: 1, PeriodUS: 1e6, Burst: 1})
	s.(limits.Inspector).Raw(ctx, "k")
	if m.storeDur[opDecide].Count() != 2 || m.storeDur[opPeek].Count() != 1 || m.storeDur[opRaw].Count() != 1 {
		t.Fatal("store calls not timed")
	}
	if m.storeErrors[opDecide][kindOther].Load() != 1 {
		t.Fatal("store error not counted")
	}
}

// TestRedisInfo reads INFO from a real Redis.
func TestRedisInfo(t *testing.T) {
	rs := testredis.Start(t, "maxmemory 10mb")
	c := rs.Client(t)
	info, err := ReadRedisInfo(testredis.Ctx(t), c)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Up || info.UsedMemory <= 0 || info.ConnectedClients < 1 || info.MaxMemory != 10<<20 {
		t.Fatalf("info %+v", info)
	}
	m := New()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.PollRedis(ctx, c, 50*time.Millisecond, time.Second); close(done) }()
	deadline := time.Now().Add(3 * time.Second)
	for m.redis.Load() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	rs.Stop()
	for m.redis.Load().Up && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	fams := parse(t, m)
	if v := fams["rategate_redis_up"].GetMetric()[0].GetGauge().GetValue(); v != 0 {
		t.Fatalf("rategate_redis_up %v after Redis stopped, want 0", v)
	}
	if v := fams["rategate_redis_maxmemory_bytes"].GetMetric()[0].GetGauge().GetValue(); v != 10<<20 {
		t.Fatalf("maxmemory %v, want the last known value", v)
	}
}
