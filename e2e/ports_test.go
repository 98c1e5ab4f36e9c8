//go:build e2e

package e2e

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

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

// TestStartOnFreePortTriesAnother: a server that exits saying its port
// was taken is started again on another port.
func TestStartOnFreePortTriesAnother(t *testing.T) {
	dir := t.TempDir()
	sh := func(name, script string) *proc {
		return startProc(t, name, filepath.Join(dir, name+".log"), "/bin/sh", "-c", script)
	}
	var ports []int
	port, p := startOnFreePort(t, "server", 5*time.Second, func(port int) *proc {
		ports = append(ports, port)
		if len(ports) == 1 {
			return sh("taken", "echo 'listen tcp: bind: Address already in use' >&2; exit 1")
		}
		return sh("serving", "exec sleep 30")
	}, func(port int) error {
		if len(ports) < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	if len(ports) != 2 || port != ports[1] || p.exited() {
		t.Fatalf("ports tried %v, returned %d (exited %v): want a second try, its port, running", ports, port, p.exited())
	}
}
