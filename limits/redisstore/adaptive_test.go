package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// TestAdaptiveLease: one holder at a time; the holder renews, the
// others are refused until the lease expires or is released; only the
// holder writes, so a leader that stalled past its lease cannot overwrite
// its successor. On a single Redis and on Redis Cluster (every key in one
// slot).
func TestAdaptiveLease(t *testing.T) {
	for _, topo := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"single", func(t *testing.T) redis.UniversalClient { return testredis.Start(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return sharedCluster.Get(t).Client(t) }},
	} {
		t.Run(topo.name, func(t *testing.T) {
			ctx := testredis.Ctx(t)
			prefix := fmt.Sprintf("lease%d", time.Now().UnixNano())
			s, err := NewAdaptive(topo.client(t), prefix)
			if err != nil {
				t.Fatal(err)
			}
			lead := func(who string, ttl time.Duration) bool {
				t.Helper()
				ok, err := s.Lead(ctx, "api", who, ttl)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			write := func(who, v string) bool {
				t.Helper()
				ok, err := s.Write(ctx, "api", who, v, true)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			const ttl = 300 * time.Millisecond

			if !lead("a", ttl) {
				t.Fatal("a could not take a free lease")
			}
			if lead("b", ttl) {
				t.Fatal("b took a's lease")
			}
			if !write("a", `{"factor":2}`) {
				t.Fatal("the holder could not write")
			}
			if write("b", `{"factor":0.1}`) {
				t.Fatal("b wrote without the lease")
			}
			// a renews for longer than the TTL: it keeps the lease.
			for i := 0; i < 4; i++ {
				time.Sleep(ttl / 2)
				if !lead("a", ttl) {
					t.Fatalf("a lost its lease while renewing it (round %d)", i)
				}
			}
			// a stops renewing (dies or stalls): b takes over once it expires.
			time.Sleep(ttl + 100*time.Millisecond)
			if !lead("b", ttl) {
				t.Fatal("b could not take the expired lease")
			}
			if write("a", `{"factor":9}`) {
				t.Fatal("a, waking up after its lease expired, overwrote b's decision")
			}
			if !write("b", `{"factor":0.5}`) {
				t.Fatal("the new holder could not write")
			}
			got, err := s.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got["api"] != `{"factor":0.5}` || len(got) != 1 {
				t.Errorf("records %q, want b's", got)
			}
			// Only the holder's release counts.
			if err := s.Release(ctx, "api", "a"); err != nil {
				t.Fatal(err)
			}
			if lead("a", ttl) {
				t.Fatal("a's release ended b's lease")
			}
			if err := s.Release(ctx, "api", "b"); err != nil {
				t.Fatal(err)
			}
			if !lead("a", ttl) {
				t.Fatal("a could not take a released lease")
			}
			if pttl, err := s.client.PTTL(ctx, s.LeaseKey("api")).Result(); err != nil || pttl <= 0 || pttl > ttl {
				t.Errorf("lease PTTL %v (%v), want within (0, %v]", pttl, err, ttl)
			}
		})
	}
}

// TestAdaptiveWatch: an announced write reaches another client's
// watch; a write without announcement does not.
func TestAdaptiveWatch(t *testing.T) {
	srv := testredis.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := NewAdaptive(srv.Client(t), "rg")
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewAdaptive(srv.Client(t), "rg")
	if err != nil {
		t.Fatal(err)
	}
	w := b.Watch(ctx)
	time.Sleep(100 * time.Millisecond) // SUBSCRIBE has reached Redis
	if ok, err := a.Lead(ctx, "api", "a", time.Second); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := a.Write(ctx, "api", "a", "{}", false); !ok || err != nil {
		t.Fatal(ok, err)
	}
	select {
	case <-w:
		t.Fatal("a write without announcement was announced")
	case <-time.After(200 * time.Millisecond):
	}
	if ok, err := a.Write(ctx, "api", "a", "{}", true); !ok || err != nil {
		t.Fatal(ok, err)
	}
	select {
	case <-w:
	case <-time.After(2 * time.Second):
		t.Fatal("the announcement did not arrive")
	}
}
