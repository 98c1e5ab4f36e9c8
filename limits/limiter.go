package limits

import (
	"context"

	"sync/atomic"
)

// Verdict is one matching rule's outcome within a Decision.
type Verdict struct {
	Rule *Rule
	// Key is the store key this rule used for the request, e.g.
	// "rg:{login-per-ip:203.0.113.7}:gc". The string is not reused, so an
	// observer may keep it (the admin API's top-denied sketch does).
	Key    string
	Cost   int64
	Result Result
}

// Decision is the outcome of one request. The handler owns it and may reuse
// it across requests (Decide resets it).
type Decision struct {
	// Admitted is false when some non-shadow rule denied the request.
	Admitted bool
	// Verdicts has one entry per matching rule, in rule order, shadow rules included.
	Verdicts []Verdict
	// Denier is the index in Verdicts of the rule that denied, or -1. When
	// several rules deny, it is the one whose quota returns last.
	Denier int
	// Local is true when the shared store failed and the local fallback
	// store decided instead (failure_mode: local).
	Local bool
	// Cached is true when the deny cache answered without asking the store:
	// the store had denied this identity under a rule until a time not yet
	// reached, for a cost no larger than this request's. The request is
	// denied, and Verdicts holds only that rule's verdict (Denier 0), as the
	// store last reported it and aged to now:
	//
	//	RetryUS   the time left until the cached denial ends (NeverFits when
	//	          this cost can never fit the rule: above its burst, or its
	//	          limit for the window algorithms)
	//	ResetUS   the store's reset, minus the time since, never negative
	//	Remaining the store's remaining quota at that denial
	//
	// The other matching rules were not evaluated and consumed nothing, as
	// for any denied request. The rule is the first in rule order with a
	// cached denial, not necessarily the one whose quota returns last.
	Cached bool

	keyBuf []byte
	ident  []byte
	batch  Batch
	res    []Result
}

// Limiter matches requests against the current rules and asks the store.
// It is safe for concurrent use; SetRules swaps the rule set atomically, so a
// request sees either the old rules or the new ones, never a mix.
type Limiter struct {
	store  Store
	prefix string
	rules  atomic.Pointer[[]*Rule]

	// fallback, when set, decides while store fails, with every limit and
	// burst divided by share (failure_mode: local).
	fallback Store
	share    int64

	// deny, when set, answers repeated denials locally (SetDenyCache).
	deny *DenyCache

	// keys interns store keys (intern.go).
	keys *keyIntern
}

// SetFallback makes the limiter decide with local (normally a MemoryStore)
// whenever the shared store returns an error, dividing every limit and burst
// by share (the number of rategate instances) so the fleet stays near the
// intended global limit. Call it before the limiter is used.
func (l *Limiter) SetFallback(local Store, share int) {
	l.fallback = local
	l.share = int64(max(share, 1))
}

// SetDenyCache makes the limiter answer requests of an identity the store
// denied from c until the store's retry time, without asking the store
// (see denycache.go for why that is exact). nil turns it off. Call it before
// the limiter is used. It refuses a Redis Cluster store, where the answer
// would not be exact (ErrDenyCacheCluster), and then leaves the cache off.
func (l *Limiter) SetDenyCache(c *DenyCache) error {
	if c != nil && usesRefunds(l.store) {
		l.deny = nil
		return ErrDenyCacheCluster
	}
	l.deny = c
	return nil
}

// DenyCache returns the limiter's deny cache, or nil when it has none.
func (l *Limiter) DenyCache() *DenyCache { return l.deny }

// NewLimiter returns a limiter over store with the given key prefix and rules.
func NewLimiter(store Store, prefix string, rules []*Rule) *Limiter {
	l := &Limiter{store: store, prefix: prefix, keys: newKeyIntern()}
	l.SetRules(rules)
	return l
}

// SetRules replaces the rule set. The slice must not be modified afterwards.
// Cached denials were computed under the old rules, so they are dropped.
func (l *Limiter) SetRules(rules []*Rule) {
	l.rules.Store(&rules)
	if l.deny != nil {
		l.deny.Clear() // after the store: see decide
	}
}

// Rules returns the current rule set. Callers must not modify it.
func (l *Limiter) Rules() []*Rule { return *l.rules.Load() }

// Store returns the store the limiter decides with.
func (l *Limiter) Store() Store { return l.store }

// Prefix returns the key prefix.
func (l *Limiter) Prefix() string { return l.prefix }

// Decide evaluates every rule that matches req in one store call and fills d.
// A request no rule matches is admitted without asking the store.
func (l *Limiter) Decide(ctx context.Context, req *Request, d *Decision) error {
	return l.decide(ctx, req, d, 0)
}

// DecideAt is Decide with the store's clock replaced by nowUS. Tests only.
func (l *Limiter) DecideAt(ctx context.Context, req *Request, d *Decision, nowUS int64) error {
	return l.decide(ctx, req, d, nowUS)
}

func (l *Limiter) decide(ctx context.Context, req *Request, d *Decision, nowUS int64) error {
	dc := l.deny
	var gen uint64
	if dc != nil {
		// Read before the rules: SetRules stores the rules, then Clear bumps
		// the generation, so a decision that saw the old rules carries an
		// old generation and cannot cache what they decided.
		gen = dc.gen.Load()
	}
	rules := *l.rules.Load()
	d.Admitted = true
	d.Denier = -1
	d.Local = false
	d.Cached = false
	d.Verdicts = d.Verdicts[:0]
	d.batch.Checks = d.batch.Checks[:0]
	d.batch.NowUS = nowUS
	var clock int64
	probe := false
	if dc != nil {
		// Read before the store call: the store decides after this, so
		// clock + RetryUS is never later than the store's retry time.
		clock = dc.clock(nowUS)
		probe = dc.entries.Load() > 0
	}
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
		if probe && !r.Shadow {
			if e, ok := dc.lookup(d.keyBuf, r, cost, clock); ok {
				d.Verdicts = append(d.Verdicts[:0], e.verdict(r, cost, clock))
				d.Admitted = false
				d.Denier = 0
				d.Cached = true
				return nil
			}
		}
		key := l.keys.get(d.keyBuf)
		d.Verdicts = append(d.Verdicts, Verdict{Rule: r, Key: key, Cost: cost})
		d.batch.Checks = append(d.batch.Checks, r.Check(key, cost))
	}
	if len(d.batch.Checks) == 0 {
		return nil
	}
	if cap(d.res) < len(d.batch.Checks) {
		d.res = make([]Result, len(d.batch.Checks))
	}
	d.res = d.res[:len(d.batch.Checks)]
	admitted, err := l.store.Decide(ctx, &d.batch, d.res)
	if err != nil {
		if l.fallback == nil {
			return err
		}
		for i := range d.batch.Checks {
			c := &d.batch.Checks[i]
			c.Limit = max(c.Limit/l.share, 1)
			c.Burst = max(c.Burst/l.share, 1)
		}
		// The local store never fails; its error would be a bug worth returning.
		if admitted, err = l.fallback.Decide(ctx, &d.batch, d.res); err != nil {
			return err
		}
		d.Local = true
	}
	d.Admitted = admitted
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		v.Result = d.res[i]
		if !admitted && !v.Result.Allowed && !v.Rule.Shadow {
			if d.Denier < 0 || retryLater(v.Result.RetryUS, d.Verdicts[d.Denier].Result.RetryUS) {
				d.Denier = i
			}
			// Only the shared store's word is cached, never the fallback's.
			if dc != nil && !d.Local {
				dc.put(gen, v, clock, nowUS != 0)
			}
		}
	}
	return nil
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
// does not apply to req's identity (anonymous: skip). Used by the admin API.
func (l *Limiter) KeyFor(r *Rule, req *Request) (string, bool) {
	ident, ok := AppendIdentity(nil, r, req)
	if !ok {
		return "", false
	}
	return string(AppendKey(nil, l.prefix, r, ident)), true
}
