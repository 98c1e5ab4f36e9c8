package limits

import (
	"context"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// STStore is one store plus the test-only views the conformance
// suite needs: a controllable clock for peeks and the remaining TTL of a key.
type STStore struct {
	Name   string
	Store  Store
	PeekAt func(c Check, nowUS int64) (Result, error)
	TTL    func(key string) (time.Duration, bool)
}

// STForEach runs fn once against a fresh memory store, once against a
// fresh real redis-server and once against a real Redis Cluster (emptied).
func STForEach(t *testing.T, fn func(t *testing.T, s STStore)) {
	t.Run("memory", func(t *testing.T) {
		m := MSNewSweep(50 * time.Millisecond)
		t.Cleanup(func() { m.Close() })
		fn(t, STStore{
			Name: "memory", Store: m,
			PeekAt: m.PeekAt,
			TTL:    m.TTL,
		})
	})
	t.Run("redis", func(t *testing.T) {
		srv := testredis.Start(t)
		client := srv.Client(t)
		rs, err := NewRedisStore(client, "redis "+srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		fn(t, STStore{
			Name: "redis", Store: rs,
			PeekAt: func(c Check, now int64) (Result, error) {
				return rs.PeekAt(context.Background(), c, now)
			},
			TTL: func(key string) (time.Duration, bool) {
				d, err := client.PTTL(context.Background(), key).Result()
				if err != nil || d < 0 {
					return 0, false
				}
				return d, true
			},
		})
	})
	t.Run("redis-cluster", func(t *testing.T) { fn(t, clusterStoreUnderTest(t)) })
}

// STWindowStart returns the start of the current epoch-aligned window of
// length p, in µs: timelines start there so TTLs relative to the fake clock
// stay close to Redis's own clock.
func STWindowStart(p time.Duration) int64 {
	pu := PeriodUS(p)
	return time.Now().UnixMicro() / pu * pu
}

func STDecideOne(t *testing.T, s Store, c Check, now int64) Result {
	t.Helper()
	var r [1]Result
	admitted, err := s.Decide(context.Background(), &Batch{Checks: []Check{c}, NowUS: now}, r[:])
	if err != nil {
		t.Fatalf("decide: %v", err)
	}
	if admitted != r[0].Allowed && !c.Shadow {
		t.Fatalf("admitted=%v but rule allowed=%v", admitted, r[0].Allowed)
	}
	return r[0]
}

// STStep is one request of a timeline: advance the clock, send cost, expect.
type STStep struct {
	advance       time.Duration
	cost          int64
	wantAllowed   bool
	wantRemaining int64
	wantRetry     time.Duration // -1µs = NeverFits
	wantReset     time.Duration
}

const STNeverFits = time.Duration(NeverFits) * time.Microsecond

func STRunTimeline(t *testing.T, s Store, c Check, start int64, steps []STStep) {
	t.Helper()
	now := start
	for i, st := range steps {
		now += int64(st.advance / time.Microsecond)
		c.Cost = st.cost
		r := STDecideOne(t, s, c, now)
		got := STStep{advance: st.advance, cost: st.cost, wantAllowed: r.Allowed, wantRemaining: r.Remaining,
			wantRetry: time.Duration(r.RetryUS) * time.Microsecond, wantReset: time.Duration(r.ResetUS) * time.Microsecond}
		if got != st {
			t.Fatalf("step %d (t=+%v): got %+v\nwant %+v", i, time.Duration(now-start)*time.Microsecond, got, st)
		}
	}
}

// STConcurrencyPeriod is long enough that a test never crosses a window
// boundary or sees a refill while it runs.
const STConcurrencyPeriod = 100 * 24 * time.Hour

// clusterStoreUnderTest is forEachStore's Redis Cluster arm: a fresh store
// over the shared cluster, emptied first, opened the way main opens it.
func clusterStoreUnderTest(t *testing.T) STStore {
	t.Helper()
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs, err := OpenRedis(RedisOptions{ClusterAddrs: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	client := rs.Client()
	return STStore{
		Name: "redis-cluster", Store: rs,
		PeekAt: func(c Check, now int64) (Result, error) {
			return rs.PeekAt(context.Background(), c, now)
		},
		TTL: func(key string) (time.Duration, bool) {
			d, err := client.PTTL(context.Background(), key).Result()
			if err != nil || d < 0 {
				return 0, false
			}
			return d, true
		},
	}
}
