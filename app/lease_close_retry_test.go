package app

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// TestCloseGivesBackReturnsAwaitingARetry: a leased key went idle while
// Redis was down, so its return failed and waits for the sweeper's next
// try; the instance no longer holds an entry for it. Close, right after
// Redis came back, skipped the return (it gave back only when entries
// were held, and the sweeper dropped a return whose try the shutdown
// cancelled), and the units stayed counted unspent until the window
// ended: another instance then found 3 of 100 spent plus the idle
// slice's units (95 left).
func TestCloseGivesBackReturnsAwaitingARetry(t *testing.T) {
	t.Run("closed just after Redis came back", func(t *testing.T) {
		closeAfterOutage(t, func(srv *testredis.Controlled, a *App) {
			srv.Restart(t)
			a.Close() // before the sweeper's next try
		})
	})
	// SIGTERM during a Redis restart: the returns wait for it, within
	// leaseReturnGrace.
	t.Run("closed while Redis is down, back within the grace", func(t *testing.T) {
		closeAfterOutage(t, func(srv *testredis.Controlled, a *App) {
			done := make(chan struct{})
			go func() {
				a.Close()
				close(done)
			}()
			time.Sleep(time.Second)
			srv.Restart(t)
			<-done
		})
	})
}

// closeAfterOutage spends 3 of acme's 100 on a leased rule, lets Redis go
// down (SAVEd first) until the key's idle return has failed, has closeApp
// restart Redis and close the App, and checks that another instance finds
// 97 left.
func closeAfterOutage(t *testing.T, closeApp func(*testredis.Controlled, *App)) {
	srv := testredis.StartControlled(t)
	yaml := `rules:
  - name: per-user
    key: [user]
    algorithm: fixed_window
    limit: 100
    period: 1h
    lease: true
`
	prefix := uniquePrefix(t)
	open := func() *App {
		cfg, err := config.Parse("test.yaml", []byte(steadyHours(yaml)))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Redis.KeyPrefix = prefix
		cfg.Redis.URL = "redis://" + srv.Addr + "/0"
		cfg.Redis.Timeout = 200 * time.Millisecond
		a, err := New(cfg, Options{Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	decide := func(a *App) bool {
		var d limits.Decision
		if err := a.Limiter().Decide(context.Background(), &limits.Request{User: []byte("acme")}, &d); err != nil {
			t.Fatal(err)
		}
		return d.Admitted
	}

	a := open()
	closed := false
	defer func() {
		if !closed {
			a.Close()
		}
	}()
	const used = 3
	for i := range used {
		if !decide(a) {
			t.Fatalf("request %d of acme was denied", i)
		}
	}
	if _, held := a.Limiter().LeasesHeld(); held == 0 {
		t.Fatal("the instance holds no leased units after 3 requests: nothing to give back, the test proves nothing")
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	err := client.Save(context.Background()).Err()
	client.Close()
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	// The key goes idle (0.5 s); its return is tried and refused, and waits.
	time.Sleep(1500 * time.Millisecond)
	if keys, _ := a.Limiter().LeasesHeld(); keys != 0 {
		t.Fatalf("the idle key still has an entry (%d keys held): the return was not queued", keys)
	}
	closeApp(srv, a)
	closed = true

	b := open()
	defer b.Close()
	left := 0
	for range 200 {
		if !decide(b) {
			break
		}
		left++
	}
	st := a.Limiter().LeaseStats()[0]
	if left != 100-used {
		t.Errorf("another instance found %d of 100 left, want %d (%d used): the first instance's idle slice was not given back at Close (returned %d, wasted %d, returns failed %d)",
			left, 100-used, used, st.Returned, st.Wasted, st.ReturnsFailed)
	}
}
