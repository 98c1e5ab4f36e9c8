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

// TestEarlierOverrideExpiresFirst: of two overrides with different ttls,
// the one that ends first stops applying at the first Sync after its end,
// not when the later one ends. (Sync skips unchanged overrides until the
// earliest expiry it tracks: tracking the latest kept the earlier override
// in force until its own retirement reached the store.)
func TestEarlierOverrideExpiresFirst(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte(`rules:
  - {name: a, match: {path: /a}, key: [user], algorithm: fixed_window, limit: 3, period: 1m}
  - {name: b, match: {path: /b}, key: [user], algorithm: fixed_window, limit: 3, period: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	mem := memstore.New()
	t.Cleanup(func() { mem.Close() })
	l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: cfg.Rules})
	store := NewMemoryOverrides()
	m := NewManager(ManagerOptions{Config: cfg, Limiter: l, Overrides: store, Log: zerolog.Nop()})
	clock := time.Now()
	m.now = func() time.Time { return clock }
	ctx := context.Background()
	for name, body := range map[string]string{"a": `{"limit":9,"ttl":"1s"}`, "b": `{"limit":9,"ttl":"1h"}`} {
		if _, err := m.SetOverride(ctx, name, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	limit := func(name string) int64 {
		for _, r := range m.View().Rules {
			if r.Name == name {
				return r.Effective.Limit
			}
		}
		t.Fatalf("no rule %s", name)
		return 0
	}
	if a, b := limit("a"), limit("b"); a != 9 || b != 9 {
		t.Fatalf("limits with both overrides: a %d, b %d, want 9 and 9", a, b)
	}
	// a has ended; its record is still in the store (nothing retired it)
	clock = clock.Add(2 * time.Second)
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if a, b := limit("a"), limit("b"); a != 3 || b != 9 {
		t.Errorf("2s on: a %d (its 1s override ended), b %d; want 3 and 9", a, b)
	}
}
