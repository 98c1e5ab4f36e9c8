// Package procs builds rategate and runs it, and the other servers the tests
// and the benchmark need, as real processes on loopback ports: each in its
// own process group (stopping it stops its children, nginx workers among
// them), dying with its parent, its output in a log file. The tests of
// every package that runs rategate as a process, and bench/runner, start
// it here.
package procs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// BinaryEnv names a prebuilt rategate to run instead of building one (a
// release build, say).
const BinaryEnv = "RATEGATE_BINARY"

// Build compiles rategate into dir and returns the binary's path, or the
// path BinaryEnv names. It is built without -race: tests measure answer
// times, and those of a race build say little about production.
func Build(dir string) (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		return filepath.Abs(p)
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command is needed to build rategate: %w", err)
	}
	out := filepath.Join(dir, "rategate")
	cmd := exec.Command(goBin, "build", "-o", out, ".")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -o %s . in %s: %v\n%s", out, root, err, strings.TrimSpace(string(b)))
	}
	return out, nil
}

// moduleRoot finds the directory of go.mod from the working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// freePort is FreePort; a test makes it hand out a port in use.
var freePort = FreePort

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Process is one started program.
type Process struct {
	Name    string
	LogPath string
	Cmd     *exec.Cmd
	done    chan struct{}
	err     error // from Wait, valid once done is closed
}

// Start runs bin with args (and env added to this process's environment),
// appending stdout and stderr to logPath, in a new process group that dies
// with this process.
func Start(name, logPath, bin string, args, env []string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: start %s: %w", name, bin, err)
	}
	p := &Process{Name: name, LogPath: logPath, Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's id (also its process group's).
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process ended (nil for exit status 0); valid once Exited.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Signal sends sig to the process (not its group).
func (p *Process) Signal(sig syscall.Signal) error { return p.Cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits up to grace for the process to end; then it
// kills the whole group. It returns how the process ended, or an error
// saying it had to be killed.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return p.err
	}
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(grace):
	}
	p.Kill()
	return fmt.Errorf("%s did not stop within %v of SIGTERM; killed", p.Name, grace)
}

// Kill kills the process group and waits (bounded) for the process.
func (p *Process) Kill() {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string { return FileTail(p.LogPath, n) }

// FileTail returns the last n lines of a file, or why it cannot.
func FileTail(path string, n int) string {
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

// Options says how to start rategate.
type Options struct {
	// Name names the process in logs and errors.
	Name string
	// Bin is the rategate binary (Build).
	Bin string
	// Dir holds the log file (<Name>.log).
	Dir string
	// Main and Admin are the listeners' host:port; a free loopback port
	// each when empty.
	Main, Admin string
	// Token is the admin token the readiness check sends.
	Token string
	// Args follow -listen and -admin-listen (-config FILE, -redis URL...).
	Args []string
	// Env is added to the environment.
	Env []string
	// Ready is what start waits for: "healthz" (default: the process
	// serves), "readyz" (and its store answers), or "none".
	Ready string
	// Within bounds the wait (default 15 s).
	Within time.Duration
}

// Rategate is one running rategate.
type Rategate struct {
	*Process
	// Main and Admin are the listeners' host:port; Token the admin token.
	Main, Admin, Token string
	opts               Options
}

// StartRategate starts rategate as o says and waits until it is ready: its
// main listener answers the Ready path and its admin listener /v1/rules.
// On failure the process is killed and the error carries its log.
func StartRategate(o Options) (*Rategate, error) {
	// Ports this function picks were free a moment ago; another test's
	// server may take one before rategate binds it. Then rategate stops at
	// once ("address already in use"), and it is started again on others.
	for attempt := 1; ; attempt++ {
		r, err := startRategate(o)
		// the error carries the log's tail, where rategate says why
		if err == nil || (o.Main != "" && o.Admin != "") || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return r, err
		}
	}
}

// startRategate is one try of StartRategate.
func startRategate(o Options) (*Rategate, error) {
	if o.Main == "" {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		o.Main = "127.0.0.1:" + strconv.Itoa(port)
	}
	if o.Admin == "" {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		o.Admin = "127.0.0.1:" + strconv.Itoa(port)
	}
	if o.Name == "" {
		o.Name = "rategate"
	}
	args := append([]string{"-listen", o.Main, "-admin-listen", o.Admin}, o.Args...)
	p, err := Start(o.Name, filepath.Join(o.Dir, o.Name+".log"), o.Bin, args, o.Env)
	if err != nil {
		return nil, err
	}
	r := &Rategate{Process: p, Main: o.Main, Admin: o.Admin, Token: o.Token, opts: o}
	if err := r.WaitReady(); err != nil {
		p.Kill()
		return nil, err
	}
	return r, nil
}

// Restart starts the same rategate again (same ports and arguments) after
// it stopped, and waits until it is ready.
func (r *Rategate) Restart() error {
	args := append([]string{"-listen", r.Main, "-admin-listen", r.Admin}, r.opts.Args...)
	p, err := Start(r.Name, r.LogPath, r.opts.Bin, args, r.opts.Env)
	if err != nil {
		return err
	}
	r.Process = p
	return r.WaitReady()
}

// WaitReady waits until the process is ready as Options.Ready says.
func (r *Rategate) WaitReady() error {
	if r.opts.Ready == "none" {
		return nil
	}
	path := "/healthz"
	if r.opts.Ready == "readyz" {
		path = "/readyz"
	}
	within := r.opts.Within
	if within <= 0 {
		within = 15 * time.Second
	}
	deadline := time.Now().Add(within)
	for {
		main := httpStatus("http://"+r.Main+path, "")
		adm := httpStatus("http://"+r.Admin+"/v1/rules", r.Token)
		if main == 200 && adm == 200 {
			return nil
		}
		if r.Exited() {
			return fmt.Errorf("%s exited at start (%v):\n%s", r.Name, r.err, r.LogTail(40))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v (%s %d, admin %d):\n%s", r.Name, within, path, main, adm, r.LogTail(40))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var readyClient = &http.Client{Timeout: 2 * time.Second}

// httpStatus GETs url and returns the status, 0 when it failed.
func httpStatus(url, token string) int {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := readyClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
