package limits

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"
)

// Verdict is one matching rule's outcome within a Decision.
type Verdict struct {
	Rule *Rule
	// Key is the store key this rule used for the request, e.g.
	// "rg:{login-per-ip:203.0.113.7}:gc2". The string is not reused, so an
	// observer may keep it (the admin API's top-denied sketch does).
	Key    string
	Cost   int64
	Result Result
}

// Fallback says why the local fallback store decided a request instead of
// the shared store.
type Fallback uint8

// The reasons for a local decision.
const (
	// FallbackNone: the shared store (or the deny cache) decided.
	FallbackNone Fallback = iota
	// FallbackStoreDown: the shared store is down (its breaker is open) and
	// failure_mode is local.
	FallbackStoreDown
	// FallbackCallFailed: the store is up but this decision failed or was
	// too slow. Whatever failure_mode says, such a request is decided
	// locally: a caller must not be able to turn a slow decision into an
	// admission.
	FallbackCallFailed
)

// String returns the reason as a metric label: none, store_down, call_failed.
func (f Fallback) String() string {
	switch f {
	case FallbackStoreDown:
		return "store_down"
	case FallbackCallFailed:
		return "call_failed"
	}
	return "none"
}

// Decision is the outcome of one request. The handler owns it and may reuse
// it across requests (Decide resets it).
type Decision struct {
	// Admitted is the answer: false when some non-shadow rule denied the
	// request, or when nothing could decide it and the failure mode is deny.
	Admitted bool
	// Verdicts has one entry per matching rule, in rule order, shadow rules
	// included. When Undecided their results are unset.
	Verdicts []Verdict
	// Denier is the index in Verdicts of the rule that denied, or -1. When
	// several rules deny, it is the one whose quota returns last.
	Denier int
	// Local is true when the local fallback store decided instead of the
	// shared one; Fallback says why.
	Local    bool
	Fallback Fallback
	// Undecided is true when no store decided: the shared store is down
	// (or failed without a fallback) and Mode answered (allow or deny).
	Undecided bool
	// Mode is the failure mode in force when the shared store could not
	// decide (Local or Undecided); meaningless otherwise.
	Mode FailureMode
	// Err is the shared store's error when it did not decide (Local or
	// Undecided), for logs.
	Err error
	// Cached is true when the deny cache answered without asking the store:
	// the store had denied this identity under a rule until a time not yet
	// reached, for a cost no larger than this request's. The request is
	// denied, and Verdicts holds every matching rule: the denying one as
	// the store last reported it and aged to now (Denier), the others as
	// the deny cache last saw them or, if it never did, with their full
	// quota (they were not asked and consumed nothing):
	//
	//	RetryUS   the time left until the cached denial ends (NeverFits when
	//	          this cost can never fit the rule: above its burst, or its
	//	          limit for the window algorithms)
	//	ResetUS   the store's reset, minus the time since, never negative
	//	Remaining the store's remaining quota at that denial
	Cached bool
	// Exempt lists the matching rules that an identity override exempts
	// this request's identity from (derived rules, Rule.Identity =
	// IdentityExempt): they were not asked and are not in Verdicts.
	Exempt []*Rule

	keyBuf []byte
	ident  []byte
	// headers reads each header the rules read once per decision.
	headers trimmedHeaders
	batch   Batch
	res     []Result
	lease   leaseScratch
}

// trimmedHeaders is a request's headers as the rules read them: each
// value trimmed (TrimValue), read and trimmed once however many rules
// read it. A decision's rules read a handful of names.
type trimmedHeaders struct {
	h     Headers
	names []string
	vals  [][]byte
}

// reset starts over for the headers h (nil: none, and nothing kept).
func (t *trimmedHeaders) reset(h Headers) {
	t.h = h
	clear(t.vals)
	t.names, t.vals = t.names[:0], t.vals[:0]
}

// Peek returns the value of header name, trimmed.
func (t *trimmedHeaders) Peek(name string) []byte {
	for i, n := range t.names {
		if n == name {
			return t.vals[i]
		}
	}
	v := TrimValue(t.h.Peek(name))
	t.names = append(t.names, name)
	t.vals = append(t.vals, v)
	return v
}

// ShedBuffers drops the key and identity buffers of d that grew past max
// bytes (a request with huge identity values), so that a Decision kept for
// reuse does not hold that memory; the next request grows them again.
func (d *Decision) ShedBuffers(max int) {
	if cap(d.keyBuf) > max {
		d.keyBuf = nil
	}
	if cap(d.ident) > max {
		d.ident = nil
	}
}

// StoreOp names a store call for a StoreObserver.
type StoreOp uint8

// The store calls a limiter makes.
const (
	OpDecide StoreOp = iota
	OpPeek
	OpReset
	OpPing
	OpRaw
	// OpLease: a lease take or return (lease.go).
	OpLease
	NumStoreOps
)

// String returns the op as a metric label.
func (o StoreOp) String() string {
	switch o {
	case OpDecide:
		return "decide"
	case OpPeek:
		return "peek"
	case OpReset:
		return "reset"
	case OpPing:
		return "ping"
	case OpRaw:
		return "raw"
	case OpLease:
		return "lease"
	}
	return "unknown"
}

// StoreObserver is told about every call the limiter makes to the shared
// store, after it returns. It is called on the hot path: it must be safe
// for concurrent use, quick, and should not allocate.
type StoreObserver interface {
	StoreCall(op StoreOp, elapsed time.Duration, err error)
}

// Options configures a Limiter. Only Store is required; every other part is
// optional and handed in by whoever wires rategate, so the limiter never
// has to discover what its store can do.
type Options struct {
	// Store decides batches (Redis or memory).
	Store Store
	// Prefix starts every key ("rg").
	Prefix string
	// Rules are the initial rules (SetRules swaps them later).
	Rules []*Rule
	// Breaker, when set, is asked before every store call: while it is
	// open the store is not called and counts as down.
	Breaker *Breaker
	// Fallback decides when the store cannot: while it is down and the
	// failure mode is local, and, whatever the failure mode, for a single
	// decision that failed while the store is up. Every limit and burst is
	// divided by LocalShare (the number of instances) there.
	Fallback   Store
	LocalShare int
	// FailureMode answers requests nothing could decide (SetFailureMode
	// changes it).
	FailureMode FailureMode
	// DenyCache, when set, answers repeated denials locally (see
	// denycache.go). Only hand it a store whose denials are final when
	// given: not one that refunds cross-slot commits (Redis Cluster).
	DenyCache *DenyCache
	// Inspector, when set, shows a key's raw stored value (Inspect).
	Inspector Inspector
	// Observer, when set, is told about every store call.
	Observer StoreObserver
	// Leaser, when set, leases slices of the quota of rules with lease:
	// true (lease.go); without one such rules are decided by the store
	// like the others. Lease tunes the leases.
	Leaser Leaser
	Lease  LeaseOptions
}

// Limiter matches requests against the current rules and asks the store.
// It is safe for concurrent use; SetRules swaps the rule set atomically, so a
// request sees either the old rules or the new ones, never a mix.
type Limiter struct {
	store  Store
	prefix string
	// set is the rules in force with the request headers they read
	// (RuleHeaders), swapped as one.
	set     atomic.Pointer[ruleSet]
	breaker *Breaker

	fallback Store
	share    atomic.Int64
	mode     atomic.Uint32 // FailureMode

	deny      *DenyCache
	inspector Inspector
	obs       StoreObserver

	// keys interns store keys (intern.go).
	keys *keyIntern
	// leases holds this instance's slices of leased rules (nil: no Leaser).
	leases *leaseTable
}

// New returns a limiter as opts describe.
func New(opts Options) *Limiter {
	l := &Limiter{
		store:     opts.Store,
		prefix:    opts.Prefix,
		breaker:   opts.Breaker,
		fallback:  opts.Fallback,
		deny:      opts.DenyCache,
		inspector: opts.Inspector,
		obs:       opts.Observer,
		keys:      newKeyIntern(),
	}
	if opts.Leaser != nil {
		l.leases = newLeaseTable(opts.Leaser, opts.Lease)
	}
	l.mode.Store(uint32(opts.FailureMode))
	l.SetLocalShare(opts.LocalShare)
	l.SetRules(opts.Rules)
	return l
}

// NewLimiter returns a limiter over store with the given key prefix and
// rules and nothing else: no breaker, fallback or deny cache.
func NewLimiter(store Store, prefix string, rules []*Rule) *Limiter {
	return New(Options{Store: store, Prefix: prefix, Rules: rules})
}

// ruleSet is a rule set and the request headers its rules read.
type ruleSet struct {
	rules   []*Rule
	headers []string
	aux     any // SetRulesWith
}

// RuleSet is the rule set in force at one moment. A caller that checks a
// request against the headers its rules read (Headers) before it calls
// Decide passes it on in Request.RuleSet, so that the request is decided
// by the rules it was checked for: read apart, a reload between the two
// reads would decide it by rules whose headers were never checked. The
// zero RuleSet means the rules in force when Decide runs.
type RuleSet struct {
	set *ruleSet
	gen uint64 // the deny cache's generation, read before set (see decide)
}

// Headers returns the canonical names of the request headers the set's
// rules read (RuleHeaders). Callers must not modify it.
func (rs RuleSet) Headers() []string {
	if rs.set == nil {
		return nil
	}
	return rs.set.headers
}

// Valid reports whether rs is a rule set (not the zero RuleSet).
func (rs RuleSet) Valid() bool { return rs.set != nil }

// Aux returns what SetRulesWith installed with the set's rules (nil for
// none): what must change in the same swap as the rules.
func (rs RuleSet) Aux() any {
	if rs.set == nil {
		return nil
	}
	return rs.set.aux
}

// RuleSet returns the rule set in force.
func (l *Limiter) RuleSet() RuleSet {
	var gen uint64
	if l.deny != nil {
		// Read before the rules: SetRules stores the rules, then Clear
		// bumps the generation, so a decision that saw the old rules
		// carries an old generation and cannot cache what they decided.
		gen = l.deny.gen.Load()
	}
	return RuleSet{set: l.set.Load(), gen: gen}
}

// SetRules replaces the rule set. The slice must not be modified afterwards.
// Cached denials were computed under the old rules, so they are dropped.
func (l *Limiter) SetRules(rules []*Rule) {
	var aux any
	if cur := l.set.Load(); cur != nil {
		aux = cur.aux
	}
	l.SetRulesWith(rules, aux)
}

// SetRulesWith is SetRules installing aux (RuleSet.Aux) in the same swap:
// a caller whose own settings go with the rules (the decision handler's)
// reads both from one RuleSet. SetRules keeps the aux in force. Callers
// serialize SetRules and SetRulesWith.
func (l *Limiter) SetRulesWith(rules []*Rule, aux any) {
	if rules == nil {
		rules = []*Rule{}
	}
	l.set.Store(&ruleSet{rules: rules, headers: ruleHeaders(rules), aux: aux})
	if l.deny != nil {
		l.deny.Clear() // after the store: see decide
	}
	if l.leases != nil {
		// Slices taken under numbers no longer in force go back.
		l.leases.rulesChanged(rules)
	}
}

// RuleHeaders returns the canonical names of the request headers the rules
// in force read, in a header key dimension or a header match. Each is one
// value to a rule: the handler refuses a request that sends one of them
// twice, since the application behind NGINX, which gets every copy, may
// take another than the one the rule counted. Callers must not modify it.
func (l *Limiter) RuleHeaders() []string { return l.set.Load().headers }

// ruleHeaders lists the headers rules read, each once.
func ruleHeaders(rules []*Rule) []string {
	var names []string
	add := func(name string) {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	for _, r := range rules {
		for _, p := range r.Key {
			if p.Kind == KeyHeader {
				add(p.Header)
			}
		}
		for _, h := range r.Match.Headers {
			add(h.Name)
		}
	}
	return names
}

// SetFailureMode changes what undecidable requests get (a reload).
func (l *Limiter) SetFailureMode(m FailureMode) { l.mode.Store(uint32(m)) }

// SetLocalShare changes what the local fallback divides limits by (the
// number of instances; at least 1).
func (l *Limiter) SetLocalShare(n int) { l.share.Store(int64(max(n, 1))) }

// FailureMode returns the failure mode in force.
func (l *Limiter) FailureMode() FailureMode { return FailureMode(l.mode.Load()) }

// Rules returns the current rule set. Callers must not modify it.
func (l *Limiter) Rules() []*Rule { return l.set.Load().rules }

// Rule returns the rule in force called name, or nil.
func (l *Limiter) Rule(name string) *Rule {
	for _, r := range l.Rules() {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// Prefix returns the key prefix.
func (l *Limiter) Prefix() string { return l.prefix }

// DenyCache returns the limiter's deny cache, or nil when it has none.
func (l *Limiter) DenyCache() *DenyCache { return l.deny }

// Breaker returns the limiter's breaker, or nil when it has none.
func (l *Limiter) Breaker() *Breaker { return l.breaker }

// StoreName describes the shared store ("redis 127.0.0.1:6379", "memory").
func (l *Limiter) StoreName() string { return l.store.Name() }

// Decide evaluates every rule that matches req in one store call and fills
// d with the answer, however it was reached: by the store, the deny cache,
// the local fallback, or the failure mode (d says which). The error is the
// shared store's when it did not decide, for the caller to log; d is
// complete either way. A request no rule matches is admitted without
// asking the store.
func (l *Limiter) Decide(ctx context.Context, req *Request, d *Decision) error {
	return l.decide(ctx, req, d, 0)
}

// DecideAt is Decide with the store's clock replaced by nowUS. Tests only.
func (l *Limiter) DecideAt(ctx context.Context, req *Request, d *Decision, nowUS int64) error {
	return l.decide(ctx, req, d, nowUS)
}

func (l *Limiter) decide(ctx context.Context, req *Request, d *Decision, nowUS int64) error {
	dc := l.deny
	rs := req.RuleSet
	if rs.set == nil {
		rs = l.RuleSet()
	}
	gen, rules := rs.gen, rs.set.rules
	d.Admitted = true
	d.Denier = -1
	d.Local, d.Fallback, d.Undecided, d.Err = false, FallbackNone, false, nil
	d.Cached = false
	d.Verdicts = d.Verdicts[:0]
	d.Exempt = d.Exempt[:0]
	d.batch.Checks = d.batch.Checks[:0]
	d.batch.NowUS = nowUS
	d.lease.idx = d.lease.idx[:0]
	// The client chooses the values the rules read, up to NGINX's 8 KiB
	// header buffers, white space that TrimValue trims included: each is
	// trimmed once here (and each header read once), not once per rule
	// that matches or is keyed on it (a value padded with 7,000 bytes of
	// 0x85 cost 20 trims under 20 rules matching it: 217x an ordinary
	// request). The trimmed values trim to themselves.
	one := *req
	one.User = TrimValue(req.User)
	if req.Headers != nil {
		d.headers.reset(req.Headers)
		one.Headers = &d.headers
		defer d.headers.reset(nil)
	}
	req = &one
	var clock int64
	probe, clocked := false, false
	if dc != nil {
		// The clock is read before the store call: the store decides
		// after it, so clock + RetryUS is never later than the store's
		// retry time. With entries to look up it is read now; otherwise
		// only a denial to cache needs it, and it is read just before the
		// store call, with the clock read that times the call.
		probe = dc.entries.Load() > 0
		if probe {
			clock, clocked = dc.clock(nowUS), true
		}
	}
	cached, blocked := -1, -1
	mute := false // a rule's cached denial cannot answer: the store decides
	var hit denyEntry
	wall := nowUS // identity overrides end on the wall clock (read on first need)
	for _, r := range rules {
		if !r.Matches(req) {
			continue
		}
		var ok bool
		d.ident, ok = AppendIdentity(d.ident[:0], r, req)
		if !ok {
			continue
		}
		d.keyBuf = AppendKey(d.keyBuf[:0], l.prefix, r, d.ident)
		cost := r.Cost
		if req.Cost > 0 {
			cost = req.Cost
		}
		if t := r.identities; t != nil && t.active() {
			// The identity's own rule: same name, algorithm and key (identities.go).
			if e, ok := t.resolve(keyIdentity(d.keyBuf, l.prefix, r), d.ident, req.Addr, &wall); ok {
				switch e.Rule.Identity {
				case IdentityExempt:
					d.Exempt = append(d.Exempt, e.Rule)
					continue
				case IdentityBlock:
					if wall == 0 {
						wall = time.Now().UnixMicro()
					}
					if blocked < 0 && !e.Rule.Shadow {
						blocked = len(d.Verdicts)
					}
					d.Verdicts = append(d.Verdicts, blockVerdict(e, l.keys.get(d.keyBuf), cost, wall))
					continue
				}
				r = e.Rule
			}
		}
		leased := r.Lease && l.leases != nil
		if probe && !r.Shadow && !leased {
			// Every rule's cached denial is looked up: the answer names the
			// one whose quota returns last, as the store's does (a client
			// that waits for its Retry-After is not refused by another).
			// Its check is still added, for the store to decide the
			// request when some rule's denial cannot answer it.
			e, ok, m := dc.lookup(d.keyBuf, r, cost, clock)
			mute = mute || m
			if ok {
				v := e.verdict(r, cost, clock)
				if cached < 0 || retryLater(v.Result.RetryUS, d.Verdicts[cached].Result.RetryUS) {
					cached, hit = len(d.Verdicts), e
				}
				d.Verdicts = append(d.Verdicts, v)
				d.batch.Checks = append(d.batch.Checks, r.Check(e.key, cost))
				continue
			}
		}
		key := l.keys.get(d.keyBuf)
		d.Verdicts = append(d.Verdicts, Verdict{Rule: r, Key: key, Cost: cost})
		d.batch.Checks = append(d.batch.Checks, r.Check(key, cost))
		if leased {
			d.lease.idx = append(d.lease.idx, len(d.batch.Checks)-1)
		}
	}
	if blocked >= 0 {
		// Decided here: nothing is asked of the store, nothing consumed.
		blockedDenial(d, blocked)
		return nil
	}
	if cached >= 0 && !mute {
		cachedDenial(d, cached, &hit, clock)
		return nil
	}
	if cached >= 0 {
		// the store decides: the cached verdicts' results go
		for i := range d.Verdicts {
			if d.Verdicts[i].Rule.Identity != IdentityBlock {
				d.Verdicts[i].Result = Result{}
			}
		}
	}
	if len(d.batch.Checks) == 0 {
		return nil
	}
	if cap(d.res) < len(d.batch.Checks) {
		d.res = make([]Result, len(d.batch.Checks))
	}
	d.res = d.res[:len(d.batch.Checks)]

	var admitted bool
	var err error
	var start time.Time // the store call's start, when something needs it
	if dc != nil && !clocked {
		start = time.Now()
		clock = dc.clockAt(nowUS, start)
	} else if l.obs != nil {
		start = time.Now()
	}
	if len(d.lease.idx) > 0 {
		var decided bool
		if admitted, decided, err = l.decideLeased(ctx, d, nowUS); !decided {
			return err
		}
	} else if admitted, err = l.decideShared(ctx, &d.batch, d.res, start); err != nil {
		var decided bool
		if admitted, decided, err = l.decideLocal(ctx, d, &d.batch, d.res, err); !decided {
			return err
		}
	}
	d.Admitted = admitted
	j := 0
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		if v.Rule.Identity == IdentityBlock {
			continue // a shadow rule's block: decided above, not asked
		}
		v.Result = d.res[j]
		j++
		if !admitted && !v.Result.Allowed && !v.Rule.Shadow {
			if d.Denier < 0 || retryLater(v.Result.RetryUS, d.Verdicts[d.Denier].Result.RetryUS) {
				d.Denier = i
			}
		}
	}
	if dc != nil && !d.Local {
		// Only the shared store's word is cached, never the fallback's.
		if !d.Admitted {
			dc.putDecision(gen, d, clock, dc.clock(nowUS), nowUS != 0)
		}
	}
	return err
}

// decideLocal decides b (into res) when the shared store failed with err:
// by the local fallback, or not at all (decided false: the failure mode
// answers, d says how). The error returned is the shared store's.
func (l *Limiter) decideLocal(ctx context.Context, d *Decision, b *Batch, res []Result, err error) (admitted, decided bool, _ error) {
	mode := l.FailureMode()
	d.Err, d.Mode = err, mode
	reason := FallbackStoreDown
	if !l.down(err) {
		reason = FallbackCallFailed
	}
	if l.fallback == nil || (reason == FallbackStoreDown && mode != FailLocal) {
		d.Undecided = true
		d.Admitted = mode != FailDeny
		return false, false, err
	}
	share := l.share.Load()
	for i := range b.Checks {
		// Each instance's share, but at least one request: a cost the rule
		// admits (cost 3 of a limit 10, share 4) fits the share too, or the
		// local store would answer "can never fit" (no Retry-After) to
		// every such request for as long as the store fails.
		c := &b.Checks[i]
		c.Limit = max(c.Limit/share, min(c.Cost, c.Limit), 1)
		c.Burst = max(c.Burst/share, min(c.Cost, c.Burst), 1)
	}
	// The local store never fails; its error would be a bug: then the
	// failure mode answers.
	admitted, lerr := l.fallback.Decide(ctx, b, res)
	if lerr != nil {
		d.Undecided = true
		d.Admitted = mode != FailDeny
		return false, false, errors.Join(err, lerr)
	}
	d.Local, d.Fallback = true, reason
	return admitted, true, err
}

// decideShared asks the shared store to decide b, through the breaker, and
// tells the observer how long the call took from start (the zero Time:
// from now).
func (l *Limiter) decideShared(ctx context.Context, b *Batch, res []Result, start time.Time) (bool, error) {
	var t Ticket
	if l.breaker != nil {
		var err error
		if t, err = l.breaker.Allow(); err != nil {
			return false, err
		}
	}
	if l.obs != nil && start.IsZero() {
		start = time.Now()
	}
	admitted, err := l.store.Decide(ctx, b, res)
	if l.obs != nil {
		l.obs.StoreCall(OpDecide, time.Since(start), err)
	}
	if l.breaker != nil {
		l.breaker.Done(t, err)
	}
	return admitted, err
}

// down reports whether err means the shared store is down as a whole (its
// breaker refused the call or is open now), rather than that one call
// failed while it is up.
func (l *Limiter) down(err error) bool {
	if errors.Is(err, ErrBreakerOpen) {
		return true
	}
	return l.breaker != nil && l.breaker.Open()
}

// cachedDenial completes d for a request the deny cache denied through
// Verdicts[i] (entry e, the cached denial whose retry is latest): the
// other matching rules were not asked (a denied request consumes nothing
// anywhere); those with a cached denial of their own report it, the rest
// what e saw of them when the store denied.
func cachedDenial(d *Decision, i int, e *denyEntry, clock int64) {
	d.Admitted = false
	d.Cached = true
	d.Denier = i
	for j := range d.Verdicts {
		// A verdict left for the store has a zero Result; a cached
		// denial's retry is never 0 (putDecision caches none such).
		v := &d.Verdicts[j]
		if j != i && v.Rule.Identity != IdentityBlock && v.Result.RetryUS == 0 {
			v.Result = e.lastSeen(v.Rule, clock)
		}
	}
}

// blockedDenial completes d for a request an identity block denied through
// Verdicts[i]: the other matching rules were not asked and report their
// full quota.
func blockedDenial(d *Decision, i int) {
	d.Admitted = false
	d.Denier = i
	for j := range d.Verdicts {
		if d.Verdicts[j].Rule.Identity != IdentityBlock {
			d.Verdicts[j].Result = notAsked(d.Verdicts[j].Rule)
		}
	}
}

// retryLater reports whether retry a is later than b, NeverFits being latest.
func retryLater(a, b int64) bool {
	if b == NeverFits {
		return false
	}
	return a == NeverFits || a > b
}

// Check builds the store check of rule r for key with the given cost.
func (r *Rule) Check(key string, cost int64) Check {
	return Check{
		Key:       key,
		Algorithm: r.Algorithm,
		Limit:     r.Limit,
		PeriodUS:  PeriodUS(r.Period),
		Burst:     r.Burst,
		Cost:      cost,
		Shadow:    r.Shadow,
	}
}

// KeyFor returns the store key of rule r for req, and false when the rule
// does not apply to req's identity (anonymous: skip).
func (l *Limiter) KeyFor(r *Rule, req *Request) (string, bool) {
	ident, ok := AppendIdentity(nil, r, req)
	if !ok {
		return "", false
	}
	return string(AppendKey(nil, l.prefix, r, ident)), true
}

// KeyState is one identity's state under one rule, as Inspect reports it.
type KeyState struct {
	Key string
	// Result is a zero-cost look at the key: Remaining, ResetUS.
	Result Result
	// Raw is the stored value, nil when the store cannot show it (RawErr
	// says why).
	Raw    *RawValue
	RawErr error
	// Lease is the key's lease, for a leased rule (lease.go).
	Lease *LeaseState
}

// ErrNotApplicable is Inspect's and ResetKey's answer when the rule does
// not apply to the identity (a user key, anonymous: skip, no user).
var ErrNotApplicable = errors.New("the rule does not apply to this identity (anonymous: skip)")

// Inspect reports the state of req's key under rule r without consuming.
func (l *Limiter) Inspect(ctx context.Context, r *Rule, req *Request) (KeyState, error) {
	key, ok := l.KeyFor(r, req)
	if !ok {
		return KeyState{}, ErrNotApplicable
	}
	st := KeyState{Key: key}
	res, err := l.call(OpPeek, func() (err error) {
		st.Result, err = l.store.Peek(ctx, r.Check(key, 0))
		return err
	})
	if res != nil {
		return st, res
	}
	if err != nil {
		return st, err
	}
	if r.Lease && l.leases != nil {
		st.Lease = l.leaseState(ctx, r, key)
	}
	if l.inspector == nil {
		st.RawErr = errors.New("the store cannot show raw values")
		return st, nil
	}
	if _, err := l.call(OpRaw, func() error {
		raw, err := l.inspector.Raw(ctx, key)
		if err == nil {
			st.Raw = &raw
		}
		return err
	}); err != nil {
		st.RawErr = err
	}
	return st, nil
}

// ResetKey deletes req's key under rule r, everywhere: in the store, and in
// the deny cache of this and (through its announcer) every other instance.
// It returns the key. The deny cache forgets the key even when the store
// failed (the reset may have run anyway); the announcement's failure is
// returned as announceErr, for a log line.
func (l *Limiter) ResetKey(ctx context.Context, r *Rule, req *Request) (key string, announceErr, err error) {
	key, ok := l.KeyFor(r, req)
	if !ok {
		return "", nil, ErrNotApplicable
	}
	if r.Lease && l.leases != nil {
		// The live slices stay counted (their holders spend them), so the
		// reset cannot hand out what they hold a second time; this
		// instance then gives back what it held.
		_, err = l.call(OpReset, func() error { return l.leases.store.ResetLease(ctx, r.Check(key, 0), 0) })
		l.forgetLease(key)
	} else {
		_, err = l.call(OpReset, func() error { return l.store.Reset(ctx, r.Check(key, 0)) })
	}
	if l.deny != nil {
		announceErr = l.deny.KeyReset(ctx, key)
	}
	return key, announceErr, err
}

// Ping reports whether the shared store answers: at once with the reason
// while the breaker is open, else by asking it.
func (l *Limiter) Ping(ctx context.Context) error {
	if l.breaker != nil {
		if err := l.breaker.OpenError(); err != nil {
			return err
		}
	}
	var start time.Time
	if l.obs != nil {
		start = time.Now()
	}
	err := l.store.Ping(ctx)
	if l.obs != nil {
		l.obs.StoreCall(OpPing, time.Since(start), err)
	}
	return err
}

// call runs one admin store call through the breaker and the observer.
// refused is the breaker's refusal (the call did not run); err is the
// call's own error.
func (l *Limiter) call(op StoreOp, f func() error) (refused, err error) {
	var t Ticket
	if l.breaker != nil {
		if t, refused = l.breaker.Allow(); refused != nil {
			return refused, nil
		}
	}
	start := time.Now()
	err = f()
	if l.obs != nil {
		l.obs.StoreCall(op, time.Since(start), err)
	}
	if l.breaker != nil {
		l.breaker.Done(t, err)
	}
	return nil, err
}
