// Package metrics keeps rategate's Prometheus metrics and writes them in the
// Prometheus text exposition format (version 0.0.4), by hand: atomic counters
// indexed by rule, fixed-bucket histograms, Redis health read from INFO and
// Go/process metrics from runtime/metrics and /proc/self.
//
// Recording is lock-free and allocation-free, so it can sit on the /auth hot
// path. Label values come only from rule names and small fixed sets
// (decision, outcome, reason, mode, op, kind, result), so the number of
// series is bounded by the number of rules, never by users, IPs or routes.
package metrics

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/limits"
)

// MaxRuleSeries bounds the rules that get their own series. Rules are kept
// after a reload removes them (counters must not go backwards), so a process
// that sees more distinct rule names than this over its life counts the rest
// under the rule label OtherRule.
const MaxRuleSeries = 1000

// OtherRule is the rule label of decisions past MaxRuleSeries rule names.
const OtherRule = "_other"

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
	// OutcomeUnavailable: the store failed and the failure mode answered
	// without a decision (204 or 503).
	OutcomeUnavailable
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"allowed", "limited", "no_match", "bad_request", "unavailable"}

func (o Outcome) String() string { return outcomeNames[o] }

// The failure modes, as the rategate_failure_mode_decisions_total label.
const (
	modeAllow = iota
	modeDeny
	modeLocal
	numModes
)

var modeNames = [numModes]string{handler.FailAllow, handler.FailDeny, handler.FailLocal}

// ruleSeries are one rule's decision counters.
type ruleSeries struct {
	allowed, limited, shadowLimited atomic.Uint64
	// failure counts this rule's requests answered by each failure mode.
	failure [numModes]atomic.Uint64
	// denyCached counts this rule's denials answered from the deny cache
	// (also counted in limited).
	denyCached atomic.Uint64
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

// Metrics holds every metric of one rategate process. The zero value is not
// usable; call New. It implements handler.Observer.
type Metrics struct {
	start time.Time

	mu    sync.Mutex                             // serializes adding rule series
	rules atomic.Pointer[map[string]*ruleSeries] // copy on write
	other ruleSeries

	requests    [numOutcomes]atomic.Uint64
	requestDur  [numOutcomes]*Histogram
	badRequests [handler.NumBadRequestReasons]atomic.Uint64
	failureMode [numModes]atomic.Uint64

	storeDur    [numOps]*Histogram
	storeErrors [numOps][numKinds]atomic.Uint64

	reloads        [2]atomic.Uint64 // success, error
	lastReloadOK   atomic.Bool
	lastReloadTime atomic.Int64 // unix seconds of the last successful load

	ruleInfo atomic.Pointer[[]RuleInfo]

	overrideSyncErrors atomic.Uint64
	topPublishErrors   atomic.Uint64

	redisPolled atomic.Bool // a Redis poller runs: export the redis_* gauges
	redis       atomic.Pointer[RedisInfo]

	gauges atomic.Pointer[[]gaugeFunc] // AddGaugeFunc, copy on write

	denyCache atomic.Pointer[limits.DenyCache] // ObserveDenyCache
}

// gaugeFunc is a gauge read at scrape time.
type gaugeFunc struct {
	name, help string
	kind       string // gauge or counter
	f          func() float64
}

// New returns empty metrics; the process start time is now.
func New() *Metrics {
	m := &Metrics{start: time.Now()}
	empty := map[string]*ruleSeries{}
	m.rules.Store(&empty)
	for i := range m.requestDur {
		m.requestDur[i] = NewHistogram(nil)
	}
	for i := range m.storeDur {
		m.storeDur[i] = NewHistogram(nil)
	}
	m.lastReloadOK.Store(true)
	m.lastReloadTime.Store(m.start.Unix())
	noRules := []RuleInfo{}
	m.ruleInfo.Store(&noRules)
	return m
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
		return &m.other
	}
	next := make(map[string]*ruleSeries, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	rs := &ruleSeries{}
	next[name] = rs
	m.rules.Store(&next)
	return rs
}

// SetRules publishes the effective rules: their gauges, and a zero series for
// every decision of every rule so that rate() works from the first request.
func (m *Metrics) SetRules(rules []RuleInfo) {
	for _, r := range rules {
		m.rule(r.Name)
	}
	cp := append([]RuleInfo(nil), rules...)
	m.ruleInfo.Store(&cp)
}

// Decided implements handler.Observer.
func (m *Metrics) Decided(d *limits.Decision, elapsed time.Duration) {
	o := OutcomeAllowed
	switch {
	case len(d.Verdicts) == 0:
		o = OutcomeNoMatch
	case !d.Admitted:
		o = OutcomeLimited
	}
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		rs := m.rule(v.Rule.Name)
		switch {
		case v.Result.Allowed:
			rs.allowed.Add(1)
		case v.Rule.Shadow:
			rs.shadowLimited.Add(1)
		default:
			rs.limited.Add(1)
		}
	}
	if d.Cached && d.Denier >= 0 && d.Denier < len(d.Verdicts) {
		m.rule(d.Verdicts[d.Denier].Rule.Name).denyCached.Add(1)
	}
	if d.Local {
		m.failureMode[modeLocal].Add(1)
		for i := range d.Verdicts {
			m.rule(d.Verdicts[i].Rule.Name).failure[modeLocal].Add(1)
		}
	}
	m.requests[o].Add(1)
	m.requestDur[o].Observe(elapsed)
}

// BadRequest implements handler.Observer.
func (m *Metrics) BadRequest(reason handler.BadRequestReason, elapsed time.Duration) {
	if reason < handler.NumBadRequestReasons {
		m.badRequests[reason].Add(1)
	}
	m.requests[OutcomeBadRequest].Add(1)
	m.requestDur[OutcomeBadRequest].Observe(elapsed)
}

// Undecided implements handler.Observer.
func (m *Metrics) Undecided(mode string, d *limits.Decision, elapsed time.Duration) {
	i := modeAllow
	switch mode {
	case handler.FailDeny:
		i = modeDeny
	case handler.FailLocal:
		i = modeLocal
	}
	m.failureMode[i].Add(1)
	if d != nil {
		for v := range d.Verdicts {
			m.rule(d.Verdicts[v].Rule.Name).failure[i].Add(1)
		}
	}
	m.requests[OutcomeUnavailable].Add(1)
	m.requestDur[OutcomeUnavailable].Observe(elapsed)
}

// Reloaded counts a config reload: ok false for a file that was rejected.
func (m *Metrics) Reloaded(ok bool) {
	if ok {
		m.reloads[0].Add(1)
		m.lastReloadTime.Store(time.Now().Unix())
	} else {
		m.reloads[1].Add(1)
	}
	m.lastReloadOK.Store(ok)
}

// AddGaugeFunc exports an unlabelled gauge whose value f returns at each
// scrape, for parts of rategate that keep their own state (e.g. a circuit
// breaker's state). f must be fast and safe for concurrent use. name must be
// a valid metric name not used by anything else.
func (m *Metrics) AddGaugeFunc(name, help string, f func() float64) {
	m.addFunc(gaugeFunc{name: name, help: help, kind: "gauge", f: f})
}

// AddCounterFunc is AddGaugeFunc for a counter: f must never decrease.
func (m *Metrics) AddCounterFunc(name, help string, f func() float64) {
	m.addFunc(gaugeFunc{name: name, help: help, kind: "counter", f: f})
}

func (m *Metrics) addFunc(g gaugeFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var next []gaugeFunc
	if p := m.gauges.Load(); p != nil {
		next = append(next, *p...)
	}
	next = append(next, g)
	m.gauges.Store(&next)
}

// ObserveDenyCache exports the size of the limiter's deny cache
// (rategate_deny_cache_entries) and its evictions. nil exports zeros.
func (m *Metrics) ObserveDenyCache(c *limits.DenyCache) { m.denyCache.Store(c) }

// OverrideSyncFailed counts a failed read of the overrides from the store.
func (m *Metrics) OverrideSyncFailed() { m.overrideSyncErrors.Add(1) }

// TopPublishFailed counts a failed publication of the top-denied sketch.
func (m *Metrics) TopPublishFailed() { m.topPublishErrors.Add(1) }

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
