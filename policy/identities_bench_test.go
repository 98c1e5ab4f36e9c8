package policy

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// BenchmarkIdentities100k: 100,000 runtime overrides of one rule, each
// with a reason and a TTL: the memory kept for them (the stored JSON, the
// policy side's record and the limiter's table entry), a full read of them
// (start, or a missed change), and one change applied as a delta.
func BenchmarkIdentities100k(b *testing.B) {
	const n = 100_000
	cfg, err := config.Parse("b.yaml", []byte("rules:\n  - name: api\n    key: [user]\n    algorithm: gcra\n    limit: 100\n    period: 1m\n"))
	if err != nil {
		b.Fatal(err)
	}
	all := map[string]map[string]string{"api": {}}
	exp := time.Now().Add(24 * time.Hour).UTC()
	for i := 0; i < n; i++ {
		o := IdentityOverride{Identity: map[string]string{"user": fmt.Sprintf("customer-%d", i)}, Key: []string{"user"},
			Limit: int64(1000 + i%7), Reason: "enterprise plan, ticket 12345", SetBy: "127.0.0.1:54321", SetAt: time.Now().UTC(), ExpiresAt: &exp}
		raw, _ := json.Marshal(o)
		all["api"][fmt.Sprintf("customer-%d", i)] = string(raw)
	}
	newIDs := func() *Identities {
		mem := memstore.New()
		b.Cleanup(func() { mem.Close() })
		l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: cfg.Rules})
		x := NewIdentities(IdentitiesOptions{Limiter: l, Log: zerolog.Nop()})
		l.SetRules(x.Install(cfg.Rules))
		return x
	}
	b.Run("memory", func(b *testing.B) {
		var before, after runtime.MemStats
		var x *Identities
		for range b.N {
			runtime.GC()
			runtime.ReadMemStats(&before)
			read := map[string]map[string]string{"api": make(map[string]string, n)}
			for id, raw := range all["api"] {
				read["api"][strings.Clone(id)] = strings.Clone(raw) // as a read from Redis hands them over
			}
			x = newIDs()
			x.mu.Lock()
			x.loadAll(1, read)
			x.mu.Unlock()
			read = nil
			runtime.GC()
			runtime.ReadMemStats(&after)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/override")
		runtime.KeepAlive(x)
	})
	b.Run("full-read", func(b *testing.B) {
		for range b.N {
			x := newIDs()
			x.mu.Lock()
			x.loadAll(1, all)
			x.mu.Unlock()
		}
	})
	b.Run("delta", func(b *testing.B) {
		x := newIDs()
		x.mu.Lock()
		x.loadAll(1, all)
		x.mu.Unlock()
		raw := all["api"]["customer-7"]
		b.ResetTimer()
		for i := range b.N {
			x.mu.Lock()
			x.change("api", fmt.Sprintf("customer-%d", i%n), raw)
			x.mu.Unlock()
		}
	})
}
