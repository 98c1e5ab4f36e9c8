//go:build e2e

package e2e

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/rategate/rategate/internal/testredis"
)

// TestRategateStartsAgainOnFreePorts: the ports a rategate is given were
// free when picked, but another process may bind one before rategate does
// (a CI run failed TestAuthLayer so: "listen for the admin API on
// 127.0.0.1:44025: bind: address already in use"). A first start then
// tries other ports; a restart keeps its ports (NGINX was given them) and
// waits for them.
func TestRategateStartsAgainOnFreePorts(t *testing.T) {
	redis := testredis.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(cfg, []byte(policy(429, "ports", "", `    - name: r
      match: {path: /}
      key: [ip]
      algorithm: fixed_window
      limit: 10
      period: 24h
`)), 0o644); err != nil {
		t.Fatal(err)
	}
	rg := newRategate(t, "ports", dir, cfg, "redis://"+redis.Addr+"/0")
	taken, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(rg.adminPort))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	was := rg.adminPort
	rg.start(t)
	if rg.adminPort == was {
		t.Fatalf("started with the admin port %d taken", was)
	}

	// A restart keeps the ports.
	port, admin := rg.port, rg.adminPort
	rg.stop()
	rg.start(t)
	if rg.port != port || rg.adminPort != admin {
		t.Fatalf("restarted on %d and %d, want %d and %d", rg.port, rg.adminPort, port, admin)
	}
}
