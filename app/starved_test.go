package app

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rs/zerolog"
)

// TestStarvedTimeoutsNotCountedAgainstRedis: with Redis healthy and this
// process short of CPU (busy goroutines, a 20ms budget), decisions time
// out, and the store breaker is told those timeouts are rategate's, not
// Redis's: its starved count grows. The breaker logic itself is
// TestBreakerStarvedTimeoutsDoNotOpen's.
func TestStarvedTimeoutsNotCountedAgainstRedis(t *testing.T) {
	srv := testredis.Start(t)
	cfg, err := config.Parse("t.yaml", []byte(`redis:
  url: redis://`+srv.Addr+`/0
  timeout: 20ms
rules:
  - name: per-user
    key: [user]
    algorithm: fixed_window
    limit: 1000
    period: 1m
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Redis.KeyPrefix = uniquePrefix(t)
	a, err := New(cfg, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	quit := make(chan struct{})
	var busy sync.WaitGroup
	for range 16 * runtime.GOMAXPROCS(0) {
		busy.Add(1)
		go func() {
			defer busy.Done()
			for {
				select {
				case <-quit:
					return
				default:
				}
				for i := 0; i < 1e6; i++ {
					_ = i * i
				}
			}
		}()
	}
	var callers sync.WaitGroup
	for c := range 32 {
		callers.Add(1)
		go func() {
			defer callers.Done()
			var d limits.Decision
			for i := 0; ; i++ {
				select {
				case <-quit:
					return
				default:
				}
				a.lag.Busy() // as the handler does for each /auth request
				req := limits.Request{User: []byte("u" + strconv.Itoa(c*1000+i)), IP: []byte("192.0.2.1")}
				// As the handler does: redis.timeout for the decision.
				ctx, cancel := context.WithTimeout(context.Background(), cfg.Redis.Timeout)
				_ = a.Limiter().Decide(ctx, &req, &d)
				cancel()
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.breaker.Starved() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	starved, lag := a.breaker.Starved(), a.lag.Recent()
	close(quit)
	busy.Wait()
	callers.Wait()
	if starved == 0 {
		t.Fatalf("no timeout was put down to a process short of CPU (lag %v, budget 20ms)", lag)
	}
	t.Logf("%d timeouts not counted against Redis; lag %v", starved, lag)
}
