package limits_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/race"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// TestIdentityAllocs: a decision for an overridden identity (own numbers,
// exempt, blocked, in an exempt range) allocates nothing, like one without
// an override (TestLimiterAllocs), with 100,000 overrides in the table.
func TestIdentityAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are only meaningful without -race")
	}
	base := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.GCRA, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1}
	other := &limits.Rule{Name: "global", Algorithm: limits.SlidingWindow, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1}
	ipRule := &limits.Rule{Name: "per-ip", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.FixedWindow, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1}
	tb := bigTable(base, 100_000)
	tb.Set("own", limits.IdentityEntry{Rule: withNumbers(base, 1000), ExpiresUS: time.Now().Add(time.Hour).UnixMicro()})
	tb.Set("exempt", limits.IdentityEntry{Rule: base.Derive(limits.IdentityExempt)})
	tb.Set("blocked", limits.IdentityEntry{Rule: base.Derive(limits.IdentityBlock), ExpiresUS: time.Now().Add(time.Hour).UnixMicro()})
	ranges := limits.NewIdentityTable(nil, []limits.IdentityRange{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Entry: limits.IdentityEntry{Rule: ipRule.Derive(limits.IdentityExempt)}}})
	l := limits.NewLimiter(limits.NopStore{}, "rg", []*limits.Rule{base.WithIdentities(tb), other, ipRule.WithIdentities(ranges)})
	ctx := context.Background()
	for _, c := range []struct {
		user, ip string
		check    func(*limits.Decision) bool
	}{
		{"plain", "192.0.2.7", func(d *limits.Decision) bool { return d.Admitted && d.Verdicts[0].Rule == l.Rules()[0] }},
		{"own", "192.0.2.7", func(d *limits.Decision) bool { return d.Admitted && d.Verdicts[0].Rule.Limit == 1000 }},
		{"exempt", "192.0.2.7", func(d *limits.Decision) bool { return d.Admitted && len(d.Exempt) == 1 }},
		{"blocked", "192.0.2.7", func(d *limits.Decision) bool {
			return !d.Admitted && d.Verdicts[0].Rule.Identity == limits.IdentityBlock
		}},
		{"plain", "10.1.2.3", func(d *limits.Decision) bool { return d.Admitted && len(d.Exempt) == 1 && d.Exempt[0].Name == "per-ip" }},
	} {
		a := netip.MustParseAddr(c.ip)
		req := &limits.Request{User: []byte(c.user), IP: limits.AppendIPIdentity(nil, a, 64), Addr: a}
		var d limits.Decision
		if err := l.Decide(ctx, req, &d); err != nil || !c.check(&d) {
			t.Fatalf("%s from %s: %v %+v exempt %v", c.user, c.ip, err, d.Verdicts, d.Exempt)
		}
		if n := testing.AllocsPerRun(1000, func() { _ = l.Decide(ctx, req, &d) }); n != 0 {
			t.Errorf("%s from %s: %v allocations per decision, want 0", c.user, c.ip, n)
		}
	}
}

// bigTable returns a table of n identities ("user-<i>") with their own
// numbers, a few distinct ones shared as policy shares them.
func bigTable(base *limits.Rule, n int) *limits.IdentityTable {
	plans := []*limits.Rule{withNumbers(base, 1000), withNumbers(base, 5000), base.Derive(limits.IdentityExempt), base.Derive(limits.IdentityBlock)}
	entries := make(map[string]limits.IdentityEntry, n)
	exp := time.Now().Add(time.Hour).UnixMicro()
	for i := 0; i < n; i++ {
		e := limits.IdentityEntry{Rule: plans[i%len(plans)]}
		if i%2 == 0 {
			e.ExpiresUS = exp
		}
		entries[fmt.Sprintf("user-%d", i)] = e
	}
	return limits.NewIdentityTable(entries, nil)
}

// BenchmarkIdentityTable: the memory of a 100,000-entry table and the time
// of one lookup in it (hit and miss), and of a change (one shard copied).
func BenchmarkIdentityTable(b *testing.B) {
	base := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.GCRA, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1}
	const n = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := bigTable(base, n)
	runtime.GC()
	runtime.ReadMemStats(&after)
	perEntry := float64(after.HeapAlloc-before.HeapAlloc) / n
	hit, miss := []byte("user-4242"), []byte("nobody-4242")
	b.Run("memory", func(b *testing.B) {
		for range b.N {
			_ = tb.Len()
		}
		b.ReportMetric(perEntry, "B/entry")
		b.ReportMetric(perEntry*n/(1<<20), "MiB/100k")
	})
	b.Run("hit", func(b *testing.B) {
		var clock int64
		for range b.N {
			if _, ok := tb.Resolve(hit, hit, netip.Addr{}, &clock); !ok {
				b.Fatal("miss")
			}
		}
	})
	b.Run("miss", func(b *testing.B) {
		var clock int64
		for range b.N {
			if _, ok := tb.Resolve(miss, miss, netip.Addr{}, &clock); ok {
				b.Fatal("hit")
			}
		}
	})
	b.Run("set", func(b *testing.B) {
		e := limits.IdentityEntry{Rule: base}
		for i := range b.N {
			tb.Set(fmt.Sprintf("user-%d", i%n), e)
		}
	})
	runtime.KeepAlive(tb)
}

// BenchmarkDecideIdentity: a whole decision (memory store) of an identity
// without and with an override, in a 100,000-entry table.
func BenchmarkDecideIdentity(b *testing.B) {
	base := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.GCRA, Limit: 1 << 40, Period: time.Minute, Burst: 1 << 40, Cost: 1}
	tb := bigTable(base, 100_000)
	tb.Set("own", limits.IdentityEntry{Rule: withNumbers(base, 1<<40)})
	for _, c := range []struct {
		name string
		rule *limits.Rule
		user string
	}{{"no-table", base, "plain"}, {"not-overridden", base.WithIdentities(tb), "plain"}, {"overridden", base.WithIdentities(tb), "own"}} {
		b.Run(c.name, func(b *testing.B) {
			m := memstore.New()
			defer m.Close()
			l := limits.NewLimiter(m, "rg", []*limits.Rule{c.rule})
			req := &limits.Request{User: []byte(c.user)}
			var d limits.Decision
			ctx := context.Background()
			b.ReportAllocs()
			for range b.N {
				_ = l.Decide(ctx, req, &d)
			}
		})
	}
}
