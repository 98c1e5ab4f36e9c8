package app

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
)

// TestOverrideTTLEndsWhileRedisIsDown: a rule override's "ttl" ends it by
// itself, Redis or not. With Redis unreachable and failure_mode local, the
// local fallback decides with the rules in force; an override that raised
// the limit tenfold for a second kept applying after it (the expiry was
// applied only after a successful read of the overrides).
func TestOverrideTTLEndsWhileRedisIsDown(t *testing.T) {
	srv := testredis.StartControlled(t)
	cfg, err := config.Parse("test.yaml", []byte(`failure_mode: local
rules:
  - name: r
    key: [ip]
    algorithm: fixed_window
    limit: 2
    period: 1h
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Redis.KeyPrefix = uniquePrefix(t)
	cfg.Redis.URL = "redis://" + srv.Addr + "/0"
	cfg.Redis.Timeout = 200 * time.Millisecond
	a, err := New(cfg, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	s := &stack{t: t, app: a, rules: a.Rules(), limiter: a.Limiter(), top: a.Top(),
		auth: serveOn(t, a.Handler()), admin: serveOn(t, a.AdminHandler())}

	s.api("PUT", "/v1/rules/r/override", `{"factor":10,"reason":"sale","ttl":"1s"}`, 200, nil)
	if got := s.limiter.Rule("r").Limit; got != 20 {
		t.Fatalf("limit under the override %d, want 20", got)
	}
	srv.Kill() // Redis goes away while the override runs
	time.Sleep(2500 * time.Millisecond)

	if got := s.limiter.Rule("r").Limit; got != 2 {
		t.Errorf("1.5 s after the override's ttl ended, with Redis down, the limit in force is %d, want the file's 2", got)
	}
	admitted := 0
	for i := 0; i < 30; i++ {
		if code := s.ask("X-Original-URI", "/x", "X-Real-IP", "203.0.113.9"); code == 204 || code == 200 {
			admitted++
		}
	}
	if admitted > 2 {
		t.Errorf("failure_mode local after the override expired: %d of 30 admitted for one client, want at most the file's limit 2", admitted)
	}
}
