//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// proc is one process the suite started, in its own process group so that
// stopping it also stops its children (nginx workers).
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // from Wait, valid once done is closed
}

// startProc starts bin with args, stdout and stderr appended to logPath, and
// registers its end with t.Cleanup: every process dies with the test, even
// when an assertion failed.
func startProc(t testing.TB, name, logPath, bin string, args ...string) *proc {
	t.Helper()
	return startProcOwned(t, t, name, logPath, bin, args...)
}

// startProcOwned is startProc for a process that outlives the (sub)test t
// starting it: owner's cleanup ends it.
func startProcOwned(t, owner testing.TB, name, logPath, bin string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, owner, nil, name, logPath, bin, args...)
}

// startProcEnv is startProcOwned with env added to the suite's environment.
func startProcEnv(t, owner testing.TB, env []string, name, logPath, bin string, args ...string) *proc {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("%s: log file: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	// Own process group, so kill(-pgid) reaches every child; and die with
	// the test binary should it be killed before its cleanups run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("%s: start %s: %v", name, bin, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	owner.Cleanup(p.stop)
	return p
}

// stop kills the process group and waits (bounded) for the process.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// logTail returns the last lines of the process's log, for failure messages.
func (p *proc) logTail() string {
	return fileTail(p.logPath, 30)
}

// fileTail returns the last n lines of a file, or why it cannot.
func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls cond every 20ms until it returns nil or within has passed,
// and returns the last error.
func waitFor(within time.Duration, cond func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
