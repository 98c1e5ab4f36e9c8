package limits_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"
	"github.com/rategate/rategate/limits/storetest"
)

// countingStore counts the batches a limiter asks of its store.
type countingStore struct {
	limits.Store
	decides atomic.Int64
}

func (s *countingStore) Decide(ctx context.Context, b *limits.Batch, res []limits.Result) (bool, error) {
	s.decides.Add(1)
	return s.Store.Decide(ctx, b, res)
}

// idRule is a sliding_log rule keyed on the user: exact, no window
// boundary within a test.
func idRule(name string, limit int64) *limits.Rule {
	return &limits.Rule{Name: name, Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.SlidingLog,
		Limit: limit, Period: time.Hour, Burst: limit, Cost: 1}
}

// withNumbers derives r for an identity with its own limit.
func withNumbers(r *limits.Rule, limit int64) *limits.Rule {
	d := r.Derive(limits.IdentityLimit)
	d.Limit, d.Burst = limit, limit
	return d
}

// idLimiter is a limiter over a fresh memory store (counting its calls),
// with a deny cache, deciding rules each carrying a table of entries.
func idLimiter(t *testing.T, tables map[string]*limits.IdentityTable, rules ...*limits.Rule) (*limits.Limiter, *countingStore) {
	t.Helper()
	m := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { m.Close() })
	cs := &countingStore{Store: m}
	in := make([]*limits.Rule, len(rules))
	for i, r := range rules {
		tb := tables[r.Name]
		if tb == nil {
			tb = limits.NewIdentityTable(nil, nil)
		}
		in[i] = r.WithIdentities(tb)
	}
	return limits.New(limits.Options{Store: cs, Prefix: "rg", Rules: in, DenyCache: limits.NewDenyCache(1000)}), cs
}

func askUser(t *testing.T, l *limits.Limiter, user string) limits.Decision {
	t.Helper()
	var d limits.Decision
	if err := l.Decide(context.Background(), &limits.Request{User: []byte(user), IP: []byte("192.0.2.1"),
		Addr: netip.MustParseAddr("192.0.2.1")}, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// admitted sends n requests of user and returns how many were admitted.
func admitted(t *testing.T, l *limits.Limiter, user string, n int) int {
	t.Helper()
	got := 0
	for i := 0; i < n; i++ {
		if askUser(t, l, user).Admitted {
			got++
		}
	}
	return got
}

// TestIdentityLimitSameKey: an identity with its own limit is decided by
// it, under the key it had, so what it used before the override counts;
// other identities keep the rule's limit; the verdict's rule is the
// identity's (headers and metrics describe its own policy).
func TestIdentityLimitSameKey(t *testing.T) {
	base := idRule("per-user", 3)
	tb := limits.NewIdentityTable(nil, nil)
	l, _ := idLimiter(t, map[string]*limits.IdentityTable{"per-user": tb}, base)
	if got := admitted(t, l, "acme", 2); got != 2 {
		t.Fatalf("before the override: %d of 2 admitted", got)
	}
	tb.Set("acme", limits.IdentityEntry{Rule: withNumbers(base, 10)})
	d := askUser(t, l, "acme")
	if !d.Admitted || d.Verdicts[0].Rule.Limit != 10 || d.Verdicts[0].Rule.Identity != limits.IdentityLimit {
		t.Fatalf("under the override: %+v", d.Verdicts)
	}
	if d.Verdicts[0].Key != "rg:{per-user:acme}:sl2" || d.Verdicts[0].Result.Remaining != 7 {
		t.Fatalf("key %q remaining %d, want the same key with 7 left (3 used)", d.Verdicts[0].Key, d.Verdicts[0].Result.Remaining)
	}
	if got := admitted(t, l, "acme", 10); got != 7 {
		t.Fatalf("acme: %d more admitted, want 7 (10 - 3 used)", got)
	}
	if got := admitted(t, l, "other", 5); got != 3 {
		t.Fatalf("another user: %d of 5 admitted, want the rule's 3", got)
	}
	// The override ends: the rule's 3 apply to what acme used (10).
	tb.Delete("acme")
	l.ForgetIdentity(base, "acme")
	if d := askUser(t, l, "acme"); d.Admitted || d.Verdicts[0].Rule.Limit != 3 {
		t.Fatalf("after the override: %+v", d)
	}
}

// TestIdentityExempt: an exempt identity is not limited by the rule and
// counts nothing there, while the other rules still decide the request.
func TestIdentityExempt(t *testing.T) {
	a, b := idRule("a", 2), idRule("b", 4)
	tb := limits.NewIdentityTable(map[string]limits.IdentityEntry{"acme": {Rule: a.Derive(limits.IdentityExempt)}}, nil)
	l, cs := idLimiter(t, map[string]*limits.IdentityTable{"a": tb}, a, b)
	d := askUser(t, l, "acme")
	if !d.Admitted || len(d.Verdicts) != 1 || d.Verdicts[0].Rule.Name != "b" || len(d.Exempt) != 1 || d.Exempt[0].Name != "a" {
		t.Fatalf("first request: %+v exempt %v", d.Verdicts, d.Exempt)
	}
	if got := 1 + admitted(t, l, "acme", 5); got != 4 {
		t.Fatalf("%d admitted, want rule b's 4 (a exempts acme)", got)
	}
	res, err := cs.Peek(context.Background(), a.Check("rg:{a:acme}:sl2", 0))
	if err != nil || res.Remaining != 2 {
		t.Fatalf("rule a's key: %+v %v, want untouched (2 remaining)", res, err)
	}
	// Exempt from every matching rule: admitted without asking the store.
	l2, cs2 := idLimiter(t, map[string]*limits.IdentityTable{"a": tb}, a)
	for i := 0; i < 5; i++ {
		if d := askUser(t, l2, "acme"); !d.Admitted || len(d.Verdicts) != 0 {
			t.Fatalf("only rule exempt: %+v", d)
		}
	}
	if n := cs2.decides.Load(); n != 0 {
		t.Fatalf("%d store calls for a request every rule exempts, want 0", n)
	}
	if n := cs.decides.Load(); n != 5 {
		t.Fatalf("%d store calls for 6 requests rule b decides, want 5 (the 6th is its cached denial)", n)
	}
}

// TestIdentityBlock: a blocked identity is denied by the rule, Retry-After
// is the block's time left, and nothing is asked of the store or consumed
// in any rule; a shadow rule's block only reports.
func TestIdentityBlock(t *testing.T) {
	a, b := idRule("a", 5), idRule("b", 5)
	exp := time.Now().Add(30 * time.Second).UnixMicro()
	tb := limits.NewIdentityTable(map[string]limits.IdentityEntry{"mallory": {Rule: a.Derive(limits.IdentityBlock), ExpiresUS: exp}}, nil)
	l, cs := idLimiter(t, map[string]*limits.IdentityTable{"a": tb}, a, b)
	for i := 0; i < 3; i++ {
		d := askUser(t, l, "mallory")
		if d.Admitted || d.Denier != 0 || d.Verdicts[0].Rule.Identity != limits.IdentityBlock || d.Cached {
			t.Fatalf("blocked request: %+v", d)
		}
		if r := d.Verdicts[0].Result.RetryUS; r <= 29_000_000 || r > 30_000_000 {
			t.Fatalf("retry %dµs, want the block's ~30 s", r)
		}
		if v := d.Verdicts[1]; !v.Result.Allowed || v.Result.Remaining != 5 {
			t.Fatalf("rule b not asked: %+v, want its full quota", v)
		}
	}
	if n := cs.decides.Load(); n != 0 {
		t.Fatalf("%d store calls for blocked requests, want 0", n)
	}
	if d := askUser(t, l, "bob"); !d.Admitted || cs.decides.Load() != 1 {
		t.Fatalf("another user: %+v, store calls %d", d, cs.decides.Load())
	}
	if l.DenyCache().Len() != 0 {
		t.Fatalf("a block went into the deny cache (%d entries)", l.DenyCache().Len())
	}
	// Without an end: NeverFits (no Retry-After).
	tb.Set("eve", limits.IdentityEntry{Rule: a.Derive(limits.IdentityBlock)})
	if d := askUser(t, l, "eve"); d.Admitted || d.Verdicts[0].Result.RetryUS != limits.NeverFits {
		t.Fatalf("permanent block: %+v", d)
	}
	// A shadow rule's block reports a shadow denial and decides nothing.
	sh := idRule("sh", 5)
	sh.Shadow = true
	stb := limits.NewIdentityTable(map[string]limits.IdentityEntry{"mallory": {Rule: sh.Derive(limits.IdentityBlock)}}, nil)
	l3, cs3 := idLimiter(t, map[string]*limits.IdentityTable{"sh": stb}, sh, b)
	d := askUser(t, l3, "mallory")
	if !d.Admitted || len(d.Verdicts) != 2 || d.Verdicts[0].Result.Allowed || !d.Verdicts[1].Result.Allowed || cs3.decides.Load() != 1 {
		t.Fatalf("shadow block: %+v, store calls %d", d, cs3.decides.Load())
	}
	if d.Verdicts[1].Result.Remaining != 4 {
		t.Fatalf("rule b's result %+v, want its own (4 left)", d.Verdicts[1].Result)
	}
}

// TestIdentityAllOrNothing: a request denied by an identity's own limit
// consumes nothing in the other rules.
func TestIdentityAllOrNothing(t *testing.T) {
	a, b := idRule("a", 5), idRule("b", 5)
	tb := limits.NewIdentityTable(map[string]limits.IdentityEntry{"acme": {Rule: withNumbers(a, 1)}}, nil)
	l, cs := idLimiter(t, map[string]*limits.IdentityTable{"a": tb}, a, b)
	if got := admitted(t, l, "acme", 4); got != 1 {
		t.Fatalf("%d admitted, want acme's own 1", got)
	}
	res, _ := cs.Peek(context.Background(), b.Check("rg:{b:acme}:sl2", 0))
	if res.Remaining != 4 {
		t.Fatalf("rule b remaining %d, want 4: denied requests consumed nothing there", res.Remaining)
	}
}

// TestIdentityExpiry: an entry ends at its ExpiresUS on the wall clock;
// the config exception it hides (Fallback) applies again.
func TestIdentityExpiry(t *testing.T) {
	base := idRule("per-user", 2)
	static := &limits.IdentityEntry{Rule: withNumbers(base, 4)}
	tb := limits.NewIdentityTable(map[string]limits.IdentityEntry{
		"gone":   {Rule: base.Derive(limits.IdentityBlock), ExpiresUS: time.Now().Add(-time.Second).UnixMicro()},
		"hidden": {Rule: base.Derive(limits.IdentityExempt), ExpiresUS: time.Now().Add(-time.Second).UnixMicro(), Fallback: static},
		"soon":   {Rule: base.Derive(limits.IdentityBlock), ExpiresUS: time.Now().Add(150 * time.Millisecond).UnixMicro()},
	}, nil)
	l, _ := idLimiter(t, map[string]*limits.IdentityTable{"per-user": tb}, base)
	if got := admitted(t, l, "gone", 3); got != 2 {
		t.Fatalf("expired block: %d admitted, want the rule's 2", got)
	}
	if got := admitted(t, l, "hidden", 5); got != 4 {
		t.Fatalf("expired exempt over an exception: %d admitted, want the exception's 4", got)
	}
	if askUser(t, l, "soon").Admitted {
		t.Fatal("a block not yet ended admitted a request")
	}
	time.Sleep(200 * time.Millisecond)
	if !askUser(t, l, "soon").Admitted {
		t.Fatal("a block past its end still denies")
	}
}

// TestIdentityRanges: an ip range holds every address in it, after the
// exact entries; with more key parts, those must match too.
func TestIdentityRanges(t *testing.T) {
	r := &limits.Rule{Name: "per-ip", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.SlidingLog, Limit: 1, Period: time.Hour, Burst: 1, Cost: 1}
	multi := &limits.Rule{Name: "ip-route", Key: []limits.KeyPart{{Kind: limits.KeyRoute}, {Kind: limits.KeyIP}}, Algorithm: limits.SlidingLog, Limit: 1, Period: time.Hour, Burst: 1, Cost: 1}
	tb := limits.NewIdentityTable(map[string]limits.IdentityEntry{"10.1.2.3": {Rule: r.Derive(limits.IdentityBlock)}},
		[]limits.IdentityRange{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Entry: limits.IdentityEntry{Rule: r.Derive(limits.IdentityExempt)}}})
	mtb := limits.NewIdentityTable(nil, []limits.IdentityRange{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), IP: 1, Parts: []string{"/health", ""},
		Entry: limits.IdentityEntry{Rule: multi.Derive(limits.IdentityExempt)}}})
	l, _ := idLimiter(t, map[string]*limits.IdentityTable{"per-ip": tb, "ip-route": mtb}, r, multi)
	ask := func(ip, route string) limits.Decision {
		var d limits.Decision
		a := netip.MustParseAddr(ip)
		if err := l.Decide(context.Background(), &limits.Request{IP: limits.AppendIPIdentity(nil, a, 64), Addr: a, Route: []byte(route)}, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := 0; i < 3; i++ {
		if d := ask("10.9.9.9", "/health"); !d.Admitted || len(d.Exempt) != 2 {
			t.Fatalf("10.9.9.9 /health: %+v exempt %d, want exempt from both rules", d.Verdicts, len(d.Exempt))
		}
	}
	if d := ask("10.9.9.9", "/x"); !d.Admitted || len(d.Exempt) != 1 || d.Exempt[0].Name != "per-ip" {
		t.Fatalf("10.9.9.9 /x: exempt %v", d.Exempt)
	}
	if d := ask("10.9.9.9", "/x"); d.Admitted {
		t.Fatal("10.9.9.9 /x: ip-route should limit (the range names /health only)")
	}
	if d := ask("10.1.2.3", "/health"); d.Admitted {
		t.Fatal("10.1.2.3: the exact block loses to the range")
	}
	if d := ask("192.0.2.9", "/health"); !d.Admitted || len(d.Exempt) != 0 {
		t.Fatalf("outside the range: %+v", d)
	}
	// An IPv4-mapped address is its IPv4 address.
	if d := ask("::ffff:10.9.9.8", "/health"); !d.Admitted || len(d.Exempt) != 2 {
		t.Fatalf("IPv4-mapped: %+v exempt %d", d.Verdicts, len(d.Exempt))
	}
}

// TestIdentityChangeKeepsDenyCacheExact: a denial cached under the old
// numbers never outlives a change that admits earlier.
func TestIdentityChangeKeepsDenyCacheExact(t *testing.T) {
	base := idRule("per-user", 1)
	tb := limits.NewIdentityTable(nil, nil)
	l, cs := idLimiter(t, map[string]*limits.IdentityTable{"per-user": tb}, base)
	askUser(t, l, "acme")
	if d := askUser(t, l, "acme"); d.Admitted || d.Cached {
		t.Fatalf("second request: %+v", d)
	}
	if d := askUser(t, l, "acme"); d.Admitted || !d.Cached {
		t.Fatalf("third request not answered by the deny cache: %+v", d)
	}
	calls := cs.decides.Load()
	tb.Set("acme", limits.IdentityEntry{Rule: withNumbers(base, 5)})
	l.ForgetIdentity(base, "acme")
	if d := askUser(t, l, "acme"); !d.Admitted {
		t.Fatalf("after raising acme's limit: %+v, want admitted", d)
	}
	if cs.decides.Load() != calls+1 {
		t.Fatal("the store was not asked after the change")
	}
	// Denied under the override, cached; back to the rule's numbers and
	// up again: every change asks the store first.
	for askUser(t, l, "acme").Admitted {
	}
	if !askUser(t, l, "acme").Cached {
		t.Fatal("a denial under the override is not cached")
	}
	tb.Set("acme", limits.IdentityEntry{Rule: withNumbers(base, 50)})
	// Even without ForgetIdentity, the entry's rule is not the one in force.
	if d := askUser(t, l, "acme"); !d.Admitted || d.Cached {
		t.Fatalf("after another raise: %+v", d)
	}
}

// TestIdentityConcurrentExact: 200 concurrent requests of an overridden
// identity admit exactly its own limit, on each store.
func TestIdentityConcurrentExact(t *testing.T) {
	eachStore(t, func(t *testing.T, store limits.Store, _ limits.Leaser) {
		base := &limits.Rule{Name: "conc", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.GCRA, Limit: 10,
			Period: storetest.ConcurrencyPeriod, Burst: 10, Cost: 1}
		d := base.Derive(limits.IdentityLimit)
		d.Limit, d.Burst = 37, 37
		user := fmt.Sprintf("acme-%d", time.Now().UnixNano())
		tb := limits.NewIdentityTable(map[string]limits.IdentityEntry{user: {Rule: d}}, nil)
		l := limits.NewLimiter(store, "rg", []*limits.Rule{base.WithIdentities(tb)})
		var admitted atomic.Int64
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := 0; i < 200; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				var dec limits.Decision
				if err := l.Decide(context.Background(), &limits.Request{User: []byte(user)}, &dec); err != nil {
					t.Error(err)
					return
				}
				if dec.Admitted {
					admitted.Add(1)
				}
			}()
		}
		close(gate)
		wg.Wait()
		if got := admitted.Load(); got != 37 {
			t.Fatalf("admitted %d of 200, want exactly the identity's 37", got)
		}
	})
}

// TestIdentityTableWriters: Set, Delete and Replace keep Len, and a reader
// sees an identity before or after a change.
func TestIdentityTableWriters(t *testing.T) {
	r := idRule("r", 1)
	tb := limits.NewIdentityTable(nil, nil)
	for i := 0; i < 1000; i++ {
		tb.Set(fmt.Sprint(i), limits.IdentityEntry{Rule: r})
	}
	tb.Set("5", limits.IdentityEntry{Rule: r, ExpiresUS: 9})
	if tb.Len() != 1000 {
		t.Fatalf("Len %d, want 1000", tb.Len())
	}
	if e, ok := tb.Get("5"); !ok || e.ExpiresUS != 9 {
		t.Fatalf("Get(5) = %+v %v", e, ok)
	}
	for i := 0; i < 1000; i += 2 {
		if !tb.Delete(fmt.Sprint(i)) {
			t.Fatalf("Delete(%d) found nothing", i)
		}
	}
	if tb.Delete("0") || tb.Len() != 500 {
		t.Fatalf("after deletes: Len %d", tb.Len())
	}
	tb.Replace(map[string]limits.IdentityEntry{"x": {Rule: r}})
	if _, ok := tb.Get("1"); ok || tb.Len() != 1 {
		t.Fatalf("after Replace: Len %d", tb.Len())
	}
	n := 0
	tb.Range(func(string, limits.IdentityEntry) bool { n++; return true })
	if n != 1 {
		t.Fatalf("Range saw %d entries", n)
	}
}

// TestKeyIdentity: the table's key is the identity as the store key has
// it, a hash for a long one.
func TestKeyIdentity(t *testing.T) {
	r := &limits.Rule{Name: "r", Key: []limits.KeyPart{{Kind: limits.KeyUser}, {Kind: limits.KeyRoute}}, Algorithm: limits.GCRA}
	req := &limits.Request{User: []byte("a b|c"), Route: []byte("/x")}
	id, ok := limits.KeyIdentity(r, req)
	key := string(limits.AppendKey(nil, "rg", r, mustIdent(t, r, req)))
	if !ok || id != "a%20b%7Cc|/x" || key != "rg:{r:"+id+"}:gc2" {
		t.Fatalf("id %q key %q", id, key)
	}
	long := &limits.Request{User: bytes.Repeat([]byte("u"), 200), Route: []byte("/x")}
	id, _ = limits.KeyIdentity(r, long)
	key = string(limits.AppendKey(nil, "rg", r, mustIdent(t, r, long)))
	if len(id) != 33 || id[0] != '#' || key != "rg:{r:"+id+"}:gc2" {
		t.Fatalf("long identity %q in key %q", id, key)
	}
	if got := string(limits.IdentityOfKey([]byte(key), "rg", r)); got != id {
		t.Fatalf("keyIdentity = %q, want %q", got, id)
	}
}

func mustIdent(t *testing.T, r *limits.Rule, req *limits.Request) []byte {
	t.Helper()
	b, ok := limits.AppendIdentity(nil, r, req)
	if !ok {
		t.Fatal("identity does not apply")
	}
	return b
}

// eachStore runs fn on a fresh memory store and on a real Redis, each
// given as the store and as its leaser.
func eachStore(t *testing.T, fn func(t *testing.T, s limits.Store, leaser limits.Leaser)) {
	t.Run("memory", func(t *testing.T) {
		m := memstore.New()
		t.Cleanup(func() { m.Close() })
		fn(t, m, m)
	})
	t.Run("redis", func(t *testing.T) {
		srv := testredis.Start(t)
		rs, err := redisstore.Open(redisstore.Options{URL: "redis://" + srv.Addr})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		fn(t, rs, rs)
	})
}
