// Package testredis starts a real redis-server on a free loopback port for
// tests and stops it when the test ends. A missing binary fails the test with
// the command that installs it; it never skips.
package testredis

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// InstallHint is the command that provides the binaries tests need.
const InstallHint = "apt-get update && apt-get install -y redis-server (or run `make test`, which installs it)"

// Server is one running redis-server (or redis-sentinel).
type Server struct {
	Addr string
	Port int
	Dir  string
	cmd  *exec.Cmd
	// bin and args start it again (Restart).
	bin  string
	args []string
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs redis-server on 127.0.0.1 with no persistence and registers its
// shutdown with t.Cleanup. extra are additional config directives
// ("maxmemory 10mb").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found in PATH: %s", InstallHint)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s := &Server{Port: FreePort(t), Dir: t.TempDir()}
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
		args := []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(s.Port),
			"--save", "", "--appendonly", "no", "--dir", s.Dir, "--daemonize", "no",
			"--logfile", filepath.Join(s.Dir, "redis.log")}
		for _, e := range extra {
			args = append(args, "--"+e)
		}
		s.bin, s.args = bin, args
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redis-server did not become ready: %v", lastErr)
	return nil
}

// Client returns a go-redis client for the server, closed at cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// start runs the process and waits until it answers PING; on failure
// nothing is left running.
func (s *Server) start() error {
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.SysProcAttr = childAttr()
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return fmt.Errorf("start %s: %w", filepath.Base(s.bin), err)
	}
	if err := waitReady(s.Addr, 5*time.Second); err != nil {
		s.Stop()
		return err
	}
	return nil
}

// Restart starts a stopped server again with the same port, directory and
// options (a cluster node finds its nodes.conf there and rejoins).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if s.Running() {
		return
	}
	if err := s.start(); err != nil {
		t.Fatalf("restart %s: %v", s.Addr, err)
	}
}

// Running reports whether the process was started and not stopped.
func (s *Server) Running() bool { return s.cmd != nil }

// Stop kills the server and waits for it.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_, _ = s.cmd.Process.Wait()
	s.cmd = nil
}

// Log returns the server's log, for failure messages.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return string(b)
}

func waitReady(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		var conn net.Conn
		conn, err = net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = conn.SetDeadline(time.Now().Add(time.Second))
			fmt.Fprint(conn, "PING\r\n")
			line, rerr := bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if rerr == nil && line == "+PONG\r\n" {
				return nil
			}
			err = fmt.Errorf("PING answered %q (%v)", line, rerr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// Ctx returns a context that ends with the test.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Freeze stops the server process (SIGSTOP): it keeps its connections and
// its port, and answers nothing until Thaw, which is how a stalled Redis
// (a long fork, a long script, DEBUG SLEEP) looks to its clients.
func (s *Server) Freeze() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redis %s is not running", s.Addr)
	}
	return s.cmd.Process.Signal(syscall.SIGSTOP)
}

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redis %s is not running", s.Addr)
	}
	return s.cmd.Process.Signal(syscall.SIGCONT)
}
