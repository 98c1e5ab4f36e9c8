// Package policy owns the rules in force at run time: the config file's
// rules with the runtime overrides applied, kept in sync across instances
// through a shared override store, and swapped into the limiter at once on
// every change. It also watches the config file.
package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/metrics"
)

// DefaultSyncEvery is how often a Manager re-reads the overrides as a safety
// net under pub/sub: half the one-second promise, so an instance that missed
// an announcement still applies a change within a second.
const DefaultSyncEvery = 500 * time.Millisecond

// ErrUnknownRule is returned for a rule name that is not in the config file.
var ErrUnknownRule = errors.New("no such rule")

// Manager owns the rules in force: the config file's rules with the runtime
// overrides applied. Every change (reload, override set, deleted, expired or
// heard from another instance) computes the whole new rule set and swaps it
// into the limiter at once, so no request sees half of the old rules and
// half of the new ones.
type Manager struct {
	limiter   *limits.Limiter
	metrics   Observer
	log       zerolog.Logger
	store     OverrideStore
	syncEvery time.Duration
	now       func() time.Time

	// writeMu serializes SetOverride and DeleteOverride, whose store
	// calls run without mu: a stalled store must not hold every reader
	// of mu (scrapes, reloads, syncs, expiries) for the call's timeout.
	writeMu sync.Mutex

	mu       sync.Mutex // guards everything below
	file     []*limits.Rule
	source   string
	loadedAt time.Time
	raw      map[string]string   // overrides as last read or written
	ovs      map[string]Override // raw, decoded
	bad      map[string]string   // rule → why its stored override is unreadable
	gen      uint64              // bumped by every local override change
	nextExp  time.Time           // earliest expiry of an active override
	expiry   *time.Timer         // fires at nextExp: the override ends then, not at the next Sync

	view atomic.Pointer[RulesView]

	adaptive adaptiveState // adaptive factors and their controllers (adaptive.go)
	ids      *Identities   // identity overrides (identities_sync.go)
	aux      any           // installed with the rules (SetFileWith)
}

// Observer receives what the manager does, for metrics; *metrics.Metrics
// implements it.
type Observer interface {
	// SetRules is told the effective rules after every change.
	SetRules([]metrics.RuleInfo)
	// OverrideSyncFailed counts a failed read of the shared overrides.
	OverrideSyncFailed()
}

// ManagerOptions configures NewManager.
type ManagerOptions struct {
	// Config is the configuration loaded at start (its rules and source).
	Config *config.Config
	// Limiter receives the effective rules.
	Limiter *limits.Limiter
	// Metrics, when set, receives the rule gauges and sync failures.
	Metrics Observer
	// Overrides stores the runtime overrides (the Redis store's, or
	// MemoryOverrides).
	Overrides OverrideStore
	Log       zerolog.Logger
	// SyncEvery is the periodic re-read of the overrides (DefaultSyncEvery).
	SyncEvery time.Duration
	// Adaptive configures the adaptive limits (adaptive.go); RunAdaptive
	// runs them.
	Adaptive AdaptiveOptions
	// Identities stores the runtime identity overrides (the Redis store's,
	// or MemoryIdentities); MaxIdentities caps them.
	Identities    IdentityStore
	MaxIdentities int
}

// NewManager returns a manager enforcing opts.Config's rules and reads the
// stored overrides once (bounded by two seconds); if the store does not
// answer, the file's rules apply until Run's next re-read succeeds.
func NewManager(opts ManagerOptions) *Manager {
	m := &Manager{
		limiter:   opts.Limiter,
		metrics:   opts.Metrics,
		log:       opts.Log,
		store:     opts.Overrides,
		syncEvery: opts.SyncEvery,
		now:       time.Now,
		file:      opts.Config.Rules,
		source:    opts.Config.Source,
		loadedAt:  time.Now(),
		raw:       map[string]string{},
		ovs:       map[string]Override{},
		bad:       map[string]string{},
	}
	if m.syncEvery <= 0 {
		m.syncEvery = DefaultSyncEvery
	}
	if m.store == nil {
		m.store = NewMemoryOverrides()
	}
	m.adaptive.init(opts.Adaptive)
	m.ids = newManagerIdentities(&opts)
	m.mu.Lock()
	m.apply()
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := m.Sync(ctx); err != nil {
		m.log.Warn().Err(err).Msg("cannot read the runtime overrides yet; enforcing the file's rules until the store answers")
	}
	_ = m.syncAdaptive(ctx) // RunAdaptive says so if it keeps failing
	if err := m.ids.Load(ctx); err != nil {
		m.log.Warn().Err(err).Msg("cannot read the identity overrides yet; enforcing the rules without them until the store answers")
	}
	return m
}

// Run keeps the overrides in sync until ctx ends: on every announcement from
// another instance and every SyncEvery. It also retires expired overrides.
func (m *Manager) Run(ctx context.Context) {
	watch := m.store.Watch(ctx)
	t := time.NewTicker(m.syncEvery)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		err := m.Sync(sctx)
		cancel()
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			m.log.Warn().Err(err).Msg("cannot re-read the runtime overrides; keeping the ones in force")
			failing = true
		case err == nil && failing:
			m.log.Info().Msg("runtime overrides readable again")
			failing = false
		}
		m.retireExpired(ctx)
	}
}

// Sync reads the overrides from the store and applies them if they changed
// (or one expired).
func (m *Manager) Sync(ctx context.Context) error {
	m.mu.Lock()
	gen := m.gen
	m.mu.Unlock()
	raw, err := m.store.Load(ctx)
	if err != nil {
		if m.metrics != nil {
			m.metrics.OverrideSyncFailed()
		}
		// The overrides in force stay, but not past their ttl: one that
		// ended is no longer in force, whether or not the store answers
		// (an incident's 10x would otherwise outlive it while Redis is
		// down, and the local fallback would admit it).
		m.mu.Lock()
		if !m.nextExp.IsZero() && !m.now().Before(m.nextExp) {
			m.apply()
		}
		m.mu.Unlock()
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if gen != m.gen {
		// A local change raced this read; the next read will see it.
		return nil
	}
	expiredNow := !m.nextExp.IsZero() && !m.now().Before(m.nextExp)
	if maps.Equal(raw, m.raw) && !expiredNow {
		return nil
	}
	now := m.now()
	var gone []string
	for name, o := range m.ovs {
		if _, still := raw[name]; !still && !o.expired(now) {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		sort.Strings(gone)
		m.log.Warn().Strs("rules", gone).
			Msg("runtime overrides no longer in the shared store (deleted through another instance, or lost with the store's data): the file's values apply")
	}
	m.raw = raw
	m.ovs = make(map[string]Override, len(raw))
	m.bad = map[string]string{}
	for name, v := range raw {
		var o Override
		if err := json.Unmarshal([]byte(v), &o); err != nil {
			m.bad[name] = fmt.Sprintf("stored override is not valid JSON (%v): delete it and set it again", err)
			continue
		}
		m.ovs[name] = o
	}
	m.apply()
	return nil
}

// retireExpired deletes expired overrides from the store, each only while
// the store still holds the expired value: another instance may have set
// a new one since this one last read. Every instance may do it; deleting
// twice is harmless.
func (m *Manager) retireExpired(ctx context.Context) {
	now := m.now()
	gone := map[string]string{}
	m.mu.Lock()
	for name, o := range m.ovs {
		if o.expired(now) {
			gone[name] = m.raw[name]
		}
	}
	m.mu.Unlock()
	for name, value := range gone {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := m.store.Retire(dctx, name, value); err == nil {
			m.log.Info().Str("rule", name).Msg("runtime override expired; the file's values apply again")
		}
		cancel()
	}
}

// apply computes the effective rules and swaps them in. m.mu is held.
func (m *Manager) apply() {
	now := m.now()
	eff := make([]*limits.Rule, len(m.file))
	infos := make([]metrics.RuleInfo, len(m.file))
	view := &RulesView{
		Source:          m.source,
		LoadedAt:        m.loadedAt.UTC(),
		OverridesShared: m.store.Shared(),
		Rules:           make([]RuleView, len(m.file)),
	}
	m.nextExp = time.Time{}
	inFile := make(map[string]bool, len(m.file))
	for i, r := range m.file {
		inFile[r.Name] = true
		rv := RuleView{
			Name:      r.Name,
			Algorithm: string(r.Algorithm),
			Key:       keyParts(r),
			Match:     r.Match.String(),
			Cost:      r.Cost,
			Shadow:    r.Shadow,
			Lease:     r.Lease,
			File:      valuesOf(r),
		}
		e := r
		if o, ok := m.ovs[r.Name]; ok && !o.expired(now) {
			oc := o
			rv.Override = &oc
			if o.ExpiresAt != nil && (m.nextExp.IsZero() || o.ExpiresAt.Before(m.nextExp)) {
				m.nextExp = *o.ExpiresAt
			}
			// A reload may have changed the rule under the override. Where
			// what still fits lowers the rule (a burst on a rule now of a
			// window algorithm goes, the limit stays), that stays in force:
			// dropping a lowering override fails open.
			if applied, err := Apply(r, &o); err == nil {
				e = applied
			} else if strict, ok := strictFit(r, o.numbers()); ok {
				e = strict
				rv.OverrideError = "override applied in part: " + err.Error()
				m.log.Warn().Str("rule", r.Name).Str("error", err.Error()).Msg("runtime override does not fit the rule as the file now defines it; what still fits and lowers the rule stays in force")
			} else {
				rv.OverrideError = "override ignored: " + err.Error()
				m.log.Warn().Str("rule", r.Name).Str("error", err.Error()).Msg("runtime override does not fit the rule as the file now defines it; ignoring it")
			}
		}
		if why, ok := m.bad[r.Name]; ok {
			rv.OverrideError = why
		}
		overridden := e != r
		e = m.composeAdaptive(r, e, &rv, now) // a manual override wins over the adaptive factor
		rv.Effective = valuesOf(e)
		eff[i] = e
		view.Rules[i] = rv
		infos[i] = metrics.RuleInfo{Name: e.Name, Limit: e.Limit, Period: e.Period, Burst: e.Burst,
			Shadow: e.Shadow, Override: overridden}
	}
	for name, o := range m.ovs {
		if !inFile[name] {
			if view.Orphans == nil {
				view.Orphans = map[string]Override{}
			}
			view.Orphans[name] = o
		}
	}
	m.limiter.SetRulesWith(m.ids.Install(eff), m.aux)
	if m.metrics != nil {
		m.metrics.SetRules(infos)
	}
	m.view.Store(view)
	m.armExpiry()
}

// armExpiry sets the timer that ends the earliest override at its
// ExpiresAt: Sync runs only every SyncEvery, and an override raising a
// limit must not outlive its ttl by that long (identity overrides end on
// every request's clock). m.mu is held.
func (m *Manager) armExpiry() {
	if m.expiry != nil {
		m.expiry.Stop()
		m.expiry = nil
	}
	if m.nextExp.IsZero() {
		return
	}
	m.expiry = time.AfterFunc(max(m.nextExp.Sub(m.now()), 0), func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if !m.nextExp.IsZero() && !m.now().Before(m.nextExp) {
			m.apply()
		} else {
			// early on the wall clock (the timer runs on the
			// monotonic one), or moved: wait again
			m.armExpiry()
		}
	})
}

// OverrideCount returns how many runtime overrides are in force.
func (m *Manager) OverrideCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	now := m.now()
	for _, o := range m.ovs {
		if !o.expired(now) {
			n++
		}
	}
	return n
}

// View returns the rules as GET /v1/rules shows them.
func (m *Manager) View() *RulesView { return m.view.Load() }

// SetOverride validates body (a PUT /v1/rules/{name}/override body) against
// the file's rule, stores it and applies it. Errors: ErrUnknownRule,
// FieldErrors (400), or the store's error (503).
func (m *Manager) SetOverride(ctx context.Context, name string, body []byte) (RuleView, error) {
	o, err := ParseOverride(body, m.now())
	if err != nil {
		return RuleView{}, err
	}
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	m.mu.Lock()
	r := m.fileRule(name)
	source := m.source
	m.mu.Unlock()
	if r == nil {
		return RuleView{}, fmt.Errorf("%w %q in %s", ErrUnknownRule, name, source)
	}
	if _, err := Apply(r, &o); err != nil {
		return RuleView{}, err
	}
	b, err := json.Marshal(o)
	if err != nil {
		return RuleView{}, err
	}
	// Without mu (writeMu keeps writes in order): a reload in between is
	// applied to the override as to any stored one (apply).
	if err := m.store.Set(ctx, name, string(b)); err != nil {
		return RuleView{}, &StoreError{err}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	m.raw = maps.Clone(m.raw)
	m.raw[name] = string(b)
	m.ovs[name] = o
	delete(m.bad, name)
	m.apply()
	m.log.Info().Str("rule", name).RawJSON("override", b).Msg("runtime override set")
	return m.ruleView(name), nil
}

// DeleteOverride removes a rule's override; the file's values apply again.
// Deleting a rule that has none is not an error.
func (m *Manager) DeleteOverride(ctx context.Context, name string) (RuleView, error) {
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	m.mu.Lock()
	_, had := m.raw[name]
	known, source := m.fileRule(name) != nil, m.source
	m.mu.Unlock()
	if !known && !had {
		return RuleView{}, fmt.Errorf("%w %q in %s, and no override stored for it", ErrUnknownRule, name, source)
	}
	if err := m.store.Delete(ctx, name); err != nil {
		return RuleView{}, &StoreError{err}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	m.raw = maps.Clone(m.raw)
	delete(m.raw, name)
	delete(m.ovs, name)
	delete(m.bad, name)
	m.apply()
	if had {
		m.log.Info().Str("rule", name).Msg("runtime override deleted; the file's values apply again")
	}
	return m.ruleView(name), nil
}

// SetFile replaces the config file's rules (a reload) and applies the
// overrides to them, in one swap. It reports the rule names by what the
// change did to them.
func (m *Manager) SetFile(rules []*limits.Rule, source string) (added, removed, changed []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.setFile(rules, source)
}

// SetFileWith is SetFile that also installs aux with the rules, in the
// same swap (limits.Limiter.SetRulesWith); every later change of the
// rules keeps it.
func (m *Manager) SetFileWith(rules []*limits.Rule, source string, aux any) (added, removed, changed []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.aux = aux
	return m.setFile(rules, source)
}

// setFile is SetFile. m.mu is held.
func (m *Manager) setFile(rules []*limits.Rule, source string) (added, removed, changed []string) {
	added, removed, changed = diffRules(m.file, rules)
	m.file = rules
	m.source = source
	m.loadedAt = m.now()
	m.apply()
	return added, removed, changed
}

// fileRule returns the config file's rule called name, or nil. m.mu is held.
func (m *Manager) fileRule(name string) *limits.Rule {
	for _, r := range m.file {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// ruleView returns one rule's view (the zero RuleView with only the name
// for an orphan override that was just deleted). m.mu is held.
func (m *Manager) ruleView(name string) RuleView {
	for _, rv := range m.view.Load().Rules {
		if rv.Name == name {
			return rv
		}
	}
	return RuleView{Name: name}
}

// StoreError is an override store failure (the admin API answers 503).
type StoreError struct{ err error }

func (e *StoreError) Error() string { return e.err.Error() }
func (e *StoreError) Unwrap() error { return e.err }

// RulesView is GET /v1/rules: every rule with its file values, override and
// effective values side by side.
type RulesView struct {
	// Source is the config file (or "built-in example policy").
	Source   string    `json:"source"`
	LoadedAt time.Time `json:"loaded_at"`
	// OverridesShared is true when overrides live in Redis (every instance
	// applies them), false in memory-store mode (this process only).
	OverridesShared bool       `json:"overrides_shared"`
	Rules           []RuleView `json:"rules"`
	// Orphans are stored overrides whose rule is not in the config file.
	// They apply again if the rule comes back.
	Orphans map[string]Override `json:"orphan_overrides,omitempty"`
}

// RuleView is one rule in GET /v1/rules.
type RuleView struct {
	Name      string   `json:"name"`
	Algorithm string   `json:"algorithm"`
	Key       []string `json:"key"`
	Match     string   `json:"match"`
	Cost      int64    `json:"cost"`
	Shadow    bool     `json:"shadow"`
	Lease     bool     `json:"lease"`
	File      Values   `json:"file"`
	// Override is the active override, or null.
	Override *Override `json:"override"`
	// OverrideError says why a stored override is not applied.
	OverrideError string `json:"override_error,omitempty"`
	// Adaptive is the rule's adaptive factor; absent without an adaptive block.
	Adaptive  *AdaptiveView `json:"adaptive,omitempty"`
	Effective Values        `json:"effective"`
}

// Values are a rule's numbers.
type Values struct {
	Limit  int64    `json:"limit"`
	Period Duration `json:"period"`
	Burst  int64    `json:"burst"`
}

func valuesOf(r *limits.Rule) Values {
	return Values{Limit: r.Limit, Period: Duration(r.Period), Burst: r.Burst}
}

func keyParts(r *limits.Rule) []string {
	parts := make([]string, len(r.Key))
	for i, p := range r.Key {
		parts[i] = p.String()
	}
	return parts
}

// diffRules compares two rule sets by name.
func diffRules(old, next []*limits.Rule) (added, removed, changed []string) {
	was := make(map[string]*limits.Rule, len(old))
	for _, r := range old {
		was[r.Name] = r
	}
	is := make(map[string]bool, len(next))
	for _, r := range next {
		is[r.Name] = true
		o, ok := was[r.Name]
		switch {
		case !ok:
			added = append(added, r.Name)
		case signature(o) != signature(r):
			changed = append(changed, r.Name)
		}
	}
	for _, r := range old {
		if !is[r.Name] {
			removed = append(removed, r.Name)
		}
	}
	sort.Strings(added)
	sort.Strings(removed)
	sort.Strings(changed)
	return added, removed, changed
}

func signature(r *limits.Rule) string {
	return fmt.Sprintf("%s|%v|%s|%d|%d|%d|%d|%t|%d|%t|%s", r.Match.String(), keyParts(r), r.Algorithm,
		r.Limit, r.Period, r.Burst, r.Cost, r.Shadow, r.Anonymous, r.Lease, adaptiveSignature(r)+"|"+exceptionsSignature(r))
}
