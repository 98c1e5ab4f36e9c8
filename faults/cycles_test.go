package faults

import (
	"context"
	"errors"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/limits/redisstore"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// TestOutageCyclesLeakNothing takes the Redis store through 100 outages
// behind the breaker, in this process so every goroutine and descriptor can
// be counted: odd cycles kill Redis and restart it empty, even ones freeze
// and thaw it. Each cycle fails decisions until the breaker opens, repairs
// Redis and decides until the breaker has closed again. Afterwards the
// goroutines are back to their baseline, the connection pool holds no more
// than its size, Redis sees no more clients than that, and the process no
// more descriptors.
func TestOutageCyclesLeakNothing(t *testing.T) {
	rs := testredis.StartControlled(t)
	// The client as main.go builds it: go-redis defaults, context deadlines.
	client := redis.NewClient(&redis.Options{Addr: rs.Addr, ContextTimeoutEnabled: true})
	store, err := redisstore.New(client, "redis "+rs.Addr)
	if err != nil {
		t.Fatal(err)
	}
	var transitions sync.Map // "from>to" → *int (counted under the breaker's lock)
	b := limits.NewBreaker(store.Ping, store.Name(), limits.BreakerOptions{
		IsFailure:     redisstore.IsStoreFailure,
		ProbeInterval: 10 * time.Millisecond, ProbeTimeout: budget,
		OnStateChange: func(from, to limits.BreakerState) {
			n, _ := transitions.LoadOrStore(from.String()+">"+to.String(), new(int))
			*n.(*int)++
		},
	})
	poolSize := client.Options().PoolSize

	rule := &limits.Rule{Name: "c", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.GCRA,
		Limit: 1e9, Period: time.Hour, Burst: 1e9, Cost: 1}
	l := limits.New(limits.Options{Store: store, Breaker: b, Prefix: "rg", Rules: []*limits.Rule{rule}})
	// decide runs 4 decisions at once (so the pool holds several
	// connections), each with the decision budget, and returns the
	// first error.
	decide := func() error {
		errs := make(chan error, 4)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), budget)
				defer cancel()
				var d limits.Decision
				errs <- l.Decide(ctx, &limits.Request{IP: []byte{'1', '0', '.', byte('0' + i)}}, &d)
			})
		}
		wg.Wait()
		close(errs)
		var first error
		for err := range errs {
			if first == nil {
				first = err
			}
		}
		return first
	}
	if err := decide(); err != nil {
		t.Fatal(err)
	}
	baseGoroutines, baseFDs := runtime.NumGoroutine(), openFDs(t)

	const cycles = 100
	start := time.Now()
	var worstRecovery time.Duration
	for cycle := range cycles {
		kill := cycle%2 == 1
		if kill {
			rs.Kill()
		} else {
			rs.Freeze()
		}
		for i := 0; b.State() != limits.BreakerOpen; i++ {
			if i == 20 {
				t.Fatalf("cycle %d: breaker still %s after 20 failed rounds of decisions", cycle, b.State())
			}
			if err := decide(); err == nil {
				t.Fatalf("cycle %d: a decision succeeded with Redis down", cycle)
			}
		}
		if err := decide(); !errors.Is(err, limits.ErrBreakerOpen) {
			t.Fatalf("cycle %d: open breaker returned %v", cycle, err)
		}
		repaired := time.Now()
		if kill {
			rs.RestartEmpty(t)
		} else {
			rs.Thaw()
		}
		for decide() != nil || b.State() != limits.BreakerClosed {
			if time.Since(repaired) > 5*time.Second {
				t.Fatalf("cycle %d: Redis back for 5s, breaker still %s", cycle, b.State())
			}
			time.Sleep(5 * time.Millisecond)
		}
		worstRecovery = max(worstRecovery, time.Since(repaired))
	}
	elapsed := time.Since(start)

	// Let the connections closed on the last outage finish closing.
	var goroutines, fds, clients int
	deadline := time.Now().Add(3 * time.Second)
	for {
		goroutines, fds, clients = runtime.NumGoroutine(), openFDs(t), redisClients(t, rs.Addr)
		if goroutines <= baseGoroutines+1 && fds <= baseFDs+poolSize && clients <= poolSize || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	counts := map[string]int{}
	transitions.Range(func(k, v any) bool { counts[k.(string)] = *v.(*int); return true })
	t.Logf("%d outages in %v (slowest recovery %v): transitions %v; goroutines %d -> %d, fds %d -> %d, Redis clients %d (pool size %d)",
		cycles, elapsed.Round(time.Millisecond), worstRecovery.Round(time.Millisecond), counts, baseGoroutines, goroutines, baseFDs, fds, clients, poolSize)
	if counts["closed>open"] != cycles || counts["half_open>closed"] != cycles {
		t.Errorf("transitions %v: want %d openings and %d closings", counts, cycles, cycles)
	}
	if goroutines > baseGoroutines+1 {
		t.Errorf("%d goroutines after %d outages, %d before", goroutines, cycles, baseGoroutines)
	}
	if fds > baseFDs+poolSize {
		t.Errorf("%d open descriptors after %d outages, %d before (pool size %d)", fds, cycles, baseFDs, poolSize)
	}
	if clients > poolSize {
		t.Errorf("Redis has %d clients, more than the pool size %d", clients, poolSize)
	}

	// Closing the breaker and the store closes everything they started.
	b.Close()
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > baseGoroutines && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > baseGoroutines {
		t.Errorf("%d goroutines after Close, %d while running", n, baseGoroutines)
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
