package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/rategate/rategate/limits"
)

// IdentityOverride is one identity's own treatment under one rule, set at
// run time (PUT /v1/rules/{rule}/identities?<dimension>=<value>...) and
// stored as JSON: in Redis one field of the hash <prefix>:{identities},
// so every instance applies it within a second and after restarts.
//
// Example: {"limit":1000,"reason":"enterprise plan","ttl":"30d"} gives
// user acme 1000 per period of a rule that allows 100; {"block":true,
// "ttl":"1h"} denies an abuser for an hour, asking Redis nothing.
type IdentityOverride struct {
	// Identity is the identity as given, by query parameter ({"user": "acme"}).
	Identity map[string]string `json:"identity"`
	// Key is the rule's key dimensions when the override was set: an
	// override stops applying if a reload changes them.
	Key []string `json:"key"`
	// Limit, Period, Burst and Factor apply to the rule in force as a
	// rule override's do (Apply).
	Limit  int64    `json:"limit,omitempty"`
	Period Duration `json:"period,omitempty"`
	Burst  int64    `json:"burst,omitempty"`
	Factor float64  `json:"factor,omitempty"`
	// Exempt: the rule never limits the identity and counts nothing for it.
	Exempt bool `json:"exempt,omitempty"`
	// Block: the rule denies every request of the identity.
	Block bool `json:"block,omitempty"`
	// Reason is free text for the operators who list the overrides.
	Reason string `json:"reason,omitempty"`
	// SetBy is who set it: the admin token's name, else the client address.
	SetBy string    `json:"set_by,omitempty"`
	SetAt time.Time `json:"set_at"`
	// ExpiresAt, when set, ends the override on every instance (from "ttl").
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// IPv6Prefix is identity.ipv6_prefix when the identity holds an IPv6
	// client (its network under that prefix); 0 when it holds none. Under
	// another prefix the identity names no client /auth makes, so the
	// override stops applying and the list says why.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`
}

// action returns what o does.
// numbers is the override's limit, period, burst and factor.
func (o *IdentityOverride) numbers() numbers {
	return numbers{limit: o.Limit, burst: o.Burst, period: time.Duration(o.Period), factor: o.Factor}
}

func (o *IdentityOverride) action() limits.IdentityAction {
	switch {
	case o.Exempt:
		return limits.IdentityExempt
	case o.Block:
		return limits.IdentityBlock
	}
	return limits.IdentityLimit
}

// ParseIdentityOverride reads a PUT /v1/rules/{rule}/identities body.
// Every problem is reported, each naming its field. now stamps SetAt and
// turns "ttl" into ExpiresAt.
func ParseIdentityOverride(body []byte, now time.Time) (IdentityOverride, error) {
	var o IdentityOverride
	var errs FieldErrors
	fail := func(field, format string, args ...any) {
		errs = append(errs, field+": "+fmt.Sprintf(format, args...))
	}
	raw, err := readObject(body)
	var twice FieldErrors
	switch {
	case errors.As(err, &twice):
		return o, twice
	case errors.Is(err, errTrailing):
		return o, FieldErrors{"body: must hold exactly one JSON object"}
	case err != nil || raw == nil:
		return o, FieldErrors{fmt.Sprintf(`body: must be a JSON object such as {"limit":1000,"ttl":"30d","reason":"..."}, {"exempt":true} or {"block":true,"ttl":"1h"}: %s`, errOr(err, "got null"))}
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var numbers []string
	f := overrideFields{Limit: &o.Limit, Burst: &o.Burst, Period: &o.Period, Factor: &o.Factor, Reason: &o.Reason, ExpiresAt: &o.ExpiresAt}
	for _, k := range keys {
		v := raw[k]
		switch k {
		case "exempt", "block":
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				fail(k, "must be true or false, got %s", v)
				continue
			}
			if k == "exempt" {
				o.Exempt = b
			} else {
				o.Block = b
			}
		default:
			known, number := f.parse(k, v, now, fail)
			switch {
			case !known:
				fail(k, "unknown field; use limit, period, burst, factor, exempt, block, reason or ttl")
			case number:
				numbers = append(numbers, k)
			}
		}
	}
	switch {
	case o.Exempt && o.Block:
		errs = append(errs, "exempt, block: give one of them, not both")
	case (o.Exempt || o.Block) && len(numbers) > 0:
		what := "exempt (an exempt identity is not limited by the rule)"
		if o.Block {
			what = "block (a blocked identity is denied whatever the numbers)"
		}
		for _, k := range numbers {
			errs = append(errs, k+": cannot go with "+what)
		}
	case !o.Exempt && !o.Block && len(numbers) == 0 && len(errs) == 0:
		errs = append(errs, `body: give limit, period, burst or factor, or "exempt": true, or "block": true`)
	}
	if len(errs) > 0 {
		return IdentityOverride{}, errs
	}
	o.SetAt = now.UTC()
	return o, nil
}

// IdentityStore keeps identity overrides where every instance can read
// them: limits.RedisIdentities, or MemoryIdentities in memory-store mode.
type IdentityStore interface {
	// Load returns every stored override (rule → identity → JSON) and the
	// change counter as it was before the read began.
	Load(ctx context.Context) (version uint64, all map[string]map[string]string, err error)
	// Version returns the change counter: one more after every change.
	Version(ctx context.Context) (uint64, error)
	// Set stores one override unless it is new and max are stored
	// (*limits.IdentityCapError); it returns the counter after it.
	Set(ctx context.Context, rule, id, value string, max int) (uint64, error)
	// Delete removes one override; with expect != "" only while it still
	// holds expect. changed is false when nothing was removed.
	Delete(ctx context.Context, rule, id, expect string) (version uint64, changed bool, err error)
	// Watch delivers every change made through any instance, in order,
	// and a Resync whenever some may have been missed; nil when no other
	// instance shares the store.
	Watch(ctx context.Context) <-chan limits.IdentityChange
	// Shared says whether other instances see the same overrides.
	Shared() bool
}

// MemoryIdentities keeps identity overrides in the process (memory-store mode).
type MemoryIdentities struct {
	mu      sync.Mutex
	m       map[string]map[string]string
	n       int
	version uint64
}

// NewMemoryIdentities returns an empty in-process identity override store.
func NewMemoryIdentities() *MemoryIdentities {
	return &MemoryIdentities{m: map[string]map[string]string{}}
}

// Load implements IdentityStore.
func (s *MemoryIdentities) Load(context.Context) (uint64, map[string]map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := make(map[string]map[string]string, len(s.m))
	for rule, m := range s.m {
		cp := make(map[string]string, len(m))
		for k, v := range m {
			cp[k] = v
		}
		all[rule] = cp
	}
	return s.version, all, nil
}

// Version implements IdentityStore.
func (s *MemoryIdentities) Version(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version, nil
}

// Set implements IdentityStore.
func (s *MemoryIdentities) Set(_ context.Context, rule, id, value string, max int) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.m[rule]
	cur, had := m[id]
	if had && cur == value {
		return s.version, nil
	}
	if !had && s.n >= max {
		return s.version, &limits.IdentityCapError{Max: max}
	}
	if m == nil {
		m = map[string]string{}
		s.m[rule] = m
	}
	if !had {
		s.n++
	}
	m[id] = value
	s.version++
	return s.version, nil
}

// Delete implements IdentityStore.
func (s *MemoryIdentities) Delete(_ context.Context, rule, id, expect string) (uint64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, had := s.m[rule][id]
	if !had || (expect != "" && cur != expect) {
		return s.version, false, nil
	}
	delete(s.m[rule], id)
	if len(s.m[rule]) == 0 {
		delete(s.m, rule)
	}
	s.n--
	s.version++
	return s.version, true, nil
}

// Watch implements IdentityStore: nobody else changes them.
func (s *MemoryIdentities) Watch(context.Context) <-chan limits.IdentityChange { return nil }

// Shared implements IdentityStore.
func (s *MemoryIdentities) Shared() bool { return false }

// errNotStored is a stored value rategate cannot use.
var errNotStored = errors.New("not an identity override")
