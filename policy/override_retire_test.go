package policy

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// TestRetireKeepsARenewedOverride: two instances share the overrides (one
// store, as the Redis hash is). A strict incident override (limit 1, ttl
// 1s) ends and an operator renews it on instance A at once (limit 1, ttl
// 1h). Instance B, whose last read came before the renewal, retires the
// expired override: it deleted whatever the rule's field held, the renewal
// with it, and every instance went back to the file's 100. An override is
// now retired only while the store still holds the expired value.
func TestRetireKeepsARenewedOverride(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte(`rules:
  - {name: r, key: [ip], algorithm: fixed_window, limit: 100, period: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	shared := NewMemoryOverrides()
	clock := time.Now()
	instance := func() *Manager {
		mem := memstore.New()
		t.Cleanup(func() { mem.Close() })
		l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: cfg.Rules})
		m := NewManager(ManagerOptions{Config: cfg, Limiter: l, Overrides: shared, Log: zerolog.Nop()})
		m.now = func() time.Time { return clock }
		return m
	}
	a, b := instance(), instance()
	ctx := context.Background()
	if _, err := a.SetOverride(ctx, "r", []byte(`{"limit":1,"reason":"incident","ttl":"1s"}`)); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(1500 * time.Millisecond) // the incident override has ended
	if _, err := a.SetOverride(ctx, "r", []byte(`{"limit":1,"reason":"incident, renewed","ttl":"1h"}`)); err != nil {
		t.Fatal(err)
	}
	b.retireExpired(ctx) // B's tick: it read the store just before the renewal
	for _, m := range []*Manager{a, b} {
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	raw, _ := shared.Load(ctx)
	if _, ok := raw["r"]; !ok {
		t.Errorf("the renewed override (limit 1, ttl 1h) is gone from the shared store: B's retirement of the expired one deleted it")
	}
	for name, m := range map[string]*Manager{"A": a, "B": b} {
		if got := m.limiter.Rule("r").Limit; got != 1 {
			t.Errorf("instance %s enforces limit %d, want the renewed override's 1", name, got)
		}
	}
}
