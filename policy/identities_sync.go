package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/limits"
)

// DefaultMaxIdentities is identity_overrides.max_entries when not set.
const DefaultMaxIdentities = 100_000

// Identities keeps the identity overrides in force: the config file's
// exceptions and the runtime overrides of the shared store, applied to the
// rules in force and handed to the limiter as one IdentityTable per rule
// (limits/identities.go).
//
// Runtime overrides are kept in sync as deltas: every change through any
// instance is announced with its version (the store's change counter), and
// applied here one by one, in order. A full read happens only when a
// change may have been missed: at start, after a (re)subscription that
// finds the counter moved, at a gap in the versions, and when the counter
// read every SyncEvery (the safety net) is ahead of what was heard a
// moment later. Expiry needs no message: the limiter ends an override at
// its ExpiresAt on every instance, and the first instance that notices
// deletes it from the store.
//
// Changing an identity's entry also drops this instance's cached denial of
// that identity (limits.Limiter.ForgetIdentity): a denial under the old
// numbers may end earlier under the new ones.
type Identities struct {
	limiter *limits.Limiter
	store   IdentityStore
	log     zerolog.Logger
	now     func() time.Time
	every   time.Duration
	failed  func()
	max     atomic.Int64
	// writeMu serializes changes made here when no watcher orders them
	// (a store that is not shared).
	writeMu sync.Mutex

	mu       sync.Mutex // guards everything below
	rules    map[string]*ruleIdentities
	stored   map[string]map[string]*storedIdentity // rule → identity → override
	total    int
	version  uint64
	advanced chan struct{} // closed when version moves
	nextExp  int64         // earliest ExpiresAt in µs among stored; 0 none
}

// storedIdentity is one stored runtime override, compact: 100,000 of them
// stay a few tens of megabytes.
type storedIdentity struct {
	raw string // as stored
	// bad says why raw cannot be used ("" when it can).
	bad       string
	action    limits.IdentityAction
	n         numbers
	expiresUS int64
	key       string // the rule's key dimensions when set, comma-separated
}

// numbers are an override's limit, period, burst and factor (zero: not set).
type numbers struct {
	limit, burst int64
	period       time.Duration
	factor       float64
}

// ruleIdentities is one rule's part: its table and what it is built from.
type ruleIdentities struct {
	base   *limits.Rule // the rule in force, without its table
	sig    string
	key    string // keyParts(base), comma-separated
	table  *limits.IdentityTable
	static map[string]*limits.IdentityEntry // exact config exceptions by identity
	// staticErr says, by exception index, why a config exception does not
	// apply to the rule in force (a rule override moved its bounds).
	staticErr map[int]string
	derived   map[numbers]*limits.Rule
	exempt    *limits.Rule
	block     *limits.Rule
}

// IdentitiesOptions configures NewIdentities.
type IdentitiesOptions struct {
	Limiter *limits.Limiter
	// Store keeps the runtime overrides (nil: MemoryIdentities).
	Store IdentityStore
	// Max caps the runtime overrides stored (DefaultMaxIdentities).
	Max int
	Log zerolog.Logger
	// SyncEvery is how often the store's change counter is compared with
	// what was heard (DefaultSyncEvery).
	SyncEvery time.Duration
	// SyncFailed, when set, counts failed reads of the store.
	SyncFailed func()
}

// NewIdentities returns the identity overrides of a limiter. Install
// gives its tables to the rules; Load reads the store; Run keeps it in sync.
func NewIdentities(opts IdentitiesOptions) *Identities {
	x := &Identities{
		limiter:  opts.Limiter,
		store:    opts.Store,
		log:      opts.Log,
		now:      time.Now,
		every:    opts.SyncEvery,
		failed:   opts.SyncFailed,
		rules:    map[string]*ruleIdentities{},
		stored:   map[string]map[string]*storedIdentity{},
		advanced: make(chan struct{}),
	}
	if x.store == nil {
		x.store = NewMemoryIdentities()
	}
	if x.every <= 0 {
		x.every = DefaultSyncEvery
	}
	x.SetMax(opts.Max)
	return x
}

// newManagerIdentities builds a Manager's identity overrides from its options.
func newManagerIdentities(opts *ManagerOptions) *Identities {
	var failed func()
	if opts.Metrics != nil {
		failed = opts.Metrics.OverrideSyncFailed
	}
	return NewIdentities(IdentitiesOptions{Limiter: opts.Limiter, Store: opts.Identities, Max: opts.MaxIdentities,
		Log: opts.Log, SyncEvery: opts.SyncEvery, SyncFailed: failed})
}

// Identities returns the manager's identity overrides.
func (m *Manager) Identities() *Identities { return m.ids }

// exceptionsSignature describes a rule's config exceptions, so that a
// reload that changes only them lists the rule as changed.
func exceptionsSignature(r *limits.Rule) string {
	if len(r.Exceptions) == 0 {
		return ""
	}
	var b strings.Builder
	for _, ex := range r.Exceptions {
		fmt.Fprintf(&b, "%s:%s:%d:%d:%d:%g:%q;", describeMatch(ex.Match), ex.Action, ex.Limit, ex.Period, ex.Burst, ex.Factor, ex.Reason)
	}
	return b.String()
}

// SetMax changes the cap on stored runtime overrides (<= 0: the default).
func (x *Identities) SetMax(n int) {
	if n <= 0 {
		n = DefaultMaxIdentities
	}
	x.max.Store(int64(n))
}

// Max returns the cap on stored runtime overrides.
func (x *Identities) Max() int { return int(x.max.Load()) }

// Shared says whether the runtime overrides live in Redis (every instance).
func (x *Identities) Shared() bool { return x.store.Shared() }

func (x *Identities) nowUS() int64 { return x.now().UnixMicro() }

// Install builds the identity tables of the rules in force and returns the
// rules the limiter should run: each a copy carrying its table. A rule
// whose numbers, match, key and exceptions did not change keeps its table.
func (x *Identities) Install(eff []*limits.Rule) []*limits.Rule {
	x.mu.Lock()
	defer x.mu.Unlock()
	now := x.nowUS()
	out := make([]*limits.Rule, len(eff))
	next := make(map[string]*ruleIdentities, len(eff))
	for i, r := range eff {
		sig := identitySignature(r)
		ri := x.rules[r.Name]
		if ri == nil || ri.sig != sig {
			ri = x.build(r, sig, now)
		}
		next[r.Name] = ri
		out[i] = r.WithIdentities(ri.table)
	}
	x.rules = next
	return out
}

// identitySignature is what an identity table depends on.
func identitySignature(r *limits.Rule) string {
	return fmt.Sprintf("%s|%p/%d", signature(r), r.Exceptions, len(r.Exceptions))
}

// build makes the table of rule r: its exceptions, then the runtime
// overrides stored for it on top. x.mu is held.
func (x *Identities) build(r *limits.Rule, sig string, now int64) *ruleIdentities {
	ri := &ruleIdentities{
		base: r, sig: sig, key: strings.Join(keyParts(r), ","),
		static: map[string]*limits.IdentityEntry{}, staticErr: map[int]string{},
		derived: map[numbers]*limits.Rule{},
		exempt:  r.Derive(limits.IdentityExempt), block: r.Derive(limits.IdentityBlock),
	}
	var ranges []limits.IdentityRange
	for i := range r.Exceptions {
		ex := &r.Exceptions[i]
		rule, err := ri.ruleFor(ex.Action, numbers{limit: ex.Limit, burst: ex.Burst, period: ex.Period, factor: ex.Factor})
		if err != nil {
			ri.staticErr[i] = err.Error()
			x.log.Warn().Str("rule", r.Name).Str("exception", describeMatch(ex.Match)).Str("error", err.Error()).
				Msg("config exception does not fit the rule in force (a runtime override changed it); ignoring the exception")
			continue
		}
		e := limits.IdentityEntry{Rule: rule}
		if ex.ID == "" {
			ranges = append(ranges, limits.IdentityRange{Prefix: ex.Range, IP: ex.IP, Parts: ex.Parts, Entry: e})
			continue
		}
		ri.static[ex.ID] = &e
	}
	entries := make(map[string]limits.IdentityEntry, len(ri.static)+len(x.stored[r.Name]))
	for id, e := range ri.static {
		entries[id] = *e
	}
	for id, s := range x.stored[r.Name] {
		if e, ok := ri.entryOf(id, s, now); ok {
			entries[id] = e
		}
	}
	ri.table = limits.NewIdentityTable(entries, ranges)
	return ri
}

// ruleFor returns the rule an identity with action and n is decided by,
// derived from the rule in force; an error when n does not fit it.
func (ri *ruleIdentities) ruleFor(action limits.IdentityAction, n numbers) (*limits.Rule, error) {
	switch action {
	case limits.IdentityExempt:
		return ri.exempt, nil
	case limits.IdentityBlock:
		return ri.block, nil
	}
	if r, ok := ri.derived[n]; ok {
		return r, nil
	}
	applied, err := Apply(ri.base, &Override{Limit: n.limit, Burst: n.burst, Period: Duration(n.period), Factor: n.factor})
	if err != nil {
		return nil, err
	}
	d := applied.Derive(limits.IdentityLimit)
	if len(ri.derived) >= 4096 {
		// Distinct numbers only pile up through churn; entries keep theirs.
		clear(ri.derived)
	}
	ri.derived[n] = d
	return d, nil
}

// entryOf returns the table entry of stored override s at now; false when
// it does not apply (expired, unreadable, for other key dimensions, or
// out of the rule's bounds).
func (ri *ruleIdentities) entryOf(id string, s *storedIdentity, now int64) (limits.IdentityEntry, bool) {
	if ri.problem(s) != "" || (s.expiresUS != 0 && now >= s.expiresUS) {
		return limits.IdentityEntry{}, false
	}
	rule, err := ri.ruleFor(s.action, s.n)
	if err != nil {
		return limits.IdentityEntry{}, false
	}
	return limits.IdentityEntry{Rule: rule, ExpiresUS: s.expiresUS, Fallback: ri.static[id]}, true
}

// problem says why s cannot apply to the rule in force ("" when it can).
func (ri *ruleIdentities) problem(s *storedIdentity) string {
	switch {
	case s.bad != "":
		return s.bad
	case s.key != ri.key:
		return fmt.Sprintf("set for a rule keyed on [%s], the rule is now keyed on [%s]: delete it", s.key, ri.key)
	}
	if _, err := ri.ruleFor(s.action, s.n); err != nil {
		return "does not fit the rule as it now stands: " + err.Error()
	}
	return ""
}

// refresh recomputes the table entry of identity id from what is stored
// and the exceptions. x.mu is held.
func (x *Identities) refresh(ri *ruleIdentities, id string, now int64) {
	if s := x.stored[ri.base.Name][id]; s != nil {
		if e, ok := ri.entryOf(id, s, now); ok {
			ri.table.Set(id, e)
			return
		}
	}
	if e := ri.static[id]; e != nil {
		ri.table.Set(id, *e)
		return
	}
	ri.table.Delete(id)
}

// decodeStored reads a stored value.
func decodeStored(raw string) *storedIdentity {
	s := &storedIdentity{raw: raw}
	var o IdentityOverride
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		s.bad = fmt.Sprintf("stored value is not valid JSON (%v): delete it and set it again", err)
		return s
	}
	if o.Exempt && o.Block {
		s.bad = "stored value is both exempt and block: delete it and set it again"
		return s
	}
	if o.Key == nil {
		s.bad = errNotStored.Error() + " (no key): delete it and set it again"
		return s
	}
	s.action = o.action()
	s.n = numbers{limit: o.Limit, burst: o.Burst, period: time.Duration(o.Period), factor: o.Factor}
	if s.action == limits.IdentityLimit && s.n == (numbers{}) {
		s.bad = "stored value has no limit, period, burst or factor: delete it and set it again"
	}
	if o.ExpiresAt != nil {
		s.expiresUS = o.ExpiresAt.UnixMicro()
	}
	s.key = strings.Join(o.Key, ",")
	return s
}

// put records value (""= deleted) as the stored override of (rule, id),
// without touching the tables. It reports whether anything changed. x.mu
// is held.
func (x *Identities) put(rule, id, value string) bool {
	m := x.stored[rule]
	old := m[id]
	if value == "" {
		if old == nil {
			return false
		}
		delete(m, id)
		if len(m) == 0 {
			delete(x.stored, rule)
		}
		x.total--
		return true
	}
	if old != nil && old.raw == value {
		return false
	}
	s := decodeStored(value)
	if m == nil {
		m = map[string]*storedIdentity{}
		x.stored[rule] = m
	}
	if old == nil {
		x.total++
	}
	m[id] = s
	if s.expiresUS != 0 && (x.nextExp == 0 || s.expiresUS < x.nextExp) {
		x.nextExp = s.expiresUS
	}
	return true
}

// change applies one change: the stored value, the table entry, and the
// deny cache. x.mu is held.
func (x *Identities) change(rule, id, value string) {
	if !x.put(rule, id, value) {
		return
	}
	if ri := x.rules[rule]; ri != nil {
		x.refresh(ri, id, x.nowUS())
		x.limiter.ForgetIdentity(ri.base, id)
	}
}

// setVersion records that every change up to v is applied. x.mu is held.
func (x *Identities) setVersion(v uint64) {
	if v == x.version {
		return
	}
	x.version = v
	close(x.advanced)
	x.advanced = make(chan struct{})
}

// bulkThreshold is the number of changes to one rule past which a full
// read rebuilds its table at once rather than change by change.
const bulkThreshold = 256

// forgetThreshold is the number of changed identities past which a full
// read clears this instance's deny cache rather than forget each one.
const forgetThreshold = 4096

// loadAll makes all (a full read at version v) the stored overrides,
// applying what changed. x.mu is held.
func (x *Identities) loadAll(v uint64, all map[string]map[string]string) {
	now := x.nowUS()
	changed := map[string][]string{}
	n, lost := 0, 0
	for rule, m := range all {
		for id, raw := range m {
			if x.put(rule, id, raw) {
				changed[rule] = append(changed[rule], id)
				n++
			}
		}
	}
	for rule, m := range x.stored {
		for id, s := range m {
			if _, still := all[rule][id]; still {
				continue
			}
			if s.expiresUS == 0 || now < s.expiresUS {
				lost++
			}
			x.put(rule, id, "")
			changed[rule] = append(changed[rule], id)
			n++
		}
	}
	if lost > 0 {
		x.log.Warn().Int("identity_overrides", lost).
			Msg("identity overrides no longer in the shared store (deleted while this instance did not hear it, or lost with the store's data): the rules' own numbers apply to them")
	}
	for rule, ids := range changed {
		ri := x.rules[rule]
		if ri == nil {
			continue
		}
		if len(ids) < bulkThreshold {
			for _, id := range ids {
				x.refresh(ri, id, now)
			}
			continue
		}
		entries := make(map[string]limits.IdentityEntry, len(x.stored[rule])+len(ri.static))
		for id, e := range ri.static {
			entries[id] = *e
		}
		for id, s := range x.stored[rule] {
			if e, ok := ri.entryOf(id, s, now); ok {
				entries[id] = e
			}
		}
		ri.table.Replace(entries)
	}
	if n > forgetThreshold {
		if dc := x.limiter.DenyCache(); dc != nil {
			dc.Clear()
		}
	} else {
		for rule, ids := range changed {
			if ri := x.rules[rule]; ri != nil {
				for _, id := range ids {
					x.limiter.ForgetIdentity(ri.base, id)
				}
			}
		}
	}
	x.setVersion(v)
}

// Load reads every stored override and applies them (a full read).
func (x *Identities) Load(ctx context.Context) error {
	v, all, err := x.store.Load(ctx)
	if err != nil {
		if x.failed != nil {
			x.failed()
		}
		return err
	}
	x.mu.Lock()
	x.loadAll(v, all)
	x.mu.Unlock()
	return nil
}

// Run keeps the runtime overrides in sync and retires expired ones until
// ctx ends.
func (x *Identities) Run(ctx context.Context) {
	retired := make(chan struct{})
	go func() {
		defer close(retired)
		t := time.NewTicker(x.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				x.retire(ctx)
			}
		}
	}()
	defer func() { <-retired }()
	events := x.store.Watch(ctx)
	t := time.NewTicker(x.every)
	defer t.Stop()
	failing := false
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case c, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			err = x.heard(ctx, c, events)
		case <-t.C:
			if x.store.Shared() {
				err = x.check(ctx, events)
			}
		}
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			x.log.Warn().Err(err).Msg("cannot read the identity overrides; keeping the ones in force")
			failing = true
		case err == nil && failing:
			x.log.Info().Msg("identity overrides readable again")
			failing = false
		}
	}
}

// heard applies one announcement: the next change in order, or, after a
// gap or a resubscription, whatever a version check finds missing.
func (x *Identities) heard(ctx context.Context, c limits.IdentityChange, events <-chan limits.IdentityChange) error {
	if c.Resync {
		return x.check(ctx, events)
	}
	x.mu.Lock()
	switch {
	case c.Version <= x.version:
		// Already applied: a full read covered it.
	case c.Version == x.version+1:
		x.change(c.Rule, c.ID, c.Value)
		x.setVersion(c.Version)
	default:
		x.mu.Unlock()
		x.log.Info().Uint64("heard", c.Version).Msg("an identity override change was missed; reading them all")
		return x.full(ctx)
	}
	x.mu.Unlock()
	return nil
}

// inFlight bounds the wait for announcements already published when the
// counter shows more changes than were heard.
const inFlight = 100 * time.Millisecond

// check compares the store's counter with what was applied: equal is the
// common case; ahead, the announcements may still be on their way, so
// they get inFlight to arrive before a full read; behind, the store lost
// its data.
func (x *Identities) check(ctx context.Context, events <-chan limits.IdentityChange) error {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	v, err := x.store.Version(cctx)
	cancel()
	if err != nil {
		if x.failed != nil {
			x.failed()
		}
		return err
	}
	cur := x.Version()
	if v == cur {
		return nil
	}
	if v > cur && x.await(ctx, events, v) {
		return nil
	}
	return x.full(ctx)
}

// await applies announcements for up to inFlight, until version v is
// applied; it reports whether it was.
func (x *Identities) await(ctx context.Context, events <-chan limits.IdentityChange, v uint64) bool {
	deadline := time.NewTimer(inFlight)
	defer deadline.Stop()
	for x.Version() < v {
		select {
		case c, ok := <-events:
			if !ok {
				return false
			}
			if c.Resync {
				return false // a full read follows anyway
			}
			if x.heard(ctx, c, nil) != nil {
				return false
			}
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// full is a bounded full read.
func (x *Identities) full(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return x.Load(lctx)
}

// Version returns the store's change counter as last applied here.
func (x *Identities) Version() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.version
}

// retireBatch bounds the expired overrides one tick deletes from the
// store; the rest wait for the next tick (the limiter ignores them anyway).
const retireBatch = 512

// retire deletes expired overrides from the store (the limiter stopped
// applying them at their ExpiresAt already). Every instance may; the
// delete only removes the value that expired. With a shared store the
// deletion applies here when it is heard back, like any other change.
func (x *Identities) retire(ctx context.Context) {
	now := x.nowUS()
	type gone struct{ rule, id, raw string }
	var expired []gone
	x.mu.Lock()
	if x.nextExp == 0 || now < x.nextExp {
		x.mu.Unlock()
		return
	}
	next := int64(0)
	for rule, m := range x.stored {
		for id, s := range m {
			switch {
			case s.expiresUS == 0:
			case now >= s.expiresUS && len(expired) < retireBatch:
				expired = append(expired, gone{rule, id, s.raw})
			case now >= s.expiresUS:
				next = now // more than one batch: the next tick goes on
			case next == 0 || s.expiresUS < next:
				next = s.expiresUS
			}
		}
	}
	x.nextExp = next
	x.mu.Unlock()
	retired := 0
	for i, g := range expired {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		var changed bool
		var err error
		if x.store.Shared() {
			_, changed, err = x.store.Delete(dctx, g.rule, g.id, g.raw)
		} else {
			_, changed, err = x.delete(dctx, g.rule, g.id, g.raw)
		}
		cancel()
		if err != nil {
			// Try again at the next tick; the limiter ignores them anyway.
			x.mu.Lock()
			x.nextExp = now
			x.mu.Unlock()
			x.log.Warn().Err(err).Int("left", len(expired)-i).Msg("cannot delete expired identity overrides from the store yet")
			break
		}
		if changed {
			retired++
		}
	}
	if retired > 0 {
		x.log.Info().Int("identity_overrides", retired).Msg("identity overrides expired; the rules' own numbers apply to them again")
	}
}

// delete removes (rule, id) from the store (only while it holds expect,
// when given) and applies the change here.
func (x *Identities) delete(ctx context.Context, rule, id, expect string) (uint64, bool, error) {
	if !x.store.Shared() {
		x.writeMu.Lock()
		defer x.writeMu.Unlock()
	}
	v, changed, err := x.store.Delete(ctx, rule, id, expect)
	if err != nil || !changed {
		return v, changed, err
	}
	x.settle(ctx, v, rule, id, "")
	return v, true, nil
}

// settleWait bounds how long a change waits to be heard back from the
// store before it is applied here directly.
const settleWait = 1500 * time.Millisecond

// settle makes this instance apply a change it made, version v: at once
// without a shared store; with one, by waiting to hear it announced (so
// that changes apply in the store's order), applying it directly if the
// announcement does not come.
func (x *Identities) settle(ctx context.Context, v uint64, rule, id, value string) {
	if !x.store.Shared() {
		x.mu.Lock()
		x.change(rule, id, value)
		x.setVersion(v)
		x.mu.Unlock()
		return
	}
	wctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	for {
		x.mu.Lock()
		if x.version >= v {
			x.mu.Unlock()
			return
		}
		ch := x.advanced
		x.mu.Unlock()
		select {
		case <-ch:
		case <-wctx.Done():
			x.mu.Lock()
			x.change(rule, id, value)
			x.mu.Unlock()
			x.log.Warn().Str("rule", rule).Uint64("version", v).
				Msg("identity override change not heard back from the store in time; applied here, other instances apply it at their next check")
			return
		}
	}
}

// ErrNoIdentityOverride is Delete's answer when the identity has no runtime override.
var ErrNoIdentityOverride = errors.New("no runtime identity override")

// Set validates and stores a runtime override of the identity req (given
// as dims, the query parameters) under rule, and applies it. Errors:
// ErrUnknownRule, limits.ErrNotApplicable, FieldErrors (400),
// *limits.IdentityCapError (409), or *StoreError (503).
func (x *Identities) Set(ctx context.Context, rule string, dims map[string]string, req *limits.Request, body []byte, setBy string) (IdentityView, error) {
	o, err := ParseIdentityOverride(body, x.now())
	if err != nil {
		return IdentityView{}, err
	}
	o.Identity, o.SetBy = dims, setBy
	x.mu.Lock()
	ri := x.rules[rule]
	if ri == nil {
		x.mu.Unlock()
		return IdentityView{}, fmt.Errorf("%w %q", ErrUnknownRule, rule)
	}
	base := ri.base
	if len(base.Key) == 0 {
		x.mu.Unlock()
		return IdentityView{}, FieldErrors{fmt.Sprintf("rule %q is keyed on nothing: one counter for every request, no identities; change the rule itself with PUT /v1/rules/%s/override", rule, rule)}
	}
	o.Key = keyParts(base)
	id, ok := limits.KeyIdentity(base, req)
	if !ok {
		x.mu.Unlock()
		return IdentityView{}, limits.ErrNotApplicable
	}
	_, ferr := ri.ruleFor(o.action(), numbers{limit: o.Limit, burst: o.Burst, period: time.Duration(o.Period), factor: o.Factor})
	x.mu.Unlock()
	if ferr != nil {
		var fe FieldErrors
		if errors.As(ferr, &fe) {
			return IdentityView{}, fe
		}
		return IdentityView{}, FieldErrors{ferr.Error()}
	}
	b, err := json.Marshal(o)
	if err != nil {
		return IdentityView{}, err
	}
	if !x.store.Shared() {
		x.writeMu.Lock()
		defer x.writeMu.Unlock()
	}
	v, err := x.store.Set(ctx, rule, id, string(b), x.Max())
	var capErr *limits.IdentityCapError
	switch {
	case errors.As(err, &capErr):
		return IdentityView{}, capErr
	case err != nil:
		return IdentityView{}, &StoreError{err}
	}
	x.settle(ctx, v, rule, id, string(b))
	x.log.Info().Str("rule", rule).Str("identity", id).RawJSON("override", b).Msg("identity override set")
	view, _ := x.view(rule, id)
	return view, nil
}

// Delete removes the runtime override of the identity req under rule; the
// config file's exception or the rule's own numbers apply again. It
// returns what applies now (nil: the rule's numbers).
func (x *Identities) Delete(ctx context.Context, rule string, req *limits.Request) (*IdentityView, error) {
	x.mu.Lock()
	ri := x.rules[rule]
	var base *limits.Rule
	if ri != nil {
		base = ri.base
	}
	x.mu.Unlock()
	if base == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownRule, rule)
	}
	id, ok := limits.KeyIdentity(base, req)
	if !ok {
		return nil, limits.ErrNotApplicable
	}
	_, changed, err := x.delete(ctx, rule, id, "")
	if err != nil {
		return nil, &StoreError{err}
	}
	if !changed {
		return nil, fmt.Errorf("%w for %s under rule %q", ErrNoIdentityOverride, id, rule)
	}
	x.log.Info().Str("rule", rule).Str("identity", id).Msg("identity override deleted")
	if v, ok := x.view(rule, id); ok {
		return &v, nil
	}
	return nil, nil
}

// IdentityView is one identity override as the admin API shows it.
type IdentityView struct {
	Rule string `json:"rule"`
	// ID is the identity as the store key spells it ("acme",
	// "203.0.113.7|GET"); for a config range, the range ("10.0.0.0/8").
	ID string `json:"id"`
	// Key is the identity's store key ("" for a range).
	Key string `json:"key,omitempty"`
	// Identity is the identity by dimension, as given.
	Identity map[string]string `json:"identity"`
	// Source is "runtime" (the admin API) or "config" (the rule's exceptions).
	Source string `json:"source"`
	// Action is "limit", "exempt" or "block".
	Action string   `json:"action"`
	Limit  int64    `json:"limit,omitempty"`
	Period Duration `json:"period,omitempty"`
	Burst  int64    `json:"burst,omitempty"`
	Factor float64  `json:"factor,omitempty"`
	// Effective are the numbers the identity is decided by (limit only).
	Effective *Values    `json:"effective,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	SetBy     string     `json:"set_by,omitempty"`
	SetAt     *time.Time `json:"set_at,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Error says why the override does not apply.
	Error string `json:"error,omitempty"`
	// Hides is the config exception a runtime override hides until it ends.
	Hides *IdentityView `json:"hides,omitempty"`
}

// view returns the view of what applies to identity id under rule: a live
// runtime override (with the exception it hides), else the exact config
// exception. x.mu is not held.
func (x *Identities) view(rule, id string) (IdentityView, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ri := x.rules[rule]
	if ri == nil {
		return IdentityView{}, false
	}
	now := x.nowUS()
	var static *IdentityView
	for i := range ri.base.Exceptions {
		if ex := &ri.base.Exceptions[i]; ex.ID == id {
			v := x.exceptionView(ri, i)
			static = &v
		}
	}
	if s := x.stored[rule][id]; s != nil && (s.expiresUS == 0 || now < s.expiresUS) {
		v := x.runtimeView(ri, id, s)
		v.Hides = static
		return v, true
	}
	if static != nil {
		return *static, true
	}
	return IdentityView{}, false
}

// Lookup returns what applies to the identity req under rule: a runtime
// override, an exact exception or the first range exception that holds
// it; false when none does.
func (x *Identities) Lookup(rule string, req *limits.Request) (IdentityView, bool) {
	x.mu.Lock()
	ri := x.rules[rule]
	x.mu.Unlock()
	if ri == nil {
		return IdentityView{}, false
	}
	id, ok := limits.KeyIdentity(ri.base, req)
	if !ok {
		return IdentityView{}, false
	}
	if v, ok := x.view(rule, id); ok {
		return v, true
	}
	for i := range ri.base.Exceptions {
		ex := &ri.base.Exceptions[i]
		if ex.ID == "" && ri.staticErr[i] == "" && exceptionHolds(ri.base, ex, req) {
			x.mu.Lock()
			v := x.exceptionView(ri, i)
			x.mu.Unlock()
			return v, true
		}
	}
	return IdentityView{}, false
}

// exceptionHolds reports whether range exception ex holds req.
func exceptionHolds(r *limits.Rule, ex *limits.Exception, req *limits.Request) bool {
	g := limits.IdentityRange{Prefix: ex.Range, IP: ex.IP, Parts: ex.Parts}
	return g.Holds(r, req)
}

// runtimeView describes a stored override. x.mu is held.
func (x *Identities) runtimeView(ri *ruleIdentities, id string, s *storedIdentity) IdentityView {
	v := IdentityView{Rule: ri.base.Name, ID: id, Key: x.limiter.IdentityKeyOf(ri.base, id), Source: "runtime",
		Action: s.action.String()}
	var o IdentityOverride
	if json.Unmarshal([]byte(s.raw), &o) == nil {
		v.Identity, v.Limit, v.Period, v.Burst, v.Factor = o.Identity, o.Limit, o.Period, o.Burst, o.Factor
		v.Reason, v.SetBy, v.ExpiresAt = o.Reason, o.SetBy, o.ExpiresAt
		at := o.SetAt
		v.SetAt = &at
	}
	if v.Error = ri.problem(s); v.Error == "" && s.action == limits.IdentityLimit {
		if r, err := ri.ruleFor(s.action, s.n); err == nil {
			vals := valuesOf(r)
			v.Effective = &vals
		}
	}
	return v
}

// exceptionView describes the rule's i-th config exception. x.mu is held.
func (x *Identities) exceptionView(ri *ruleIdentities, i int) IdentityView {
	ex := &ri.base.Exceptions[i]
	v := IdentityView{Rule: ri.base.Name, ID: ex.ID, Identity: ex.Match, Source: "config", Action: ex.Action.String(),
		Limit: ex.Limit, Period: Duration(ex.Period), Burst: ex.Burst, Factor: ex.Factor, Reason: ex.Reason,
		Error: ri.staticErr[i]}
	if ex.ID == "" {
		v.ID = ex.Range.String()
	} else {
		v.Key = x.limiter.IdentityKeyOf(ri.base, ex.ID)
	}
	if v.Error == "" && ex.Action == limits.IdentityLimit {
		if r, err := ri.ruleFor(ex.Action, numbers{limit: ex.Limit, burst: ex.Burst, period: ex.Period, factor: ex.Factor}); err == nil {
			vals := valuesOf(r)
			v.Effective = &vals
		}
	}
	return v
}

// IdentityList is GET /v1/rules/{rule}/identities.
type IdentityList struct {
	Rule string `json:"rule"`
	// Shared is true when runtime overrides live in Redis (every instance).
	Shared bool `json:"shared"`
	// Runtime and Config count the rule's runtime overrides and exceptions.
	Runtime int `json:"runtime"`
	Config  int `json:"config"`
	// Max is the cap on runtime overrides stored, all rules together.
	Max        int            `json:"max"`
	Identities []IdentityView `json:"identities"`
	// Next, when set, is the ?after= of the next page.
	Next string `json:"next,omitempty"`
}

// List returns the rule's overrides, runtime and config, ordered by ID,
// at most n (all when n <= 0) after the ID after.
func (x *Identities) List(rule, after string, n int) (IdentityList, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ri := x.rules[rule]
	if ri == nil {
		return IdentityList{}, fmt.Errorf("%w %q", ErrUnknownRule, rule)
	}
	now := x.nowUS()
	l := IdentityList{Rule: rule, Shared: x.store.Shared(), Config: len(ri.base.Exceptions), Max: x.Max()}
	type item struct {
		id     string
		static int // exception index, or -1
	}
	var items []item
	for id, s := range x.stored[rule] {
		if s.expiresUS == 0 || now < s.expiresUS {
			l.Runtime++
			items = append(items, item{id, -1})
		}
	}
	for i := range ri.base.Exceptions {
		items = append(items, item{"", i})
	}
	idOf := func(it item) string {
		if it.static < 0 {
			return it.id
		}
		if ex := &ri.base.Exceptions[it.static]; ex.ID != "" {
			return ex.ID
		}
		return ri.base.Exceptions[it.static].Range.String()
	}
	sort.Slice(items, func(i, j int) bool {
		a, b := idOf(items[i]), idOf(items[j])
		if a != b {
			return a < b
		}
		return items[i].static < items[j].static // runtime first
	})
	l.Identities = []IdentityView{}
	for _, it := range items {
		id := idOf(it)
		if after != "" && id <= after {
			continue
		}
		if n > 0 && len(l.Identities) == n {
			l.Next = l.Identities[len(l.Identities)-1].ID
			break
		}
		if it.static < 0 {
			l.Identities = append(l.Identities, x.runtimeView(ri, id, x.stored[rule][id]))
		} else {
			l.Identities = append(l.Identities, x.exceptionView(ri, it.static))
		}
	}
	return l, nil
}

// IdentityCount is one rule's number of identity overrides.
type IdentityCount struct {
	Rule            string
	Runtime, Config int
}

// Counts returns the number of runtime overrides stored and of config
// exceptions, per rule in force (for the metrics).
func (x *Identities) Counts() []IdentityCount {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]IdentityCount, 0, len(x.rules))
	for name, ri := range x.rules {
		out = append(out, IdentityCount{Rule: name, Runtime: len(x.stored[name]), Config: len(ri.base.Exceptions)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rule < out[j].Rule })
	return out
}

// Blocked reports whether identity id (as the store key spells it) is
// blocked under rule now (for the top-denied listing).
func (x *Identities) Blocked(rule, id string) bool {
	x.mu.Lock()
	ri := x.rules[rule]
	x.mu.Unlock()
	if ri == nil {
		return false
	}
	e, ok := ri.table.Get(id)
	if ok && !(e.ExpiresUS == 0 || x.nowUS() < e.ExpiresUS) {
		if e.Fallback == nil {
			return false
		}
		e = *e.Fallback
	}
	if ok {
		return e.Rule.Identity == limits.IdentityBlock
	}
	for _, g := range ri.table.Ranges() {
		if g.Entry.Rule.Identity == limits.IdentityBlock && g.HoldsID(ri.base, id) {
			return true
		}
	}
	return false
}

// describeMatch writes an identity as "user=acme, ip=10.0.0.0/8".
func describeMatch(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ", ")
}
