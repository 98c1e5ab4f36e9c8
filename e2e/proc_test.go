//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
	"github.com/rategate/rategate/internal/testredis"
)

// proc is one process the suite started (internal/procs: its own process
// group, so that stopping it also stops its children, nginx workers among
// them; dead with the test binary; output appended to its log).
type proc struct {
	*procs.Process
	name    string
	logPath string
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
	pr, err := procs.Start(name, logPath, bin, args, env)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{Process: pr, name: name, logPath: logPath}
	owner.Cleanup(p.stop)
	return p
}

// stop kills the process group and waits (bounded) for the process.
func (p *proc) stop() { p.Kill() }

// exited reports whether the process has ended.
func (p *proc) exited() bool { return p.Exited() }

// logTail returns the last lines of the process's log, for failure messages.
func (p *proc) logTail() string {
	return procs.FileTail(p.logPath, 30)
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

// startOnFreePort starts a server on a port that was free a moment ago
// (start(port)) and waits, up to within, until ready(port) is nil. The
// port may be taken before the server binds it; when the server exits
// saying so ("address already in use", in any case), another port is
// tried, three in all. It returns the port and the process.
func startOnFreePort(t *testing.T, what string, within time.Duration, start func(port int) *proc, ready func(port int) error) (int, *proc) {
	t.Helper()
	var last string
	for range 3 {
		port := testredis.FreePort(t)
		p := start(port)
		err := waitServing(p, within, func() error { return ready(port) })
		if err == nil {
			return port, p
		}
		p.stop()
		last = fmt.Sprintf("%v\n%s", err, p.logTail())
		if !strings.Contains(strings.ToLower(last), "address already in use") {
			break
		}
	}
	t.Fatalf("%s did not start: %s", what, last)
	return 0, nil
}

// waitServing polls ready every 20 ms until it is nil or within has
// passed, and returns its last error; it gives up at once when p exits.
func waitServing(p *proc, within time.Duration, ready func() error) error {
	deadline := time.Now().Add(within)
	for {
		if p.exited() {
			return fmt.Errorf("exited: %v", p.Err())
		}
		err := ready()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
