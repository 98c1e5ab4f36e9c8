package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/internal/tick"
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
	ipv6     int        // identity.ipv6_prefix (SetIPv6Prefix)
	rules    map[string]*ruleIdentities
	stored   map[string]map[string]*storedIdentity // rule → identity → override
	total    int
	version  uint64
	advanced chan struct{} // closed when version moves
	// last is the change applied as version, when it was applied one by
	// one (its Version 0 after a full read): a change heard again under
	// the same number but another content means the store's counter went
	// back (its data lost, a failover to a replica that missed changes)
	// and numbers repeat, so everything is read again.
	last    limits.IdentityChange
	nextExp int64 // earliest ExpiresAt in µs among stored; 0 none
	// resync asks Run for a full read (Resync): Run's own, so that it
	// never races the changes Run applies one by one (a snapshot read
	// before a change and applied after it would undo it).
	resync chan struct{}
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
	ipv6      int    // IdentityOverride.IPv6Prefix
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
	ipv6   int    // the Identities' ipv6 when built
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
	// IPv6Prefix is identity.ipv6_prefix (limits.DefaultIPv6Prefix when 0).
	IPv6Prefix int
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
		ipv6:     opts.IPv6Prefix,
		rules:    map[string]*ruleIdentities{},
		stored:   map[string]map[string]*storedIdentity{},
		advanced: make(chan struct{}),
		resync:   make(chan struct{}, 1),
	}
	if x.store == nil {
		x.store = NewMemoryIdentities()
	}
	if x.every <= 0 {
		x.every = DefaultSyncEvery
	}
	if x.ipv6 <= 0 {
		x.ipv6 = limits.DefaultIPv6Prefix
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
		Log: opts.Log, SyncEvery: opts.SyncEvery, SyncFailed: failed, IPv6Prefix: opts.Config.Identity.IPv6Prefix})
}

// SetIPv6Prefix sets identity.ipv6_prefix, which the identities of IPv6
// clients are made with. It takes effect with the next Install (a reload
// calls it before the rules are set): an override set under another prefix
// then stops applying, and the list says why.
func (x *Identities) SetIPv6Prefix(bits int) {
	if bits <= 0 {
		bits = limits.DefaultIPv6Prefix
	}
	x.mu.Lock()
	x.ipv6 = bits
	x.mu.Unlock()
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
		fmt.Fprintf(&b, "%s:%s:%d:%d:%d:%g:%q;", limits.JoinPairs(ex.Match, ", "), ex.Action, ex.Limit, ex.Period, ex.Burst, ex.Factor, ex.Reason)
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
		if ri == nil || ri.sig != sig || ri.ipv6 != x.ipv6 {
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
		base: r, sig: sig, ipv6: x.ipv6, key: strings.Join(keyParts(r), ","),
		static: map[string]*limits.IdentityEntry{}, staticErr: map[int]string{},
		derived: map[numbers]*limits.Rule{},
		exempt:  r.Derive(limits.IdentityExempt), block: r.Derive(limits.IdentityBlock),
	}
	var ranges []limits.IdentityRange
	for i := range r.Exceptions {
		ex := &r.Exceptions[i]
		rule, err := ri.ruleInForce(ex.Action, numbers{limit: ex.Limit, burst: ex.Burst, period: ex.Period, factor: ex.Factor})
		if err != nil {
			ri.staticErr[i] = err.Error()
			x.log.Warn().Str("rule", r.Name).Str("exception", limits.JoinPairs(ex.Match, ", ")).Str("error", err.Error()).
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

// ruleInForce is ruleFor for an override or exception already in force.
// Numbers that fitted when they were set may not fit a rule a reload has
// changed since; dropping them would hand the identity the rule's
// numbers, a lower limit failing open. Where they lower the rule (lowers),
// two such changes keep them, on the strict side: a burst on a rule now of
// a window algorithm goes (the limit stays), and a rule cost above the
// identity's burst stays (a request of that cost never fits).
func (ri *ruleIdentities) ruleInForce(action limits.IdentityAction, n numbers) (*limits.Rule, error) {
	r, err := ri.ruleFor(action, n)
	if err == nil || action != limits.IdentityLimit {
		return r, err
	}
	if strict, ok := strictFit(ri.base, n); ok {
		return strict.Derive(limits.IdentityLimit), nil
	}
	return nil, err
}

// strictFit applies n to base without the two bounds a rule's change can
// break (see ruleInForce), when what comes out lowers base: for an
// identity's override and a rule's alike.
func strictFit(base *limits.Rule, n numbers) (*limits.Rule, bool) {
	if !base.Algorithm.UsesBurst() {
		n.burst = 0
	}
	b := *base
	b.Cost = 1
	applied, err := Apply(&b, &Override{Limit: n.limit, Burst: n.burst, Period: Duration(n.period), Factor: n.factor})
	if err != nil {
		return nil, false
	}
	// Judged as it comes out: a factor is rounded, and never below 1
	// (0.2 of 3 a quarter hour is 1 a quarter hour, 4 an hour).
	if !(numbers{limit: applied.Limit, period: applied.Period, burst: applied.Burst}).lowers(base) {
		return nil, false
	}
	applied.Cost = base.Cost
	return applied, true
}

// lowers reports whether n gives r's identity no more than r does: a
// limit no higher, at a rate no higher (a limit of 90 a second lowers
// neither 100 an hour nor its rate), after the factor, and where r has a
// burst, a burst no higher.
func (n numbers) lowers(r *limits.Rule) bool {
	if n.limit == 0 && n.period == 0 && n.factor == 0 {
		return false // a burst alone: not a lower limit
	}
	if r.Algorithm.UsesBurst() && n.burst > r.Burst {
		return false
	}
	limit, period := float64(r.Limit), float64(r.Period)
	if n.limit > 0 {
		limit = float64(n.limit)
	}
	if n.period > 0 {
		period = float64(n.period)
	}
	if n.factor > 0 {
		limit *= n.factor
	}
	return limit <= float64(r.Limit) && limit/period <= float64(r.Limit)/float64(r.Period)
}

// entryOf returns the table entry of stored override s at now; false when
// it does not apply (expired, unreadable, for other key dimensions, or
// out of the rule's bounds).
func (ri *ruleIdentities) entryOf(id string, s *storedIdentity, now int64) (limits.IdentityEntry, bool) {
	if ri.problem(s) != "" || (s.expiresUS != 0 && now >= s.expiresUS) {
		return limits.IdentityEntry{}, false
	}
	rule, err := ri.ruleInForce(s.action, s.n)
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
	case s.ipv6 != 0 && s.ipv6 != ri.ipv6:
		return fmt.Sprintf("set when identity.ipv6_prefix was %d, it is now %d: the identity names no client any more; delete it and set it again", s.ipv6, ri.ipv6)
	}
	if _, err := ri.ruleInForce(s.action, s.n); err != nil {
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
	s.n = o.numbers()
	if s.action == limits.IdentityLimit && s.n == (numbers{}) {
		s.bad = "stored value has no limit, period, burst or factor: delete it and set it again"
	}
	if o.ExpiresAt != nil {
		s.expiresUS = o.ExpiresAt.UnixMicro()
	}
	s.key = strings.Join(o.Key, ",")
	s.ipv6 = o.IPv6Prefix
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
	x.last = limits.IdentityChange{}
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
		tick.Every(ctx, x.every, func() { x.retire(ctx) })
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
		case <-x.resync:
			err = x.full(ctx)
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
		// A new subscription may have missed announcements, and the
		// counter alone cannot tell: a failover to a replica that missed
		// changes repeats their numbers for other changes. Read them all.
		return x.full(ctx)
	}
	x.mu.Lock()
	switch {
	case c.Version == x.version && x.last.Version == c.Version && (x.last.Rule != c.Rule || x.last.ID != c.ID || x.last.Value != c.Value):
		x.mu.Unlock()
		x.log.Warn().Uint64("version", c.Version).Msg(reusedNumber)
		return x.full(ctx)
	case c.Version <= x.version:
		// Already applied: a full read covered it.
	case c.Version == x.version+1:
		x.change(c.Rule, c.ID, c.Value)
		x.setVersion(c.Version)
		x.last = c
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

// reusedNumber is the warning when a change comes with the number of
// another already applied.
const reusedNumber = "an identity override change reuses the number of another: the store's counter went back (data lost, or a failover to a replica that missed changes); reading them all"

// Resync has Run read every stored override again, soon: what the store
// lost (its data, a failover to a replica that missed changes) may have
// gone with changes applied here, and its counter may repeat their
// numbers.
func (x *Identities) Resync() {
	if !x.store.Shared() {
		return
	}
	select {
	case x.resync <- struct{}{}:
	default: // one is pending already
	}
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
	x.mu.Lock()
	if x.version == v && !(x.last.Version == v && x.last.Rule == rule && x.last.ID == id && x.last.Value == value) {
		// The number this instance applied last, for something else:
		// the store's counter went back; Run reads everything.
		x.mu.Unlock()
		x.log.Warn().Uint64("version", v).Msg(reusedNumber)
		x.Resync()
		return
	}
	x.mu.Unlock()
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
	o.IPv6Prefix = ipv6PrefixOf(base, req)
	_, ferr := ri.ruleFor(o.action(), o.numbers())
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

// ipv6PrefixOf returns the identity.ipv6_prefix req's identity under rule r
// was made with: req.IP's network length when that identity holds an IPv6
// client's address, 0 when it holds none (an IPv4 client, or a rule whose
// identity does not take the address).
func ipv6PrefixOf(r *limits.Rule, req *limits.Request) int {
	if !req.Addr.IsValid() || !req.Addr.Unmap().Is6() {
		return 0
	}
	with, _ := limits.AppendIdentity(nil, r, req)
	without := *req
	without.IP = nil
	other, _ := limits.AppendIdentity(nil, r, &without)
	if bytes.Equal(with, other) {
		return 0
	}
	if i := bytes.LastIndexByte(req.IP, '/'); i >= 0 {
		if n, err := strconv.Atoi(string(req.IP[i+1:])); err == nil {
			return n
		}
	}
	return 128
}
