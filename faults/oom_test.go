package faults

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"
	"github.com/rategate/rategate/limits/storetest"
)

// TestFullRedisIsNotAPass: a Redis run with maxmemory and noeviction that
// has filled up refuses every decision (OOM), and a client can fill it:
// each new route or address of a rule keyed on one is a new key. Redis
// still answers, so that must not open the breaker and hand every request
// to failure_mode (allow, by default): the decisions are the local
// fallback's, under the same limits, while Redis is full, and Redis's
// again once it has room.
func TestFullRedisIsNotAPass(t *testing.T) {
	rs := testredis.Start(t, "maxmemory-policy noeviction")
	ctx := testredis.Ctx(t)
	client := redis.NewClient(&redis.Options{Addr: rs.Addr, ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redisstore.New(client, "redis "+rs.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	b := limits.NewBreaker(store.Ping, store.Name(), limits.BreakerOptions{ProbeTimeout: budget, IsFailure: redisstore.IsStoreFailure})
	defer b.Close()
	local := memstore.NewSweeping(time.Hour)
	defer local.Close()
	rule := &limits.Rule{Name: "per-ip", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.FixedWindow,
		Limit: 3, Period: storetest.SteadyDuration(), Burst: 3, Cost: 1}
	l := limits.New(limits.Options{Store: store, Breaker: b, Prefix: "rg", Rules: []*limits.Rule{rule},
		Fallback: local, LocalShare: 1, FailureMode: limits.FailAllow})

	// decide asks for n requests from ip and returns how many were
	// admitted and how many the local fallback decided.
	decide := func(ip string, n int) (admitted, byLocal int) {
		t.Helper()
		for range n {
			var d limits.Decision
			_ = l.Decide(ctx, &limits.Request{IP: []byte(ip)}, &d)
			if d.Undecided {
				t.Fatalf("%s: a decision was left to failure_mode (%v)", ip, d.Err)
			}
			if d.Admitted {
				admitted++
			}
			if d.Local {
				byLocal++
			}
		}
		return admitted, byLocal
	}

	if a, loc := decide("192.0.2.1", 2); a != 2 || loc != 0 {
		t.Fatalf("before: %d admitted, %d by the fallback; want 2 by Redis", a, loc)
	}
	// Full: used memory is above 1 byte from now on.
	if err := client.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	// Over several budgets: failures that span at least one open a
	// breaker that takes them for an outage.
	for i := range 20 {
		time.Sleep(budget / 5)
		ip := "198.51.100." + strconv.Itoa(i+1)
		if a, loc := decide(ip, 5); a != 3 || loc != 5 {
			t.Fatalf("Redis full, %s: %d of 5 admitted (%d by the fallback); want 3 of 5, all by the fallback", ip, a, loc)
		}
	}
	if s := b.State(); s != limits.BreakerClosed {
		t.Fatalf("a full Redis opened the breaker (%s): failure_mode would answer every request", s)
	}
	if err := client.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// Room again: Redis decides, with what it counted before it was full.
	if a, loc := decide("192.0.2.1", 2); a != 1 || loc != 0 {
		t.Fatalf("after: %d admitted, %d by the fallback; want 1 (the 3rd of 3) by Redis", a, loc)
	}
}
