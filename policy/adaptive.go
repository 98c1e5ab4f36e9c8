package policy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/adaptive"
	"github.com/rategate/rategate/adaptive/signal"
	"github.com/rategate/rategate/limits"
)

// Adaptive limits (docs/adaptive.md). For each rule with an `adaptive:`
// block, one instance at a time (the holder of the rule's lease) reads the
// signal and writes the factor it decided into the rule's adaptive record,
// kept next to the manual overrides. Every instance reads the records as it
// reads the overrides (pub/sub, and every SyncEvery) and composes:
//
//	file rule -> the manual override, if one is in force
//	          -> else the adaptive factor
//
// so a manual PUT /v1/rules/{name}/override is never overwritten by the
// controller (it writes elsewhere), and the adaptive factor applies again
// as soon as the manual override is deleted or expires.

// AdaptiveReason is the reason of every adaptive record.
const AdaptiveReason = "adaptive"

// staleSkew is added to the age at which an adaptive record counts as
// stale, for the clocks of the instances to disagree a little.
const staleSkew = 5 * time.Second

// AdaptiveStore keeps the adaptive records where every instance reads them,
// and the leases that let one instance at a time decide each rule's.
// redisstore.Adaptive is the Redis one; MemoryAdaptive keeps both in the
// process.
type AdaptiveStore interface {
	// Load returns every record: rule name -> JSON (an AdaptiveRecord).
	Load(ctx context.Context) (map[string]string, error)
	// Lead takes rule's lease for instance, or renews it when instance
	// holds it, for ttl; it reports whether instance holds it now.
	Lead(ctx context.Context, rule, instance string, ttl time.Duration) (bool, error)
	// Write stores rule's record only if instance holds the lease at that
	// moment (false, nothing written, when it does not), and when announce
	// tells the other instances.
	Write(ctx context.Context, rule, instance, value string, announce bool) (bool, error)
	// Release gives rule's lease up if instance holds it.
	Release(ctx context.Context, rule, instance string) error
	// Watch is OverrideStore.Watch for the records.
	Watch(ctx context.Context) <-chan struct{}
	// Shared says whether other instances see the same records.
	Shared() bool
}

// SignalReader reads one rule's signal; *signal.Reader is the real one.
type SignalReader interface {
	Read(ctx context.Context, src *adaptive.Source) (float64, error)
}

// AdaptiveOptions configures the adaptive limits of a Manager.
type AdaptiveOptions struct {
	// Store keeps the records and leases (default: a MemoryAdaptive).
	Store AdaptiveStore
	// Instance names this instance in leases and records (default
	// DefaultInstance()).
	Instance string
	// Signals reads the signals (default signal.NewReader()).
	Signals SignalReader
}

// DefaultInstance names this process: host name, process id and a random
// suffix (two containers may both be pid 1 on hosts of the same name).
func DefaultInstance() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "rategate"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// AdaptiveRecord is what the evaluating instance decided for one rule and
// what from: the factor, written as an override with reason "adaptive",
// with the signal it was read from; and the rest of adaptive.State, so the
// instance that takes the lease over continues where this one stopped.
type AdaptiveRecord struct {
	Factor float64 `json:"factor"`
	Reason string  `json:"reason"`
	// Step is the factor's step in the rule's table; -1 for none.
	Step int `json:"step"`
	// Signal is the last good reading, at SignalAt.
	Signal   *float64   `json:"signal,omitempty"`
	SignalAt *time.Time `json:"signal_at,omitempty"`
	// ChangedAt is the factor's last change.
	ChangedAt *time.Time `json:"changed_at,omitempty"`
	// Error is the reason of the failure in progress ("timeout"), with
	// ErrorDetail, since FailingSince.
	Error        string     `json:"error,omitempty"`
	ErrorDetail  string     `json:"error_detail,omitempty"`
	FailingSince *time.Time `json:"failing_since,omitempty"`
	// SetBy is the instance that wrote the record, at SetAt.
	SetBy string    `json:"set_by"`
	SetAt time.Time `json:"set_at"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func timeOf(p *time.Time) time.Time {
	if p == nil {
		return time.Time{}
	}
	return *p
}

// recordOf is the record of state st, written by instance at now.
func recordOf(st adaptive.State, instance string, now time.Time, detail string) AdaptiveRecord {
	rec := AdaptiveRecord{Factor: st.Factor, Reason: AdaptiveReason, Step: st.Step, SignalAt: timePtr(st.SignalAt),
		ChangedAt: timePtr(st.ChangedAt), SetBy: instance, SetAt: now.UTC()}
	if !st.SignalAt.IsZero() {
		v := st.Signal
		rec.Signal = &v
	}
	if !st.FailingSince.IsZero() {
		rec.Error, rec.ErrorDetail, rec.FailingSince = st.Failing.String(), detail, timePtr(st.FailingSince)
	}
	return rec
}

// stateOf turns a record back into the state it was written from, made
// safe for spec: whoever wrote it, the factor is within the bounds and the
// step one of the table's (or none).
func stateOf(rec AdaptiveRecord, spec *adaptive.Spec) adaptive.State {
	st := adaptive.State{Factor: spec.Clamp(rec.Factor), Step: rec.Step, SignalAt: timeOf(rec.SignalAt),
		ChangedAt: timeOf(rec.ChangedAt)}
	if st.Step < 0 || st.Step >= len(spec.Steps) || spec.Clamp(spec.Steps[st.Step].Factor) != st.Factor {
		st.Step = -1
	}
	if rec.Signal != nil && !math.IsNaN(*rec.Signal) && !math.IsInf(*rec.Signal, 0) {
		st.Signal = *rec.Signal
	} else {
		st.SignalAt = time.Time{}
	}
	if r, ok := adaptive.ParseReason(rec.Error); ok && rec.FailingSince != nil {
		st.Failing, st.FailingSince = r, *rec.FailingSince
	}
	return st
}

// staleAfter is the age past which a record is not applied: no instance
// has evaluated the rule for longer than a takeover plus keep_on_error.
func staleAfter(s *adaptive.Spec) time.Duration {
	return s.LeaseTTL + s.Interval + s.KeepOnError + staleSkew
}

// AdaptiveView is a rule's adaptive factor in GET /v1/rules.
type AdaptiveView struct {
	// Source and Steps describe the rule's adaptive block.
	Source string `json:"source"`
	Steps  string `json:"steps"`
	// Factor is the factor decided last (1 before any decision).
	Factor float64 `json:"factor"`
	// Applied is true while Factor is what the rule's effective values
	// come from; NotApplied says why it is not.
	Applied    bool   `json:"applied"`
	NotApplied string `json:"not_applied,omitempty"`
	// Signal is the last good reading, at SignalAt.
	Signal   *float64   `json:"signal"`
	SignalAt *time.Time `json:"signal_at,omitempty"`
	// Error is the signal's failure in progress, since FailingSince.
	Error        string     `json:"error,omitempty"`
	FailingSince *time.Time `json:"failing_since,omitempty"`
	// SetBy is the instance that evaluates the signal (it wrote the
	// decision at SetAt); ChangedAt is the factor's last change.
	SetBy     string     `json:"set_by,omitempty"`
	SetAt     *time.Time `json:"set_at,omitempty"`
	ChangedAt *time.Time `json:"changed_at,omitempty"`
	// Leader is true when this instance is the one evaluating the signal.
	Leader bool `json:"leader"`
}

// AdaptiveStatus is one adaptive rule's state, for the metrics.
type AdaptiveStatus struct {
	Rule string
	// Factor is the factor the rule's controller wants in force: the last
	// decision, 1 before the first and once it is stale.
	Factor float64
	// Signal is the last good reading; HasSignal is false before one.
	Signal    float64
	HasSignal bool
	// Leader: this instance evaluates the rule's signal.
	Leader bool
	// Evaluations and Errors (by reason) count this instance's readings.
	Evaluations uint64
	Errors      [adaptive.NumReasons]uint64
}

// adaptiveStats are one rule's reading counters on this instance. They
// live as long as the process, so counters never go backwards.
type adaptiveStats struct {
	evaluations atomic.Uint64
	errors      [adaptive.NumReasons]atomic.Uint64
}

// adaptiveState is the Manager's part for adaptive limits.
type adaptiveState struct {
	store    AdaptiveStore
	instance string
	signals  SignalReader

	// Guarded by Manager.mu.
	raw     map[string]string         // records as last read
	recs    map[string]AdaptiveRecord // raw, decoded
	bad     map[string]string         // rule -> why its record is unreadable
	applied map[string]float64        // factor the last apply used, per rule (absent: none)
	leading map[string]bool

	statsMu sync.Mutex
	stats   map[string]*adaptiveStats
}

func (a *adaptiveState) init(o AdaptiveOptions) {
	a.store, a.instance, a.signals = o.Store, o.Instance, o.Signals
	if a.store == nil {
		a.store = NewMemoryAdaptive()
	}
	if a.instance == "" {
		a.instance = DefaultInstance()
	}
	if a.signals == nil {
		a.signals = signal.NewReader()
	}
	a.raw, a.recs, a.bad = map[string]string{}, map[string]AdaptiveRecord{}, map[string]string{}
	a.applied, a.leading = map[string]float64{}, map[string]bool{}
	a.stats = map[string]*adaptiveStats{}
}

func (a *adaptiveState) statsOf(rule string) *adaptiveStats {
	a.statsMu.Lock()
	defer a.statsMu.Unlock()
	s := a.stats[rule]
	if s == nil {
		s = &adaptiveStats{}
		a.stats[rule] = s
	}
	return s
}

// Instance is this instance's name in adaptive leases and records.
func (m *Manager) Instance() string { return m.adaptive.instance }

// adaptiveFactor is the adaptive factor r gets now, or 0 and why none
// applies. m.mu is held.
func (m *Manager) adaptiveFactor(r *limits.Rule, now time.Time) (float64, *AdaptiveRecord, string) {
	rec, ok := m.adaptive.recs[r.Name]
	switch {
	case !ok:
		if why, bad := m.adaptive.bad[r.Name]; bad {
			return 0, nil, why
		}
		return 0, nil, "no instance has decided a factor yet"
	case m.manualInForce(r.Name, now):
		return 0, &rec, "a manual override is in force: it wins while it lasts"
	case now.Sub(rec.SetAt) > staleAfter(r.Adaptive):
		return 0, &rec, fmt.Sprintf("stale: no instance has evaluated the signal since %s", rec.SetAt.UTC().Format(time.RFC3339))
	}
	return r.Adaptive.Clamp(rec.Factor), &rec, ""
}

// manualInForce reports whether rule has a manual override now. m.mu is held.
func (m *Manager) manualInForce(rule string, now time.Time) bool {
	o, ok := m.ovs[rule]
	return ok && !o.expired(now)
}

// adaptiveView describes r's adaptive state. m.mu is held.
func (m *Manager) adaptiveView(r *limits.Rule, rec *AdaptiveRecord) *AdaptiveView {
	s := r.Adaptive
	v := &AdaptiveView{Source: s.Source.String(), Steps: s.DescribeSteps(), Factor: 1, Leader: m.adaptive.leading[r.Name]}
	if rec != nil {
		st := stateOf(*rec, s)
		v.Factor = st.Factor
		if !st.SignalAt.IsZero() {
			sig := st.Signal
			v.Signal, v.SignalAt = &sig, timePtr(st.SignalAt)
		}
		if !st.FailingSince.IsZero() {
			v.Error, v.FailingSince = st.Failing.String(), timePtr(st.FailingSince)
			if rec.ErrorDetail != "" {
				v.Error = rec.ErrorDetail
			}
		}
		v.SetBy, v.SetAt, v.ChangedAt = rec.SetBy, timePtr(rec.SetAt), timePtr(st.ChangedAt)
	}
	return v
}

// composeAdaptive is apply's step for adaptive rules: e is r after its
// manual override (r itself when it has none); the result is the rule in
// force, and rv gets the rule's adaptive view. m.mu is held.
func (m *Manager) composeAdaptive(r, e *limits.Rule, rv *RuleView, now time.Time) *limits.Rule {
	delete(m.adaptive.applied, r.Name)
	if r.Adaptive == nil {
		return e
	}
	f, rec, why := m.adaptiveFactor(r, now)
	av := m.adaptiveView(r, rec)
	rv.Adaptive = av
	if why != "" {
		av.NotApplied = why
		return e
	}
	m.adaptive.applied[r.Name] = f
	av.Applied = true
	if f == 1 {
		return e
	}
	applied, err := Apply(r, &Override{Factor: f, Reason: AdaptiveReason})
	if err != nil {
		av.Applied, av.NotApplied = false, "factor ignored: "+err.Error()
		m.log.Warn().Str("rule", r.Name).Float64("factor", f).Str("error", err.Error()).
			Msg("the adaptive factor does not fit the rule; the file's values apply")
		return e
	}
	return applied
}

// adaptiveNeedsApply reports whether the adaptive factors in force differ
// from what the last apply used. m.mu is held.
func (m *Manager) adaptiveNeedsApply(now time.Time) bool {
	for _, r := range m.file {
		var f float64
		if r.Adaptive != nil {
			f, _, _ = m.adaptiveFactor(r, now)
		}
		if f != m.adaptive.applied[r.Name] {
			return true
		}
	}
	return false
}

// refreshAdaptiveView updates the adaptive part of the view (signal, who
// decided, when) without a new rule set: what the limiter enforces is the
// same. m.mu is held.
func (m *Manager) refreshAdaptiveView(now time.Time) {
	old := m.view.Load()
	if old == nil {
		return
	}
	next := *old
	next.Rules = slices.Clone(old.Rules)
	for i := range next.Rules {
		rv := &next.Rules[i]
		r := m.fileRule(rv.Name)
		if r == nil || r.Adaptive == nil {
			continue
		}
		_, rec, why := m.adaptiveFactor(r, now)
		av := m.adaptiveView(r, rec)
		if prev := rv.Adaptive; why == "" && prev != nil {
			av.Applied, av.NotApplied = prev.Applied, prev.NotApplied // the same factor as when it was applied
		} else {
			av.Applied, av.NotApplied = why == "", why
		}
		rv.Adaptive = av
	}
	m.view.Store(&next)
}

// hasAdaptive reports whether a file rule has an adaptive block. m.mu is held.
func (m *Manager) hasAdaptive() bool {
	for _, r := range m.file {
		if r.Adaptive != nil {
			return true
		}
	}
	return false
}

// syncAdaptive reads the adaptive records and applies them if the factors
// in force change (or refreshes the view if only what they were decided
// from did). Without adaptive rules it reads nothing.
func (m *Manager) syncAdaptive(ctx context.Context) error {
	m.mu.Lock()
	active := m.hasAdaptive() || len(m.adaptive.raw) > 0
	m.mu.Unlock()
	if !active {
		return nil
	}
	raw, err := m.adaptive.store.Load(ctx)
	if err != nil {
		// The decisions in force stay, but not once stale: one nobody
		// refreshed in time is no longer applied, whether or not the
		// store answers (a raise would otherwise outlive it while Redis
		// is down).
		m.mu.Lock()
		if m.adaptiveNeedsApply(m.now()) {
			m.apply()
		}
		m.mu.Unlock()
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	changed := !maps.Equal(raw, m.adaptive.raw)
	if changed {
		m.adaptive.raw = raw
		m.adaptive.recs = make(map[string]AdaptiveRecord, len(raw))
		m.adaptive.bad = map[string]string{}
		for name, v := range raw {
			var rec AdaptiveRecord
			if err := json.Unmarshal([]byte(v), &rec); err != nil {
				m.adaptive.bad[name] = fmt.Sprintf("stored adaptive record is not valid JSON (%v)", err)
				continue
			}
			m.adaptive.recs[name] = rec
		}
	}
	switch {
	case m.adaptiveNeedsApply(now):
		m.apply()
	case changed:
		m.refreshAdaptiveView(now)
	}
	return nil
}

// setLeading records whether this instance evaluates rule's signal.
func (m *Manager) setLeading(rule string, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.adaptive.leading[rule] == on {
		return
	}
	if on {
		m.adaptive.leading[rule] = true
	} else {
		delete(m.adaptive.leading, rule)
	}
	m.refreshAdaptiveView(m.now())
}

// AdaptiveStatuses returns every adaptive rule's state, for the metrics,
// in file order.
func (m *Manager) AdaptiveStatuses() []AdaptiveStatus {
	m.mu.Lock()
	now := m.now()
	var out []AdaptiveStatus
	for _, r := range m.file {
		if r.Adaptive == nil {
			continue
		}
		s := AdaptiveStatus{Rule: r.Name, Factor: 1, Leader: m.adaptive.leading[r.Name]}
		if rec, ok := m.adaptive.recs[r.Name]; ok {
			st := stateOf(rec, r.Adaptive)
			if now.Sub(rec.SetAt) <= staleAfter(r.Adaptive) {
				s.Factor = st.Factor
			}
			s.Signal, s.HasSignal = st.Signal, !st.SignalAt.IsZero()
		}
		out = append(out, s)
	}
	m.mu.Unlock()
	for i := range out {
		st := m.adaptive.statsOf(out[i].Rule)
		out[i].Evaluations = st.evaluations.Load()
		for j := range out[i].Errors {
			out[i].Errors[j] = st.errors[j].Load()
		}
	}
	return out
}

// adaptiveSignature tells a reload that changed a rule's adaptive block.
func adaptiveSignature(r *limits.Rule) string { return r.Adaptive.Signature() }

// MemoryAdaptive keeps adaptive records and leases in the process
// (memory-store mode: this instance decides alone).
type MemoryAdaptive struct {
	mu     sync.Mutex
	recs   map[string]string
	leases map[string]memLease
	subs   map[chan struct{}]bool
}

type memLease struct {
	holder string
	until  time.Time
}

// NewMemoryAdaptive returns an empty in-process adaptive store.
func NewMemoryAdaptive() *MemoryAdaptive {
	return &MemoryAdaptive{recs: map[string]string{}, leases: map[string]memLease{}, subs: map[chan struct{}]bool{}}
}

// Load implements AdaptiveStore.
func (s *MemoryAdaptive) Load(context.Context) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.recs), nil
}

// Lead implements AdaptiveStore.
func (s *MemoryAdaptive) Lead(_ context.Context, rule, instance string, ttl time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if l, ok := s.leases[rule]; ok && l.holder != instance && now.Before(l.until) {
		return false, nil
	}
	s.leases[rule] = memLease{holder: instance, until: now.Add(ttl)}
	return true, nil
}

// Write implements AdaptiveStore.
func (s *MemoryAdaptive) Write(_ context.Context, rule, instance, value string, announce bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.leases[rule]; !ok || l.holder != instance || !time.Now().Before(l.until) {
		return false, nil
	}
	s.recs[rule] = value
	if announce {
		for ch := range s.subs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	return true, nil
}

// Release implements AdaptiveStore.
func (s *MemoryAdaptive) Release(_ context.Context, rule, instance string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.leases[rule]; ok && l.holder == instance {
		delete(s.leases, rule)
	}
	return nil
}

// Watch implements AdaptiveStore: it hears this process's announcements.
func (s *MemoryAdaptive) Watch(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.subs[ch] = true
	s.mu.Unlock()
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		delete(s.subs, ch)
		s.mu.Unlock()
	}()
	return ch
}

// Shared implements AdaptiveStore.
func (s *MemoryAdaptive) Shared() bool { return false }

// describeFactor writes a factor for log lines.
func describeFactor(f float64) string { return "x" + adaptive.FormatFactor(f) }
