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

	// A restart keeps the ports, and waits for one taken for a moment.
	port, admin := rg.port, rg.adminPort
	rg.stop()
	held, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(admin))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		held.Close()
	}()
	before := bindFailures(filepath.Join(dir, "ports.log"))
	rg.start(t)
	if rg.port != port || rg.adminPort != admin {
		t.Fatalf("restarted on %d and %d, want %d and %d", rg.port, rg.adminPort, port, admin)
	}
	if bindFailures(filepath.Join(dir, "ports.log")) == before {
		t.Fatal("the restart found its admin port free: the test took it too late")
	}
}

// TestStartOnFreePortTriesAnother: a server that exits saying its port
// was taken is started again on another port, the log shared by every try
// read for what each try wrote; one that fails otherwise is not started
// again, however often the log said so before.
func TestStartOnFreePortTriesAnother(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "server.log")
	sh := func(script string) *proc {
		return startProc(t, "server", logPath, "/bin/sh", "-c", script)
	}
	var ports []int
	port, p := startOnFreePort(t, "server", logPath, 5*time.Second, func(port int) *proc {
		ports = append(ports, port)
		if len(ports) == 1 {
			return sh("echo 'listen tcp: bind: Address already in use' >&2; exit 1")
		}
		return sh("exec sleep 30")
	}, func(port int) error {
		if len(ports) < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	if len(ports) != 2 || port != ports[1] || p.exited() {
		t.Fatalf("ports tried %v, returned %d (exited %v): want a second try, its port, running", ports, port, p.exited())
	}
	p.stop()

	// The log holds a bind failure from above; this server fails for
	// another reason: tried once.
	tries := 0
	_, _, err := onFreePort(t, logPath, 5*time.Second, func(port int) *proc {
		tries++
		return sh("echo 'config: no such file' >&2; exit 1")
	}, func(int) error { return errors.New("not yet") })
	if err == nil || tries != 1 {
		t.Fatalf("a server that fails for another reason: error %v after %d tries, want one after 1", err, tries)
	}
}
