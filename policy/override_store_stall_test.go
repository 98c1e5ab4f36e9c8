package policy

import (
	"context"
	"testing"
	"time"

	"github.com/rategate/rategate/config"
)

// stallingOverrides is an OverrideStore whose Set waits until release is
// closed (Redis stalled: the admin call waits out its 2 s timeout).
type stallingOverrides struct {
	OverrideStore
	entered chan struct{}
	release chan struct{}
}

func (s *stallingOverrides) Set(ctx context.Context, rule, value string) error {
	close(s.entered)
	<-s.release
	return s.OverrideStore.Set(ctx, rule, value)
}

// TestOverrideStoreCallDoesNotHoldTheManager: SetOverride held the
// manager's lock across its store call. With Redis stalled, each PUT
// /v1/rules/{name}/override held it for the admin timeout (2 s), and
// everything else that takes it waited: every /metrics scrape (the
// adaptive gauges read AdaptiveStatuses), every reload (SetFile), the
// periodic sync, the expiry of other overrides. Measured on a running
// rategate with Redis stopped: /metrics and POST /v1/reload took 1.8 s
// behind one PUT, and N queued PUTs held them N x 2 s, past Prometheus's
// scrape timeout during the incident the overrides were for.
func TestOverrideStoreCallDoesNotHoldTheManager(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte(`rules:
  - {name: a, match: {path: /a}, key: [user], algorithm: fixed_window, limit: 3, period: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	store := &stallingOverrides{OverrideStore: NewMemoryOverrides(), entered: make(chan struct{}), release: make(chan struct{})}
	in := newInstance(t, cfg, store, nil, "solo", nil)
	m, l := in.m, in.lim

	done := make(chan error, 1)
	go func() {
		_, err := m.SetOverride(context.Background(), "a", []byte(`{"limit":2}`))
		done <- err
	}()
	<-store.entered
	defer func() {
		close(store.release)
		if err := <-done; err != nil {
			t.Errorf("SetOverride: %v", err)
		}
		if got := l.Rule("a").Limit; got != 2 {
			t.Errorf("limit after the override: %d, want 2", got)
		}
	}()

	for _, c := range []struct {
		what string
		f    func()
	}{
		{"AdaptiveStatuses (a /metrics scrape)", func() { m.AdaptiveStatuses() }},
		{"SetFile (a reload)", func() { m.SetFile(cfg.Rules, "t.yaml") }},
	} {
		ret := make(chan struct{})
		go func() { c.f(); close(ret) }()
		select {
		case <-ret:
		case <-time.After(500 * time.Millisecond):
			t.Errorf("%s waited for the override's store call", c.what)
			return // the deferred release lets it finish
		}
	}
}
