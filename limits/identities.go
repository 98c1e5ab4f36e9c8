package limits

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Identity overrides: one identity of one rule (one store key) decided by
// numbers of its own, exempt from the rule, or blocked by it. They come
// from the config file (a rule's exceptions, including ip ranges) and from
// the admin API at run time (package policy keeps those in the shared
// store); this file is what the limiter consults on every request.
//
// Each rule in force carries an IdentityTable (Rule.WithIdentities). The
// limiter finds an identity's entry with one lookup, by the identity as it
// appears in the store key (the escaped identity, or "#" and its hash when
// long: KeyIdentity), in a table whose shards are immutable maps swapped
// atomically: a change copies one shard, a request never waits for a
// writer and allocates nothing. An entry holds a rule derived from the
// rule in force (Rule.Derive): same name, algorithm and key, the identity's
// numbers. The identity's store key is therefore the key it had before, and
// everything downstream (the store call, Verdict.Rule, the response
// headers, the deny cache, the metrics) sees a rule like any other.

// IdentityAction says what an identity override does to one rule.
type IdentityAction uint8

// The identity actions.
const (
	// IdentityNone: the rule as it stands (no override for the identity).
	IdentityNone IdentityAction = iota
	// IdentityLimit: the identity has its own limit, period or burst.
	IdentityLimit
	// IdentityExempt: the rule never limits the identity and counts
	// nothing for it; the request is decided by the other rules.
	IdentityExempt
	// IdentityBlock: the rule denies every request of the identity until
	// the override ends, and nothing is asked of the store or consumed
	// anywhere (Retry-After is the time left).
	IdentityBlock
	// NumIdentityActions counts the actions (metrics arrays).
	NumIdentityActions
)

var identityActionNames = [NumIdentityActions]string{"none", "limit", "exempt", "block"}

// String returns the action as the admin API and metric labels spell it.
func (a IdentityAction) String() string {
	if a < NumIdentityActions {
		return identityActionNames[a]
	}
	return "unknown"
}

// Derive returns a copy of r for one identity, marked with action. The
// copy keeps r's name, algorithm and key, so the identity's store key is
// the one it has under r and its counts carry over; the caller sets the
// identity's numbers on it (and validates them) before sharing it. It has
// no identity table and no exceptions of its own.
func (r *Rule) Derive(action IdentityAction) *Rule {
	d := *r
	d.Identity = action
	d.Exceptions = nil
	d.identities = nil
	return &d
}

// WithIdentities returns a copy of r that the limiter decides with the
// identity table t.
func (r *Rule) WithIdentities(t *IdentityTable) *Rule {
	c := *r
	c.identities = t
	return &c
}

// Identities returns the rule's identity table, or nil.
func (r *Rule) Identities() *IdentityTable { return r.identities }

// IdentityEntry is one identity's override as the limiter applies it.
type IdentityEntry struct {
	// Rule decides the identity: derived from the rule in force (Derive),
	// Rule.Identity says what it does.
	Rule *Rule
	// ExpiresUS is when the override ends, in µs since the Unix epoch on
	// the wall clock (every instance ends it at the same time); 0 = never.
	ExpiresUS int64
	// Fallback applies once this entry has expired: the config file's
	// exception for the same identity, which a runtime override hides.
	Fallback *IdentityEntry
}

// live reports whether e is in force at nowUS.
func (e *IdentityEntry) live(nowUS int64) bool { return e.ExpiresUS == 0 || nowUS < e.ExpiresUS }

// IdentityRange is a config exception for a range of client addresses
// (the ip dimension): checked only for the rules that have one, after the
// exact entries.
type IdentityRange struct {
	Prefix netip.Prefix
	// IP is the index of the ip part in the rule's key.
	IP int
	// Parts are, for a rule keyed on more than ip, the escaped values its
	// other key parts must have, in key order (the ip part's slot is
	// ignored); nil for a rule keyed on ip alone.
	Parts []string
	Entry IdentityEntry
}

// matches reports whether a request with the escaped identity ident and
// client address addr falls in g.
func (g *IdentityRange) matches(ident []byte, addr netip.Addr) bool {
	if !addr.IsValid() || !g.Prefix.Contains(addr.Unmap()) {
		return false
	}
	// Escaped values never hold a literal '|' (key.go), so splitting the
	// identity on it gives the parts back.
	for k := range g.Parts {
		part := ident
		if i := bytes.IndexByte(ident, '|'); i >= 0 {
			part, ident = ident[:i], ident[i+1:]
		} else {
			ident = nil
		}
		if k != g.IP && string(part) != g.Parts[k] {
			return false
		}
	}
	return true
}

// Holds reports whether g holds req's identity under rule r (the admin API).
func (g *IdentityRange) Holds(r *Rule, req *Request) bool {
	ident, ok := AppendIdentity(nil, r, req)
	return ok && g.matches(ident, req.Addr)
}

// HoldsID reports whether g holds the identity id (as KeyIdentity spells
// it) of rule r: known only when r is keyed on ip alone, where the
// identity is the address (or an IPv6 network, which g holds whole).
func (g *IdentityRange) HoldsID(r *Rule, id string) bool {
	if len(r.Key) != 1 || r.Key[0].Kind != KeyIP {
		return false
	}
	if p, err := netip.ParsePrefix(id); err == nil {
		return g.Prefix.Bits() <= p.Bits() && g.Prefix.Contains(p.Addr())
	}
	a, err := netip.ParseAddr(id)
	return err == nil && g.Prefix.Contains(a.Unmap())
}

// identityShards is the number of shards of an IdentityTable: a change
// copies one of them (about 400 entries of a 100,000-entry table).
const identityShards = 256

// IdentityTable holds one rule's identity overrides for the limiter. Reads
// are lock-free and allocate nothing; writers (Set, Delete, Replace) are
// serialized and copy the one shard they change, so a request sees each
// identity either before or after a change, never half of one.
type IdentityTable struct {
	seed   maphash.Seed
	count  atomic.Int64
	ranges []IdentityRange // immutable
	mu     sync.Mutex      // serializes writers
	shards [identityShards]atomic.Pointer[map[string]IdentityEntry]
}

// NewIdentityTable returns a table of the given exact entries (keyed by
// KeyIdentity) and ip ranges (checked in order; ranges is not copied and
// must not change).
func NewIdentityTable(entries map[string]IdentityEntry, ranges []IdentityRange) *IdentityTable {
	t := &IdentityTable{seed: maphash.MakeSeed(), ranges: ranges}
	t.fill(entries)
	return t
}

func (t *IdentityTable) shard(id string) *atomic.Pointer[map[string]IdentityEntry] {
	return &t.shards[maphash.String(t.seed, id)%identityShards]
}

// fill stores entries as the table's whole content. t.mu is held (or t is new).
func (t *IdentityTable) fill(entries map[string]IdentityEntry) {
	var parts [identityShards]map[string]IdentityEntry
	for id, e := range entries {
		i := maphash.String(t.seed, id) % identityShards
		if parts[i] == nil {
			parts[i] = make(map[string]IdentityEntry)
		}
		parts[i][id] = e
	}
	for i := range t.shards {
		if parts[i] == nil {
			t.shards[i].Store(nil)
		} else {
			m := parts[i]
			t.shards[i].Store(&m)
		}
	}
	t.count.Store(int64(len(entries)))
}

// Len returns the number of exact entries, expired ones not yet removed
// included.
func (t *IdentityTable) Len() int { return int(t.count.Load()) }

// Ranges returns the table's ip ranges. Callers must not modify them.
func (t *IdentityTable) Ranges() []IdentityRange { return t.ranges }

// Get returns the exact entry of identity id (expired or not).
func (t *IdentityTable) Get(id string) (IdentityEntry, bool) {
	m := t.shard(id).Load()
	if m == nil {
		return IdentityEntry{}, false
	}
	e, ok := (*m)[id]
	return e, ok
}

// Set adds or replaces the exact entry of identity id.
func (t *IdentityTable) Set(id string, e IdentityEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sh := t.shard(id)
	var next map[string]IdentityEntry
	if old := sh.Load(); old != nil {
		if _, had := (*old)[id]; !had {
			t.count.Add(1)
		}
		next = make(map[string]IdentityEntry, len(*old)+1)
		maps.Copy(next, *old)
	} else {
		next = make(map[string]IdentityEntry, 1)
		t.count.Add(1)
	}
	next[id] = e
	sh.Store(&next)
}

// Delete removes the exact entry of identity id and reports whether there
// was one.
func (t *IdentityTable) Delete(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	sh := t.shard(id)
	old := sh.Load()
	if old == nil {
		return false
	}
	if _, had := (*old)[id]; !had {
		return false
	}
	if len(*old) == 1 {
		sh.Store(nil)
	} else {
		next := make(map[string]IdentityEntry, len(*old)-1)
		for k, v := range *old {
			if k != id {
				next[k] = v
			}
		}
		sh.Store(&next)
	}
	t.count.Add(-1)
	return true
}

// Replace makes entries the table's exact entries (a full re-read). Each
// identity changes at once; the table as a whole changes shard by shard.
func (t *IdentityTable) Replace(entries map[string]IdentityEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fill(entries)
}

// Range calls f for every exact entry until f returns false (admin
// listings and metrics; not a consistent snapshot across shards).
func (t *IdentityTable) Range(f func(id string, e IdentityEntry) bool) {
	for i := range t.shards {
		m := t.shards[i].Load()
		if m == nil {
			continue
		}
		for id, e := range *m {
			if !f(id, e) {
				return
			}
		}
	}
}

// active reports whether the table can hold anything for a request.
func (t *IdentityTable) active() bool { return t.count.Load() > 0 || len(t.ranges) > 0 }

// resolve returns the entry that applies to an identity at *clock: its
// live exact entry, else that entry's fallback, else the first range that
// holds it. id is the identity as it appears in the store key, ident the
// escaped identity (AppendIdentity), addr the client address. *clock is
// the wall clock in µs, read on first need when 0. It does not allocate.
func (t *IdentityTable) resolve(id, ident []byte, addr netip.Addr, clock *int64) (IdentityEntry, bool) {
	if t.count.Load() > 0 {
		if m := t.shards[maphash.Bytes(t.seed, id)%identityShards].Load(); m != nil {
			if e, ok := (*m)[string(id)]; ok {
				if e.ExpiresUS == 0 {
					return e, true
				}
				if *clock == 0 {
					*clock = time.Now().UnixMicro()
				}
				if e.live(*clock) {
					return e, true
				}
				if e.Fallback != nil {
					return *e.Fallback, true
				}
			}
		}
	}
	for i := range t.ranges {
		if g := &t.ranges[i]; g.matches(ident, addr) {
			return g.Entry, true
		}
	}
	return IdentityEntry{}, false
}

// appendIdentityKey appends the identity as it appears in a store key:
// the escaped identity itself, or "#" and 32 hex digits of its SHA-256
// when it is longer than maxIdentity.
func appendIdentityKey(dst, identity []byte) []byte {
	if len(identity) > maxIdentity {
		sum := sha256.Sum256(identity)
		dst = append(dst, '#')
		return hex.AppendEncode(dst, sum[:16])
	}
	return append(dst, identity...)
}

// KeyIdentity returns req's identity under rule r as it appears in the
// store key: what identity tables are keyed by, and what the admin API and
// the top-denied sketch show. ok is false when the rule does not apply to
// req (a user key, anonymous: skip, no user).
func KeyIdentity(r *Rule, req *Request) (string, bool) {
	ident, ok := AppendIdentity(nil, r, req)
	if !ok {
		return "", false
	}
	return string(appendIdentityKey(nil, ident)), true
}

// keyIdentity returns the identity part of key, built by AppendKey for r
// with prefix.
func keyIdentity(key []byte, prefix string, r *Rule) []byte {
	return key[len(prefix)+2+len(r.Name)+1 : len(key)-2-len(r.Algorithm.Suffix())]
}

// blockVerdict is the verdict of a request that e blocks at nowUS: denied,
// nothing remaining, retry when the block ends (NeverFits for a block
// without an end).
func blockVerdict(e IdentityEntry, key string, cost, nowUS int64) Verdict {
	res := Result{RetryUS: NeverFits}
	if e.ExpiresUS != 0 {
		left := max(e.ExpiresUS-nowUS, 1)
		res.RetryUS, res.ResetUS = left, left
	}
	return Verdict{Rule: e.Rule, Key: key, Cost: cost, Result: res}
}

// Identity returns the identity override that applies to req under rule r
// now (r as the limiter has it: Rule or Rules), for the admin API.
func (l *Limiter) Identity(r *Rule, req *Request) (IdentityEntry, bool) {
	t := r.identities
	if t == nil {
		return IdentityEntry{}, false
	}
	ident, ok := AppendIdentity(nil, r, req)
	if !ok {
		return IdentityEntry{}, false
	}
	var clock int64
	return t.resolve(appendIdentityKey(nil, ident), ident, req.Addr, &clock)
}

// ForgetIdentity drops this instance's cached denial of identity id (as
// KeyIdentity spells it) under rule r, and keeps decisions in flight from
// caching one computed before: call it after the identity's override
// changed in r's table, since a denial under the old numbers may end
// earlier under the new ones.
func (l *Limiter) ForgetIdentity(r *Rule, id string) {
	if l.deny == nil {
		return
	}
	l.deny.Forget(string(AppendKey(nil, l.prefix, r, []byte(id))))
}

// IdentityKeyOf returns the store key of identity id (as KeyIdentity
// spells it) under rule r.
func (l *Limiter) IdentityKeyOf(r *Rule, id string) string {
	return string(AppendKey(nil, l.prefix, r, []byte(id)))
}

// Exception is one entry of a rule's `exceptions:` in the config file,
// compiled: an exact identity or an ip range, and what applies to it.
type Exception struct {
	// Match is the identity as written, by dimension as the admin API
	// names them (ip, user, route, method, host, header.<Name>): {"user":
	// "acme"}, {"ip": "10.0.0.0/8"}.
	Match map[string]string
	// ID is the identity as KeyIdentity spells it; "" for a range.
	ID string
	// Range, IP and Parts describe a range exception (IdentityRange).
	Range netip.Prefix
	IP    int
	Parts []string
	// Action is IdentityLimit, IdentityExempt or IdentityBlock; for
	// IdentityLimit the numbers apply to the rule in force as a runtime
	// override's do (zero: not set).
	Action IdentityAction
	Limit  int64
	Period time.Duration
	Burst  int64
	Factor float64
	Reason string
}

// IdentityChange is one change to the stored identity overrides as a
// shared store announces it, in the order the store made them.
type IdentityChange struct {
	// Version is the store's change counter after this change: it grows
	// by one per change, so a gap means a change was missed.
	Version uint64
	// Rule and ID (as KeyIdentity spells it) name the override; Value is
	// its stored JSON, "" when it was deleted.
	Rule, ID, Value string
	// Resync says announcements may have been missed (the subscription
	// was just established, or re-established): the other fields are
	// empty, and the listener compares versions.
	Resync bool
}

// IdentityCapError is a store's answer when storing one more identity
// override would keep more than Max of them.
type IdentityCapError struct{ Max int }

func (e *IdentityCapError) Error() string {
	return fmt.Sprintf("%d identity overrides are stored, the most identity_overrides.max_entries allows; delete some (or raise it)", e.Max)
}

// JoinPairs writes m as key=value pairs in key order, sep between them:
// how an identity's dimensions (or a stored record's fields) are shown to
// people, in the admin API, the CLI, -check and the logs.
func JoinPairs(m map[string]string, sep string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(m[k])
	}
	return b.String()
}
