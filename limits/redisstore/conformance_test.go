package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

// TestConformance runs the store conformance suite on every way rategate
// reaches Redis: one server with decisions coalesced into pipelines and
// with coalescing off, a Sentinel deployment, and a Redis Cluster. Each arm
// starts its servers once; every case gets a fresh store over emptied data.
func TestConformance(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := testredis.Start(t)
		storetest.Run(t, suiteArm("redis", Options{URL: "redis://" + srv.Addr}, nil))
	})
	t.Run("single-uncoalesced", func(t *testing.T) {
		srv := testredis.Start(t)
		storetest.Run(t, suiteArm("redis-uncoalesced", Options{URL: "redis://" + srv.Addr, Coalesce: CoalesceOptions{Disabled: true}}, nil))
	})
	t.Run("sentinel", func(t *testing.T) {
		s := testredis.StartSentinel(t)
		storetest.Run(t, suiteArm("redis-sentinel", Options{SentinelMaster: s.Master, SentinelAddrs: s.Addrs()}, nil))
	})
	t.Run("cluster", func(t *testing.T) {
		c := sharedCluster.Get(t)
		storetest.Run(t, suiteArm("redis-cluster", Options{ClusterAddrs: c.Addrs()}, c.FlushAll))
	})
}

// suiteArm returns the suite's store opener for o: the data emptied (by
// flush, or FLUSHALL through the store's client), then a store opened the
// way rategate opens one, closed at the case's cleanup.
func suiteArm(name string, o Options, flush func() error) func(t *testing.T) storetest.Store {
	return func(t *testing.T) storetest.Store {
		t.Helper()
		rs, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		client := rs.Client()
		empty := flush
		if empty == nil {
			empty = func() error { return client.FlushAll(context.Background()).Err() }
		}
		if err := empty(); err != nil {
			t.Fatalf("empty %s: %v", name, err)
		}
		return storetest.Store{
			Name: name, Store: rs, Raw: rs.Raw,
			PeekAt: func(c limits.Check, now int64) (limits.Result, error) {
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
}
