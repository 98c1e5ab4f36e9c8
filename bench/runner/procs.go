package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rategate/rategate/internal/procs"
)

// procSet starts the benchmark's servers, each in its own process group,
// and stops them all. Every pid it starts is listed in pidFile (one per
// line) while the process runs, so bench/run.sh's trap can stop them even
// if the runner itself is killed.
type procSet struct {
	mu      sync.Mutex
	pidFile string
	procs   []*proc
}

// proc is one started server.
type proc struct {
	name string
	log  string
	*procs.Process
}

func (p *proc) pid() int     { return p.Pid() }
func (p *proc) exited() bool { return p.Exited() }

// start runs bin with args, output to logPath, in a new process group
// (internal/procs, as the tests start rategate).
func (s *procSet) start(name, logPath, bin string, args ...string) (*proc, error) {
	_ = os.Remove(logPath) // a fresh log per run
	pr, err := procs.Start(name, logPath, bin, args, nil)
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, log: logPath, Process: pr}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.writePIDs()
	s.mu.Unlock()
	return p, nil
}

// stopAll sends SIGTERM to every process group it started, waits up to 5 s,
// then SIGKILLs what is left. Safe to call more than once.
func (s *procSet) stopAll() {
	s.mu.Lock()
	procs := s.procs
	s.procs = nil
	s.mu.Unlock()
	for _, p := range procs {
		if !p.exited() {
			_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
		}
	}
	deadline := time.After(5 * time.Second)
	for _, p := range procs {
		select {
		case <-p.Done():
		case <-deadline:
		}
	}
	for _, p := range procs {
		if !p.exited() {
			_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
			<-p.Done()
		}
	}
	s.mu.Lock()
	s.writePIDs()
	s.mu.Unlock()
}

// writePIDs rewrites pidFile with the running processes; s.mu is held.
func (s *procSet) writePIDs() {
	if s.pidFile == "" {
		return
	}
	var b strings.Builder
	for _, p := range s.procs {
		fmt.Fprintln(&b, p.pid())
	}
	_ = os.WriteFile(s.pidFile, []byte(b.String()), 0o644)
}

// tail returns the last lines of a log file, for error messages.
func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// waitHTTP waits until GET path on addr answers with status want.
func waitHTTP(p *proc, addr, path string, want int, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited: %s", p.name, tail(p.log, 20))
		}
		status, err := httpGet(addr, path)
		if err == nil && status == want {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("GET %s answered %d, want %d", path, status, want)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready on %s: %v", p.name, addr, last)
}

// httpGet does one GET without keep-alive and returns the status.
func httpGet(addr, path string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n", path)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, err
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	return strconv.Atoi(f[1])
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times.
var clockTicks = func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			return float64(n)
		}
	}
	return 100
}()

// cpuSeconds is utime+stime of pid (all its threads) in seconds.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/<pid>/stat line. The command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func parseStatCPU(b []byte) (float64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no ')'")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, errors.New("/proc stat: too few fields")
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("/proc stat: bad utime/stime")
	}
	return float64(ut+st) / clockTicks, nil
}

// parentOf returns the parent pid from /proc/<pid>/stat.
func parentOf(pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// withChildren returns pid and its direct children (NGINX's workers).
func withChildren(pid int) []int {
	pids := []int{pid}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n == pid {
			continue
		}
		if parentOf(n) == pid {
			pids = append(pids, n)
		}
	}
	return pids
}

// machineBusy returns the CPU seconds all CPUs spent not idle, from /proc/stat.
func machineBusy() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseMachineBusy(b)
}

// parseMachineBusy reads the aggregate "cpu" line of /proc/stat: every
// field except idle and iowait is busy time (guest time is already inside
// user and nice, so fields 9 and 10 are left out).
func parseMachineBusy(b []byte) (float64, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, errors.New("/proc/stat: no cpu line")
	}
	var busy uint64
	for i := 1; i < len(f) && i <= 8; i++ {
		if i == 4 || i == 5 { // idle, iowait
			continue
		}
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		busy += n
	}
	return float64(busy) / clockTicks, nil
}

// acceptCounter counts, with `perf stat` on the accept4 syscall's
// tracepoint, the connections a process accepts: how often NGINX opens a new
// connection to the auth service or the app instead of reusing a kept-alive
// one. Nil when perf or its tracepoints are not available.
type acceptCounter struct {
	cmd *exec.Cmd
	out *bytes.Buffer
}

// perfWorks reports whether perf can count syscall tracepoints here.
var perfWorks = func() bool {
	if _, err := exec.LookPath("perf"); err != nil {
		return false
	}
	out, err := exec.Command("perf", "stat", "-x,", "-e", "syscalls:sys_exit_accept4", "--filter", "ret >= 0", "--", "true").CombinedOutput()
	return err == nil && strings.Contains(string(out), "sys_exit_accept4")
}()

// countAccepts starts counting the successful accept4 calls of pid.
func countAccepts(pid int) *acceptCounter {
	if !perfWorks {
		return nil
	}
	c := &acceptCounter{out: &bytes.Buffer{}}
	c.cmd = exec.Command("perf", "stat", "-x,", "-e", "syscalls:sys_exit_accept4", "--filter", "ret >= 0", "-p", strconv.Itoa(pid))
	c.cmd.Stderr = c.out
	if err := c.cmd.Start(); err != nil {
		return nil
	}
	return c
}

// stop ends the count and returns it; -1 when it could not be read.
func (c *acceptCounter) stop() int64 {
	if c == nil {
		return -1
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
		return -1
	}
	return parsePerfCount(c.out.String())
}

// parsePerfCount reads the count of perf stat -x, output ("123,,event,...").
func parsePerfCount(out string) int64 {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) >= 3 && strings.HasPrefix(f[2], "syscalls:") {
			if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() [3]float64 {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}
