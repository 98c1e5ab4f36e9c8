package testredis

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Controlled is a redis-server a fault-injection test can kill, freeze,
// thaw and start again on the same port and in the same directory, so
// clients keep their address across the outage. It is safe for concurrent
// use.
type Controlled struct {
	Addr string
	Port int
	Dir  string

	bin   string
	extra []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// StartControlled runs redis-server like Start (loopback, no automatic
// saves, no AOF) and registers its end with t.Cleanup. A file dump.rdb in
// Dir, written by SAVE, is loaded again by Restart: that is how a test
// restarts Redis "with data"; RestartEmpty removes it first.
func StartControlled(t testing.TB, extra ...string) *Controlled {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found in PATH: %s", InstallHint)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		c := &Controlled{Port: FreePort(t), Dir: t.TempDir(), bin: bin, extra: extra}
		c.Addr = "127.0.0.1:" + strconv.Itoa(c.Port)
		if lastErr = c.start(); lastErr == nil {
			t.Cleanup(c.Kill)
			return c
		}
		c.Kill()
	}
	t.Fatalf("redis-server did not become ready: %v", lastErr)
	return nil
}

// start runs the server and waits until it answers PING.
func (c *Controlled) start() error {
	args := []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(c.Port),
		"--save", "", "--appendonly", "no", "--dir", c.Dir, "--dbfilename", "dump.rdb",
		"--daemonize", "no", "--logfile", filepath.Join(c.Dir, "redis.log")}
	for _, e := range c.extra {
		args = append(args, "--"+e)
	}
	cmd := exec.Command(c.bin, args...)
	// Die with the test binary even if it is killed before its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	return waitReady(c.Addr, 5*time.Second)
}

// Pid returns the server's process id, or 0 when it is not running.
func (c *Controlled) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Kill sends SIGKILL and waits for the process: the crash case. Clients see
// their connections reset and new ones refused. Killing a stopped server
// is fine.
func (c *Controlled) Kill() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.cmd, c.done = nil, nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// Freeze sends SIGSTOP: the server keeps its port and the kernel still
// accepts connections, but nothing is ever answered until Thaw.
func (c *Controlled) Freeze() { c.signal(syscall.SIGSTOP) }

// Thaw sends SIGCONT to a frozen server.
func (c *Controlled) Thaw() { c.signal(syscall.SIGCONT) }

func (c *Controlled) signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		_ = c.cmd.Process.Signal(sig)
	}
}

// Restart starts the server again on the same port and directory after
// Kill; it loads dump.rdb when a SAVE left one. It fails the test if the
// server does not come up.
func (c *Controlled) Restart(t testing.TB) {
	t.Helper()
	c.Kill()
	var err error
	// The port was ours a moment ago; a retry covers the rare moment the
	// kernel has not released it yet.
	for attempt := 0; attempt < 5; attempt++ {
		if err = c.start(); err == nil {
			return
		}
		c.Kill()
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("redis-server did not restart on %s: %v\n%s", c.Addr, err, c.Log())
}

// RestartEmpty is Restart without the data: the dump file is removed, so
// the server starts with no keys and no scripts.
func (c *Controlled) RestartEmpty(t testing.TB) {
	t.Helper()
	c.Kill()
	if err := removeIfExists(filepath.Join(c.Dir, "dump.rdb")); err != nil {
		t.Fatalf("remove dump.rdb: %v", err)
	}
	c.Restart(t)
}

// Log returns the server's log, for failure messages.
func (c *Controlled) Log() string {
	return (&Server{Dir: c.Dir}).Log()
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
