package testredis

import (
	"os"
	"sync"
	"testing"
)

// Shared is one real Redis Cluster for every test of a package that only
// decides (starting one takes about 2 s); tests that kill nodes start their
// own. Declare one as a package variable, call Get in tests and Stop from
// TestMain after m.Run. Its servers also die with the test binary if it is
// killed.
type Shared struct {
	once sync.Once
	c    *Cluster
	dirs []string
	err  error
}

// Get returns the shared cluster, starting it on first use.
func (sc *Shared) Get(t testing.TB) *Cluster {
	t.Helper()
	sc.once.Do(func() {
		sc.c, sc.err = NewCluster(func() string {
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

// Stop stops the cluster if it was started and removes its directories.
func (sc *Shared) Stop() {
	if sc.c != nil {
		sc.c.Stop()
	}
	for _, d := range sc.dirs {
		if d != os.TempDir() {
			os.RemoveAll(d)
		}
	}
}
