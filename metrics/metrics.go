// Package metrics keeps rategate's Prometheus metrics, on
// github.com/VictoriaMetrics/metrics: atomic counters and Prometheus
// histograms that record lock-free and without allocating, so they can sit
// on the /auth hot path, and the standard go_* and process_* metrics.
//
// Label values come only from rule names and small fixed sets (decision,
// outcome, reason, mode, op, kind, result), so the number of series is
// bounded by the number of rules (MaxRuleSeries), never by users, IPs or
// routes.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"github.com/rategate/rategate/limits"
)

// MaxRuleSeries bounds the rules that get their own series. Rules are kept
// after a reload removes them (counters must not go backwards), so a process
// that sees more distinct rule names than this over its life counts the rest
// under the rule label OtherRule.
const MaxRuleSeries = 1000

// OtherRule is the rule label of decisions past MaxRuleSeries rule names.
const OtherRule = "_other"

// ContentType is the Content-Type of WritePrometheus's output.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// DurationBuckets are the upper bounds, in seconds, of every duration
// histogram rategate exports. A decision normally takes tens to hundreds of
// microseconds (memory store) or a fraction of a millisecond to a few
// milliseconds (Redis on the same network), so the buckets are dense below
// 1 ms and reach past the default 50 ms store timeout.
var DurationBuckets = []float64{
	0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1,
}

// Outcome is what /auth answered, as the rategate_requests_total label.
type Outcome uint8

// The outcomes of an /auth request.
const (
	// OutcomeAllowed: every matching non-shadow rule allowed (204).
	OutcomeAllowed Outcome = iota
	// OutcomeLimited: a rule denied (429 or deny_status).
	OutcomeLimited
	// OutcomeNoMatch: no rule matched (204 without rate-limit headers).
	OutcomeNoMatch
	// OutcomeBadRequest: 400.
	OutcomeBadRequest
	// OutcomeUnavailable: nothing could decide and the failure mode
	// answered (204 or 503).
	OutcomeUnavailable
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"allowed", "limited", "no_match", "bad_request", "unavailable"}

func (o Outcome) String() string { return outcomeNames[o] }

// ErrorKindFunc classifies a store error (the kind label of
// rategate_store_errors_total).
type ErrorKindFunc func(error) limits.ErrorKind

// genericKind is the classifier when none is given: timeouts, else other.
func genericKind(err error) limits.ErrorKind {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return limits.KindTimeout
	}
	return limits.KindOther
}

// ruleSeries are one rule's decision counters.
type ruleSeries struct {
	allowed, limited, shadowLimited *vm.Counter
	// failure counts this rule's requests answered by each failure mode.
	failure [3]*vm.Counter
	// denyCached counts this rule's denials answered from the deny cache
	// (also counted in limited).
	denyCached *vm.Counter
}

// RuleInfo describes one effective rule for the rule gauges.
type RuleInfo struct {
	Name   string
	Limit  int64
	Period time.Duration
	Burst  int64
	Shadow bool
	// Override is true while a runtime override changes the rule.
	Override bool
}

// RedisInfo is the Redis health rategate exports, read from INFO (summed
// over the primaries of a cluster).
type RedisInfo struct {
	// Up is false when the last INFO failed; the other fields then keep
	// their last known values.
	Up               bool
	UsedMemory       int64
	MaxMemory        int64
	ConnectedClients int64
	OpsPerSec        int64
	EvictedKeys      int64
	ExpiredKeys      int64
}

// Options configures New.
type Options struct {
	// ErrorKind classifies store errors; default: timeout or other. The
	// Redis store has the precise one.
	ErrorKind ErrorKindFunc
}

// Metrics holds every metric of one rategate process. The zero value is not
// usable; call New. It is the handler's observer and the limiter's store
// observer.
type Metrics struct {
	set   *vm.Set
	start time.Time
	kind  ErrorKindFunc

	mu    sync.Mutex                             // serializes adding series
	rules atomic.Pointer[map[string]*ruleSeries] // copy on write
	other atomic.Pointer[ruleSeries]             // created when first needed

	requests    [numOutcomes]*vm.Counter
	requestDur  [numOutcomes]*vm.PrometheusHistogram
	rejects     [limits.NumRejectReasons]*vm.Counter
	failureMode [3]*vm.Counter
	local       [3]*vm.Counter // by limits.Fallback

	storeDur    [limits.NumStoreOps]*vm.PrometheusHistogram
	storeErrors [limits.NumStoreOps][limits.NumErrorKinds]*vm.Counter

	reloads        [2]*vm.Counter // success, error
	lastReloadOK   atomic.Bool
	lastReloadTime atomic.Int64 // unix seconds of the last successful load

	ruleInfo  atomic.Pointer[[]RuleInfo]
	ruleGauge map[string]bool // rule gauge series registered, guarded by mu

	overrideSyncErrors *vm.Counter
	topPublishErrors   *vm.Counter

	redis     atomic.Pointer[RedisInfo]
	redisOnce sync.Once

	denyCache atomic.Pointer[limits.DenyCache]
	// memEvictions reports the in-memory store's evictions (nil: none).
	memEvictions atomic.Pointer[func() uint64]

	ids identityMetrics // identities.go
}

// New returns empty metrics; the process start time is now.
func New(opts ...Options) *Metrics {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	// Prometheus needs the # TYPE lines to read histograms as histograms.
	vm.ExposeMetadata(true)
	m := &Metrics{set: vm.NewSet(), start: time.Now(), kind: o.ErrorKind, ruleGauge: map[string]bool{}}
	if m.kind == nil {
		m.kind = genericKind
	}
	s := m.set
	empty := map[string]*ruleSeries{}
	m.rules.Store(&empty)
	for i := range numOutcomes {
		m.requests[i] = s.NewCounter(fmt.Sprintf(`rategate_requests_total{outcome=%q}`, outcomeNames[i]))
		m.requestDur[i] = s.NewPrometheusHistogramExt(fmt.Sprintf(`rategate_request_duration_seconds{outcome=%q}`, outcomeNames[i]), DurationBuckets)
	}
	for i := range limits.NumRejectReasons {
		m.rejects[i] = s.NewCounter(fmt.Sprintf(`rategate_bad_requests_total{reason=%q}`, i.String()))
	}
	for _, mode := range limits.FailureModes {
		m.failureMode[mode] = s.NewCounter(fmt.Sprintf(`rategate_failure_mode_decisions_total{mode=%q}`, mode))
	}
	for _, f := range []limits.Fallback{limits.FallbackStoreDown, limits.FallbackCallFailed} {
		m.local[f] = s.NewCounter(fmt.Sprintf(`rategate_local_decisions_total{reason=%q}`, f))
	}
	for op := range limits.NumStoreOps {
		m.storeDur[op] = s.NewPrometheusHistogramExt(fmt.Sprintf(`rategate_store_duration_seconds{op=%q}`, op), DurationBuckets)
		for k := range limits.NumErrorKinds {
			m.storeErrors[op][k] = s.NewCounter(fmt.Sprintf(`rategate_store_errors_total{op=%q,kind=%q}`, op, k))
		}
	}
	m.reloads[0] = s.NewCounter(`rategate_config_reloads_total{result="success"}`)
	m.reloads[1] = s.NewCounter(`rategate_config_reloads_total{result="error"}`)
	m.lastReloadOK.Store(true)
	m.lastReloadTime.Store(m.start.Unix())
	s.NewGauge(`rategate_config_last_reload_successful`, func() float64 { return b2f(m.lastReloadOK.Load()) })
	s.NewGauge(`rategate_config_last_reload_success_timestamp_seconds`, func() float64 { return float64(m.lastReloadTime.Load()) })
	noRules := []RuleInfo{}
	m.ruleInfo.Store(&noRules)
	s.NewGauge(`rategate_rules`, func() float64 { return float64(len(*m.ruleInfo.Load())) })
	m.overrideSyncErrors = s.NewCounter(`rategate_override_sync_errors_total`)
	m.topPublishErrors = s.NewCounter(`rategate_top_publish_errors_total`)
	s.NewGauge(`rategate_deny_cache_entries`, func() float64 {
		if dc := m.denyCache.Load(); dc != nil {
			return float64(dc.Len())
		}
		return 0
	})
	s.RegisterMetricsWriter(func(w io.Writer) {
		var evicted uint64
		if dc := m.denyCache.Load(); dc != nil {
			evicted = dc.Evictions()
		}
		vm.WriteCounterUint64(w, "rategate_deny_cache_evictions_total", evicted)
		var mem uint64
		if f := m.memEvictions.Load(); f != nil {
			mem = (*f)()
		}
		vm.WriteCounterUint64(w, "rategate_memory_store_evictions_total", mem)
	})
	s.RegisterMetricsWriter(m.writeIdentities)

	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	m.SetVersion(version)
	start := float64(m.start.UnixNano()) / float64(time.Second)
	s.NewGauge(`rategate_start_time_seconds`, func() float64 { return start })
	return m
}

// SetVersion sets the version label of rategate_build_info (from -ldflags,
// or the module's build info). Call it once, before the first scrape.
func (m *Metrics) SetVersion(version string) {
	name := fmt.Sprintf(`rategate_build_info{version=%q,goversion=%q}`, version, runtime.Version())
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range m.set.ListMetricNames() {
		if len(n) > len("rategate_build_info{") && n[:len("rategate_build_info{")] == "rategate_build_info{" {
			m.set.UnregisterMetric(n)
		}
	}
	m.set.GetOrCreateGauge(name, func() float64 { return 1 })
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// rule returns the series of a rule name, creating them on first use.
func (m *Metrics) rule(name string) *ruleSeries {
	if rs := (*m.rules.Load())[name]; rs != nil {
		return rs
	}
	return m.addRule(name)
}

func (m *Metrics) addRule(name string) *ruleSeries {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.rules.Load()
	if rs := old[name]; rs != nil {
		return rs
	}
	if len(old) >= MaxRuleSeries {
		if o := m.other.Load(); o != nil {
			return o
		}
		o := m.newSeries(OtherRule)
		m.other.Store(o)
		return o
	}
	next := make(map[string]*ruleSeries, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	rs := m.newSeries(name)
	next[name] = rs
	m.rules.Store(&next)
	return rs
}

// newSeries registers one rule's counters. m.mu is held.
func (m *Metrics) newSeries(rule string) *ruleSeries {
	s := m.set
	rs := &ruleSeries{
		allowed:       s.GetOrCreateCounter(fmt.Sprintf(`rategate_decisions_total{rule=%q,decision="allowed"}`, rule)),
		limited:       s.GetOrCreateCounter(fmt.Sprintf(`rategate_decisions_total{rule=%q,decision="limited"}`, rule)),
		shadowLimited: s.GetOrCreateCounter(fmt.Sprintf(`rategate_decisions_total{rule=%q,decision="shadow_limited"}`, rule)),
		denyCached:    s.GetOrCreateCounter(fmt.Sprintf(`rategate_deny_cache_decisions_total{rule=%q}`, rule)),
	}
	for _, mode := range limits.FailureModes {
		rs.failure[mode] = s.GetOrCreateCounter(fmt.Sprintf(`rategate_failure_mode_rule_decisions_total{rule=%q,mode=%q}`, rule, mode))
	}
	return rs
}

// SetRules publishes the effective rules: their gauges, and a zero series for
// every decision of every rule so that rate() works from the first request.
// Gauges of rules no longer in force are removed; their counters stay.
func (m *Metrics) SetRules(rules []RuleInfo) {
	for _, r := range rules {
		m.rule(r.Name)
	}
	cp := append([]RuleInfo(nil), rules...)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ruleInfo.Store(&cp)
	keep := map[string]bool{}
	for _, r := range cp {
		for _, g := range []struct {
			name string
			v    float64
		}{
			{"rategate_rule_limit", float64(r.Limit)},
			{"rategate_rule_period_seconds", r.Period.Seconds()},
			{"rategate_rule_burst", float64(r.Burst)},
			{"rategate_rule_shadow", b2f(r.Shadow)},
			{"rategate_rule_override_active", b2f(r.Override)},
		} {
			n := fmt.Sprintf(`%s{rule=%q}`, g.name, r.Name)
			m.set.GetOrCreateGauge(n, nil).Set(g.v)
			keep[n] = true
		}
	}
	for n := range m.ruleGauge {
		if !keep[n] {
			m.set.UnregisterMetric(n)
		}
	}
	m.ruleGauge = keep
}

// Decided records one /auth answer the limiter gave (handler observer).
func (m *Metrics) Decided(d *limits.Decision, elapsed time.Duration) {
	o := OutcomeAllowed
	switch {
	case d.Undecided:
		o = OutcomeUnavailable
	case len(d.Verdicts) == 0 && len(d.Exempt) == 0:
		o = OutcomeNoMatch
	case !d.Admitted:
		o = OutcomeLimited
	}
	switch {
	case d.Undecided:
		m.failureMode[d.Mode%3].Inc()
		for i := range d.Verdicts {
			m.rule(d.Verdicts[i].Rule.Name).failure[d.Mode%3].Inc()
		}
	default:
		for i := range d.Verdicts {
			v := &d.Verdicts[i]
			rs := m.rule(v.Rule.Name)
			switch {
			case v.Result.Allowed:
				rs.allowed.Inc()
			case v.Rule.Shadow:
				rs.shadowLimited.Inc()
			default:
				rs.limited.Inc()
			}
		}
		m.identityDecided(d)
		if d.Cached && d.Denier >= 0 && d.Denier < len(d.Verdicts) {
			m.rule(d.Verdicts[d.Denier].Rule.Name).denyCached.Inc()
		}
		if d.Local {
			m.local[d.Fallback%3].Inc()
			m.failureMode[limits.FailLocal].Inc()
			for i := range d.Verdicts {
				m.rule(d.Verdicts[i].Rule.Name).failure[limits.FailLocal].Inc()
			}
		}
	}
	m.requests[o].Inc()
	m.requestDur[o].Update(elapsed.Seconds())
}

// Rejected records a 400 (handler observer).
func (m *Metrics) Rejected(reason limits.RejectReason, elapsed time.Duration) {
	if reason < limits.NumRejectReasons {
		m.rejects[reason].Inc()
	}
	m.requests[OutcomeBadRequest].Inc()
	m.requestDur[OutcomeBadRequest].Update(elapsed.Seconds())
}

// StoreCall records one call to the shared store (limiter observer): its
// time into rategate_store_duration_seconds{op} and its error, by kind,
// into rategate_store_errors_total{op,kind}. A call refused before it was
// sent (limits.NotSent: a dead cluster primary's) counts as an error only:
// its near-zero time would make the store look fast while part of it is
// down.
func (m *Metrics) StoreCall(op limits.StoreOp, elapsed time.Duration, err error) {
	if op >= limits.NumStoreOps {
		return
	}
	if err == nil || !limits.NotSent(err) {
		m.storeDur[op].Update(elapsed.Seconds())
	}
	if err != nil {
		k := m.kind(err)
		if k >= limits.NumErrorKinds {
			k = limits.KindOther
		}
		m.storeErrors[op][k].Inc()
	}
}

// Reloaded counts a config reload: ok false for a file that was rejected.
func (m *Metrics) Reloaded(ok bool) {
	if ok {
		m.reloads[0].Inc()
		m.lastReloadTime.Store(time.Now().Unix())
	} else {
		m.reloads[1].Inc()
	}
	m.lastReloadOK.Store(ok)
}

// AddGaugeFunc exports an unlabelled gauge whose value f returns at each
// scrape, for parts of rategate that keep their own state (e.g. a circuit
// breaker's state). f must be fast and safe for concurrent use. name must be
// a valid metric name not used by anything else.
func (m *Metrics) AddGaugeFunc(name, _ string, f func() float64) {
	m.set.NewGauge(name, f)
}

// AddCounterFunc is AddGaugeFunc for a counter: f must never decrease.
func (m *Metrics) AddCounterFunc(name, _ string, f func() float64) {
	m.set.RegisterMetricsWriter(func(w io.Writer) { vm.WriteCounterFloat64(w, name, f()) })
}

// LabeledValue is one sample of a labelled family read at scrape time.
type LabeledValue struct {
	// Value of the family's one label.
	Label string
	Value float64
}

// AddCounterFuncs exports a counter family with one label, whose samples
// f returns at each scrape (every value must never decrease).
func (m *Metrics) AddCounterFuncs(family, label string, f func() []LabeledValue) {
	m.set.RegisterMetricsWriter(func(w io.Writer) {
		vm.WriteMetadataIfNeeded(w, family, "counter")
		for _, v := range f() {
			fmt.Fprintf(w, "%s{%s=%q} %g\n", family, label, v.Label, v.Value)
		}
	})
}

// ObserveDenyCache exports the size of the limiter's deny cache
// (rategate_deny_cache_entries) and its evictions. nil exports zeros.
func (m *Metrics) ObserveDenyCache(c *limits.DenyCache) { m.denyCache.Store(c) }

// ObserveMemoryEvictions exports evicted() as
// rategate_memory_store_evictions_total: live keys the in-memory stores
// dropped at memory_max_keys.
func (m *Metrics) ObserveMemoryEvictions(evicted func() uint64) { m.memEvictions.Store(&evicted) }

// OverrideSyncFailed counts a failed read of the overrides from the store.
func (m *Metrics) OverrideSyncFailed() { m.overrideSyncErrors.Inc() }

// TopPublishFailed counts a failed publication of the top-denied sketch.
func (m *Metrics) TopPublishFailed() { m.topPublishErrors.Inc() }

// SetRedisInfo exports what the last INFO said (the rategate_redis_*
// gauges appear with the first call).
func (m *Metrics) SetRedisInfo(info RedisInfo) {
	m.redis.Store(&info)
	m.redisOnce.Do(func() {
		get := func(f func(*RedisInfo) float64) func() float64 {
			return func() float64 { return f(m.redis.Load()) }
		}
		s := m.set
		s.NewGauge(`rategate_redis_up`, get(func(r *RedisInfo) float64 { return b2f(r.Up) }))
		s.NewGauge(`rategate_redis_used_memory_bytes`, get(func(r *RedisInfo) float64 { return float64(r.UsedMemory) }))
		s.NewGauge(`rategate_redis_maxmemory_bytes`, get(func(r *RedisInfo) float64 { return float64(r.MaxMemory) }))
		s.NewGauge(`rategate_redis_connected_clients`, get(func(r *RedisInfo) float64 { return float64(r.ConnectedClients) }))
		s.NewGauge(`rategate_redis_ops_per_second`, get(func(r *RedisInfo) float64 { return float64(r.OpsPerSec) }))
		s.RegisterMetricsWriter(func(w io.Writer) {
			r := m.redis.Load()
			vm.WriteCounterUint64(w, "rategate_redis_evicted_keys_total", uint64(max(r.EvictedKeys, 0)))
			vm.WriteCounterUint64(w, "rategate_redis_expired_keys_total", uint64(max(r.ExpiredKeys, 0)))
		})
	})
}

// RedisDown marks Redis as not answering INFO, keeping its last values.
func (m *Metrics) RedisDown() {
	last := RedisInfo{}
	if p := m.redis.Load(); p != nil {
		last = *p
	}
	last.Up = false
	m.SetRedisInfo(last)
}

// WritePrometheus writes every metric in the Prometheus text format:
// rategate's, then Go's and the process's.
func (m *Metrics) WritePrometheus(w io.Writer) {
	m.set.WritePrometheus(w)
	vm.WriteProcessMetrics(w)
	vm.WriteFDMetrics(w)
}

// ruleNames returns the rule names with series, sorted.
func (m *Metrics) ruleNames() ([]string, map[string]*ruleSeries) {
	rules := *m.rules.Load()
	names := make([]string, 0, len(rules))
	for n := range rules {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, rules
}
