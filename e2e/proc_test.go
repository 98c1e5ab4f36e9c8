//go:build e2e

package e2e

import (
	"fmt"
	"os"
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
// (start(port), its output appended to logPath) and waits, up to within,
// until ready(port) is nil. The port may be taken before the server binds
// it; when the server exits saying so ("address already in use", in any
// case, in what this try wrote), another port is tried, three in all. It
// returns the port and the process.
func startOnFreePort(t *testing.T, what, logPath string, within time.Duration, start func(port int) *proc, ready func(port int) error) (int, *proc) {
	t.Helper()
	port, p, err := onFreePort(t, logPath, within, start, ready)
	if err != nil {
		t.Fatalf("%s did not start: %v", what, err)
	}
	return port, p
}

// onFreePort is startOnFreePort's tries; its error says why the last
// failed and what the server logged.
func onFreePort(t *testing.T, logPath string, within time.Duration, start func(port int) *proc, ready func(port int) error) (int, *proc, error) {
	t.Helper()
	var err error
	for range 3 {
		port, before := testredis.FreePort(t), bindFailures(logPath)
		p := start(port)
		if err = waitServing(p, within, func() error { return ready(port) }); err == nil {
			return port, p, nil
		}
		taken := portTaken(p, logPath, before)
		p.stop()
		err = fmt.Errorf("%w\n%s", err, p.logTail())
		if !taken {
			break
		}
	}
	return 0, nil, err
}

// bindFailures counts the lines of the log at path (none: 0) that say a
// port was taken.
func bindFailures(path string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(strings.ToLower(string(b)), "address already in use")
}

// portTaken reports whether p exited because its port was taken: it
// ended, and its log, appended to by every try, says so more often than
// the before ones did.
func portTaken(p *proc, logPath string, before int) bool {
	return p.exited() && bindFailures(logPath) > before
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
