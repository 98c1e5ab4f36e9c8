package redisstore

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// TestDecisionRunsAtMostOnce: a decision whose connection dies after Redis
// ran its script (the reply is lost) must never be sent again: it may have
// committed, and a second run commits twice. A proxy cuts 10% of the
// connections right after Redis answered; every request goes to a key of
// its own with room to spare, so a key holding more than one unit was
// decided twice. On every topology of one Redis, with coalescing on and off.
func TestDecisionRunsAtMostOnce(t *testing.T) {
	for _, coalesce := range []bool{true, false} {
		t.Run(fmt.Sprintf("single/coalesce=%v", coalesce), func(t *testing.T) {
			srv := testredis.Start(t)
			px := proxies(t, srv.Addr)
			rs, err := Open(Options{URL: "redis://" + srv.Addr + "/0", Dialer: px.dial,
				Coalesce: CoalesceOptions{Disabled: !coalesce}})
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Close()
			runAtMostOnce(t, rs, px, func(key string) (int, error) {
				return fwCount(srv.Client(t), key)
			})
		})
	}
	t.Run("cluster", func(t *testing.T) {
		rs, px, cc := proxiedCluster(t)
		runAtMostOnce(t, rs, px, func(key string) (int, error) {
			return fwCount(cc, key)
		})
	})
	t.Run("sentinel", func(t *testing.T) {
		s := testredis.StartSentinel(t)
		primary, err := s.PrimaryAddr()
		if err != nil {
			t.Fatal(err)
		}
		px := proxies(t, primary)
		rs, err := Open(Options{SentinelMaster: s.Master, SentinelAddrs: s.Addrs(), Dialer: px.dial})
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		direct := s.Server(primary).Client(t)
		runAtMostOnce(t, rs, px, func(key string) (int, error) {
			return fwCount(direct, key)
		})
	})
}

// proxySet puts a fault-injecting proxy in front of each of some servers;
// dial goes through the proxy of an address that has one, straight to the
// others (sentinels, say).
type proxySet map[string]*testredis.Proxy

func proxies(t *testing.T, addrs ...string) proxySet {
	ps := proxySet{}
	for _, a := range addrs {
		ps[a] = testredis.StartProxy(t, a)
	}
	return ps
}

func (ps proxySet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if p := ps[addr]; p != nil {
		addr = p.Addr
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (ps proxySet) dropReplies(p float64) {
	for _, px := range ps {
		px.DropReplies(p)
	}
}

func (ps proxySet) dropped() (n int64) {
	for _, px := range ps {
		n += px.Dropped()
	}
	return n
}

// runAtMostOnce decides 500 requests on keys of their own while the
// proxies cut 10% of the connections after Redis answered, then checks
// with stored (a direct read, past the proxies) that no key holds more than
// one unit and that no more units are stored than requests that may have
// run.
func runAtMostOnce(t *testing.T, rs *Store, px proxySet, stored func(key string) (int, error)) {
	t.Helper()
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	key := func(i int) string { return "rg:{once:" + strconv.Itoa(i) + "}:fw" }
	px.dropReplies(0.10)
	const n = 500
	admitted, failed := 0, 0
	for i := range n {
		c := limits.Check{Key: key(i), Algorithm: limits.FixedWindow, Limit: 100, PeriodUS: storetest.SteadyPeriod(), Burst: 100, Cost: 1}
		var r [1]limits.Result
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		ok, err := rs.Decide(dctx, &limits.Batch{Checks: []limits.Check{c}}, r[:])
		cancel()
		switch {
		case err != nil:
			failed++
		case ok:
			admitted++
		}
	}
	px.dropReplies(0)
	total, twice := countUnits(t, n, key, stored)
	t.Logf("%d requests: %d admitted, %d failed (%d replies dropped); %d units stored, %d keys decided twice",
		n, admitted, failed, px.dropped(), total, twice)
	if px.dropped() == 0 {
		t.Fatal("the proxies dropped nothing: the test tested nothing")
	}
	if twice > 0 {
		t.Errorf("%d keys hold 2 or more units: a decision ran again after its reply was lost", twice)
	}
	if total > admitted+failed {
		t.Errorf("%d units stored for %d admitted and %d failed requests: more than one run per request", total, admitted, failed)
	}
}

// countUnits reads, with stored, the units of keys key(0) to key(n-1): the
// total, and how many keys hold more than one (a missing key holds none).
func countUnits(t *testing.T, n int, key func(int) string, stored func(key string) (int, error)) (total, twice int) {
	t.Helper()
	for i := range n {
		v, err := stored(key(i))
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		total += v
		if v > 1 {
			twice++
		}
	}
	return total, twice
}

// proxiedCluster empties the shared cluster and opens a store on it
// through a fault-injecting proxy per node; it returns the store (closed at
// cleanup), the proxies and a client that reaches the nodes directly.
func proxiedCluster(t *testing.T) (*Store, proxySet, *redis.ClusterClient) {
	t.Helper()
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	px := proxies(t, c.Addrs()...)
	rs, err := Open(Options{ClusterAddrs: c.Addrs(), Dialer: px.dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return rs, px, c.Client(t)
}
