package policy

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/rategate/rategate/limits"
)

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
		if r, err := ri.ruleInForce(s.action, s.n); err == nil {
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
		if r, err := ri.ruleInForce(ex.Action, numbers{limit: ex.Limit, burst: ex.Burst, period: ex.Period, factor: ex.Factor}); err == nil {
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
