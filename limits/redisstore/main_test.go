package redisstore

import (
	"os"
	"testing"

	"github.com/rategate/rategate/internal/testredis"
)

// TestMain stops the Redis Cluster the package's tests share (started by the
// first test that needs it) once every test has run. Its servers also die
// with the test binary if it is killed.
func TestMain(m *testing.M) {
	code := m.Run()
	sharedCluster.Stop()
	os.Exit(code)
}

// sharedCluster serves every test that only decides.
var sharedCluster testredis.Shared
