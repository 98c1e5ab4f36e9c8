package limits

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// TestMain stops the Redis Cluster the package's tests share (started by the
// first test that needs it) once every test has run. Its servers also die
// with the test binary if it is killed.
func TestMain(m *testing.M) {
	code := m.Run()
	sharedCluster.stop()
	os.Exit(code)
}

// clusterOnce is a real Redis Cluster for every test that only decides
// (starting one takes about 2 s); tests that kill nodes start their own.
type clusterOnce struct {
	once sync.Once
	c    *testredis.Cluster
	dirs []string
	err  error
}

var sharedCluster clusterOnce

// get returns the shared cluster, starting it on first use.
func (sc *clusterOnce) get(t *testing.T) *testredis.Cluster {
	t.Helper()
	sc.once.Do(func() {
		sc.c, sc.err = testredis.NewCluster(func() string {
			d, err := os.MkdirTemp("", "rategate-cluster-")
			if err != nil {
				d = os.TempDir()
			}
			sc.dirs = append(sc.dirs, d)
			return d
		})
	})
	if sc.err != nil {
		t.Fatal(sc.err)
	}
	return sc.c
}

func (sc *clusterOnce) stop() {
	if sc.c != nil {
		sc.c.Stop()
	}
	for _, d := range sc.dirs {
		if d != os.TempDir() {
			os.RemoveAll(d)
		}
	}
}

// clusterStoreUnderTest is forEachStore's Redis Cluster arm: a fresh store
// over the shared cluster, emptied first, opened the way main opens it.
func clusterStoreUnderTest(t *testing.T) storeUnderTest {
	t.Helper()
	c := sharedCluster.get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs, err := OpenRedis(RedisOptions{ClusterAddrs: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	client := rs.Client()
	return storeUnderTest{
		name: "redis-cluster", store: rs,
		peekAt: func(c Check, now int64) (Result, error) {
			return rs.PeekAt(context.Background(), c, now)
		},
		ttl: func(key string) (time.Duration, bool) {
			d, err := client.PTTL(context.Background(), key).Result()
			if err != nil || d < 0 {
				return 0, false
			}
			return d, true
		},
	}
}
