package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// TestRedisIdentities: on a real Redis, every change bumps the counter by
// one and is announced with it, in order; a full read returns what is
// stored with the counter read before; the cap refuses a new identity but
// not a change of a stored one; a conditional delete removes only the
// value it names.
func TestRedisIdentities(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		srv := testredis.Start(t)
		client := srv.Client(t)
		testRedisIdentities(t, client, func() error { return client.FlushAll(context.Background()).Err() })
	})
	t.Run("redis-cluster", func(t *testing.T) {
		c := sharedCluster.Get(t)
		if err := c.FlushAll(); err != nil {
			t.Fatal(err)
		}
		rs, err := Open(Options{ClusterAddrs: c.Addrs()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		testRedisIdentities(t, rs.Client(), c.FlushAll)
	})
}

func testRedisIdentities(t *testing.T, client redis.UniversalClient, flushAll func() error) {
	s := NewIdentities(client, "tid")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events := s.Watch(ctx)
	select {
	case c := <-events:
		if !c.Resync {
			t.Fatalf("first event %+v, want the subscription's Resync", c)
		}
	case <-ctx.Done():
		t.Fatal("no subscription")
	}
	expect := func(v uint64, rule, id, value string) {
		t.Helper()
		select {
		case c := <-events:
			if c != (limits.IdentityChange{Version: v, Rule: rule, ID: id, Value: value}) {
				t.Fatalf("heard %+v, want version %d %s %s %q", c, v, rule, id, value)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("version %d not announced", v)
		}
	}
	if v, _ := s.Version(ctx); v != 0 {
		t.Fatalf("fresh counter %d", v)
	}
	for i, c := range []struct{ rule, id, value string }{
		{"api", "acme", `{"limit":5}`},
		{"api", "a%20b|/x", `{"exempt":true}`},
		{"login", "203.0.113.7", `{"block":true}`},
	} {
		v, err := s.Set(ctx, c.rule, c.id, c.value, 3)
		if err != nil || v != uint64(i+1) {
			t.Fatalf("set %d: version %d, %v", i, v, err)
		}
		expect(v, c.rule, c.id, c.value)
	}
	// Full: a new identity is refused, a stored one may change.
	var capErr *limits.IdentityCapError
	if _, err := s.Set(ctx, "api", "newcomer", `{"limit":1}`, 3); !errors.As(err, &capErr) || capErr.Max != 3 {
		t.Fatalf("fourth identity with max 3: %v", err)
	}
	if v, err := s.Set(ctx, "api", "acme", `{"limit":6}`, 3); err != nil || v != 4 {
		t.Fatalf("change of a stored one at the cap: %d %v", v, err)
	}
	expect(4, "api", "acme", `{"limit":6}`)
	// The same value again changes nothing and announces nothing.
	if v, err := s.Set(ctx, "api", "acme", `{"limit":6}`, 3); err != nil || v != 4 {
		t.Fatalf("same value: %d %v", v, err)
	}
	v, all, err := s.Load(ctx)
	if err != nil || v != 4 || len(all) != 2 || all["api"]["acme"] != `{"limit":6}` || all["api"]["a%20b|/x"] != `{"exempt":true}` || all["login"]["203.0.113.7"] != `{"block":true}` {
		t.Fatalf("load: %d %v %v", v, all, err)
	}
	// A conditional delete of a value no longer stored removes nothing.
	if _, changed, err := s.Delete(ctx, "api", "acme", `{"limit":5}`); err != nil || changed {
		t.Fatalf("stale conditional delete: changed=%v %v", changed, err)
	}
	if v, changed, err := s.Delete(ctx, "api", "acme", `{"limit":6}`); err != nil || !changed || v != 5 {
		t.Fatalf("conditional delete: %d %v %v", v, changed, err)
	}
	expect(5, "api", "acme", "")
	if _, changed, _ := s.Delete(ctx, "api", "acme", ""); changed {
		t.Fatal("deleting a missing identity changed something")
	}
	// A larger table is read in HSCAN steps, whole.
	for i := 0; i < 2500; i++ {
		if _, err := s.Set(ctx, "bulk", fmt.Sprint(i), "x", 10_000); err != nil {
			t.Fatal(err)
		}
	}
	v, all, err = s.Load(ctx)
	if err != nil || v != 2505 || len(all["bulk"]) != 2500 {
		t.Fatalf("load of 2502: version %d, %d bulk, %v", v, len(all["bulk"]), err)
	}
	// Redis losing its data resets the counter: a listener sees it go back.
	if err := flushAll(); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Version(ctx); v != 0 {
		t.Fatalf("counter after FLUSHALL %d", v)
	}
}

// TestParseIdentityChange: announcements that are not well formed are
// ignored (a gap in the versions then shows what was missed).
func TestParseIdentityChange(t *testing.T) {
	for _, p := range []string{"", "1", "1\napi", "x\napi acme\n{}", "1\napiacme\n{}"} {
		if c, ok := parseIdentityChange(p); ok {
			t.Errorf("%q parsed as %+v", p, c)
		}
	}
	if c, ok := parseIdentityChange("7\napi a b\n{\"x\":\"1\\n2\"}"); !ok || c.Version != 7 || c.Rule != "api" || c.ID != "a b" || c.Value != `{"x":"1\n2"}` {
		t.Errorf("parsed %+v %v", c, ok)
	}
}
