package limits_test

import (
	"os"
	"testing"

	"github.com/rategate/rategate/internal/testredis"
)

// sharedCluster is the Redis Cluster of the tests that run the limiter on
// one (started by the first of them), stopped when every test has run.
var sharedCluster testredis.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	sharedCluster.Stop()
	os.Exit(code)
}
