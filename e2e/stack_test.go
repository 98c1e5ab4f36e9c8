//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
	"github.com/rategate/rategate/internal/testredis"
)

// ---- rategate --------------------------------------------------------------

// rategate is one rategate process; restartable on the same ports, also
// from a subtest: the process belongs to the test that created the rategate.
type rategate struct {
	owner      testing.TB
	name       string
	bin        string
	configPath string
	redisURL   string
	port       int
	adminPort  int
	dir        string
	proc       *proc
	// env is added to the process's environment (RATEGATE_ADMIN_TOKEN, ...).
	env []string
}

func newRategate(t testing.TB, name, dir, configPath, redisURL string) *rategate {
	return &rategate{
		owner: t, name: name, bin: rategateBinary(t), configPath: configPath, redisURL: redisURL,
		port: testredis.FreePort(t), adminPort: testredis.FreePort(t), dir: dir,
	}
}

// addr is the decision listener, host:port.
func (r *rategate) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// start runs the process and waits until /readyz says the store answers.
// Its ports were free when picked; another process may have bound one
// since (rategate then stops: "address already in use"). A first start
// then tries two other ports; a restart keeps its ports, which NGINX was
// given, and tries them again a little later.
func (r *rategate) start(t testing.TB) {
	t.Helper()
	first := r.proc == nil
	logPath := filepath.Join(r.dir, r.name+".log")
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		before := bindFailures(logPath)
		if err = r.try(t); err == nil {
			return
		}
		taken := portTaken(r.proc, logPath, before)
		r.proc.stop()
		if !taken {
			break
		}
		if first {
			r.port, r.adminPort = testredis.FreePort(t), testredis.FreePort(t)
		} else {
			time.Sleep(500 * time.Millisecond)
		}
	}
	t.Fatalf("%s did not become ready at %s: %v\nlog:\n%s", r.name, r.addr(), err, r.proc.logTail())
}

// try is one start: the process, and the wait for its /readyz (cut short
// when it exits).
func (r *rategate) try(t testing.TB) error {
	t.Helper()
	r.proc = startProcEnv(t, r.owner, r.env, r.name, filepath.Join(r.dir, r.name+".log"), r.bin,
		"-config", r.configPath,
		"-listen", r.addr(),
		"-admin-listen", "127.0.0.1:"+strconv.Itoa(r.adminPort),
		"-redis", r.redisURL)
	url := "http://" + r.addr() + "/readyz"
	return waitServing(r.proc, 10*time.Second, func() error { return httpStatus(url, http.StatusOK) })
}

// stop kills the process (SIGKILL: a crash, not a graceful shutdown).
func (r *rategate) stop() { r.proc.stop() }

// httpStatus GETs url and checks the status: readiness polls only, every
// assertion about what clients see goes through curl.
func httpStatus(url string, want int) error {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("GET %s: %d, want %d", url, resp.StatusCode, want)
	}
	return nil
}

// writeRategateConfig writes the suite's rategate policy with the given
// deny status. Every limit uses fixed_window over a day, so a test never
// crosses a window boundary (see needWindow).
func writeRategateConfig(t testing.TB, dir string, denyStatus int) string {
	t.Helper()
	cfg := fmt.Sprintf(`# rategate policy of the e2e suite.
redis:
  # The suite shares two cores with nginx, curl and redis: give Redis more
  # than the default 50ms so a busy machine does not turn into failure_mode.
  # Still well under NGINX's 250ms proxy_read_timeout.
  timeout: 200ms
failure_mode: allow
deny_status: %d
rules:
  - name: per-user
    match: {path: /user/}
    key: [user]
    algorithm: fixed_window
    limit: 10
    period: 24h
  - name: per-ip
    match: {path: /ip/}
    key: [ip]
    algorithm: fixed_window
    limit: 5
    period: 24h
  - name: post-per-user
    match: {path: /post/, methods: [POST]}
    key: [user]
    algorithm: fixed_window
    limit: 2
    period: 24h
`, denyStatus)
	path := filepath.Join(dir, "rategate.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// window is the period of every rule in writeRategateConfig.
const window = 24 * time.Hour

// untilWindowEnd is how long the current fixed window (aligned to the
// epoch, as rategate's are) has left. rategate reads Redis's clock, which on
// this one machine is the test's.
func untilWindowEnd(now time.Time, period time.Duration) time.Duration {
	return period - time.Duration(now.UnixNano()%int64(period))
}

// needWindow waits, when the current window of period ends within margin,
// until the next one has begun, so counts and Retry-After checks never
// straddle a boundary. With a 24h window it waits on about one run in a
// thousand.
func needWindow(t testing.TB, period, margin time.Duration) {
	t.Helper()
	if left := untilWindowEnd(time.Now(), period); left < margin {
		t.Logf("the rate-limit window ends in %v: waiting for the next one", left)
		time.Sleep(left + time.Second)
	}
}

// ---- nginx -----------------------------------------------------------------

// nginxServer is one nginx master running a copy of nginx/.
type nginxServer struct {
	name   string
	prefix string
	conf   string
	port   int
	// h2Port is the HTTP/2-only listener's port, when rewrite.h2 asked for one.
	h2Port int
	proc   *proc
}

// rewrite says how a copy of nginx/ differs from the shipped files: only
// addresses and the failure policy. Every other line stays as shipped.
type rewrite struct {
	listen    int      // "listen 8000;" becomes 127.0.0.1:listen
	rategates []string // each line naming 127.0.0.1:8080 is repeated once per address
	app       string   // replaces 127.0.0.1:8001
	auth      string   // replaces 127.0.0.1:4180, the auth layer of nginx-auth.conf and openresty-auth.conf
	closed    bool     // $rategate_on_failure: "default open;" becomes "default closed;"
	// extra replaces whole substrings, for compose.conf's service names.
	extra map[string]string
	// h2 adds an HTTP/2-only (prior knowledge) listener on a second port,
	// picked for each try to start NGINX, as the first is
	// (nginxServer.h2Port).
	h2 bool
	// files are more files for the prefix (a test's own config), name to
	// content; the rewrites above apply to them as to the shipped ones.
	files map[string]string
}

// shipped literals the rewrite relies on; a test fails if one disappears.
const (
	shippedListen   = "listen 8000;"
	shippedRategate = "127.0.0.1:8080"
	shippedApp      = "127.0.0.1:8001"
	shippedAuth     = "127.0.0.1:4180"
	shippedOpen     = "default open;"
)

// copyNginxDir copies nginx/ into prefix with rw applied, and fails the test
// when a literal the rewrite relies on is gone from the shipped files.
func copyNginxDir(t testing.TB, prefix string, rw rewrite) {
	t.Helper()
	src := filepath.Join(repoRoot, "nginx")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"", "logs", "temp"} {
		if err := os.MkdirAll(filepath.Join(prefix, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(prefix, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hits := map[string]int{}
	type file struct {
		name string
		body []byte
	}
	var files []file
	for _, e := range entries {
		if e.IsDir() { // logs/ and temp/: created empty above
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, file{e.Name(), b})
	}
	for name, body := range rw.files {
		files = append(files, file{name, []byte(body)})
	}
	addrs := map[string]string{}
	if rw.app != "" {
		addrs[shippedApp] = rw.app
	}
	if rw.auth != "" {
		addrs[shippedAuth] = rw.auth
	}
	for _, f := range files {
		b := f.body
		var out []string
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				out = append(out, line)
				continue
			}
			for old, repl := range rw.extra {
				if strings.Contains(line, old) {
					line = strings.ReplaceAll(line, old, repl)
					hits[old]++
				}
			}
			if rw.listen != 0 && strings.Contains(line, shippedListen) {
				line = strings.Replace(line, shippedListen, fmt.Sprintf("listen 127.0.0.1:%d;", rw.listen), 1)
				hits[shippedListen]++
			}
			line = replaceAddrs(line, addrs, hits)
			if rw.closed && strings.Contains(line, shippedOpen) {
				line = strings.Replace(line, shippedOpen, "default closed;", 1)
				hits[shippedOpen]++
			}
			if len(rw.rategates) > 0 && hasAddr(line, shippedRategate) {
				hits[shippedRategate]++
				for _, a := range rw.rategates {
					out = append(out, replaceAddrs(line, map[string]string{shippedRategate: a}, nil))
				}
				continue
			}
			out = append(out, line)
		}
		if err := os.WriteFile(filepath.Join(prefix, f.name), []byte(strings.Join(out, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(used bool, literal string) {
		if used && hits[literal] == 0 {
			t.Fatalf("no line of nginx/ contains %q any more: update the e2e rewrite (e2e/stack_test.go)", literal)
		}
	}
	check(rw.listen != 0, shippedListen)
	check(rw.app != "", shippedApp)
	check(rw.auth != "", shippedAuth)
	check(rw.closed, shippedOpen)
	check(len(rw.rategates) > 0, shippedRategate)
	for old := range rw.extra {
		check(true, old)
	}
}

// replaceAddrs replaces every whole shipped address in line (one not
// followed by another digit) by its new one, in one pass: an address
// written in is never read again, so an app on 127.0.0.1:41809 does not
// turn into the auth layer's address with a 9 after it. hits, when not
// nil, counts the lines each address was found in.
func replaceAddrs(line string, addrs map[string]string, hits map[string]int) string {
	var b strings.Builder
	found := map[string]bool{}
	for i := 0; i < len(line); {
		matched := false
		for old, repl := range addrs {
			if strings.HasPrefix(line[i:], old) && !digitAt(line, i+len(old)) {
				b.WriteString(repl)
				i += len(old)
				found[old] = true
				matched = true
				break
			}
		}
		if !matched {
			b.WriteByte(line[i])
			i++
		}
	}
	for old := range found {
		if hits != nil {
			hits[old]++
		}
	}
	return b.String()
}

// hasAddr says whether line names addr whole.
func hasAddr(line, addr string) bool {
	return replaceAddrs(line, map[string]string{addr: ""}, nil) != line
}

func digitAt(s string, i int) bool { return i < len(s) && s[i] >= '0' && s[i] <= '9' }

// startNginx copies nginx/ into a fresh prefix with rw applied and runs
// `nginx -p prefix -c conf -g 'daemon off;'` until /nginx-health answers.
func startNginx(t testing.TB, name, conf string, rw rewrite) *nginxServer {
	t.Helper()
	bin := needBinary(t, "nginx", "nginx")
	var last string
	for attempt := 0; attempt < 3; attempt++ {
		try := rw
		try.listen = testredis.FreePort(t)
		dir := fmt.Sprintf("%s-%s-%d", safeName(t.Name()), name, attempt)
		n := &nginxServer{name: name, conf: conf, port: try.listen, prefix: filepath.Join(workDir, dir)}
		if rw.h2 {
			n.h2Port = testredis.FreePort(t)
			try.extra = maps.Clone(rw.extra)
			if try.extra == nil {
				try.extra = map[string]string{}
			}
			maps.Copy(try.extra, h2Listen(n.h2Port))
		}
		copyNginxDir(t, n.prefix, try)
		stderr := filepath.Join(n.prefix, "logs", "stderr.log")
		n.proc = startProc(t, "nginx "+name, stderr, bin, "-p", n.prefix+"/", "-c", conf, "-g", "daemon off;")
		url := fmt.Sprintf("http://127.0.0.1:%d/nginx-health", n.port)
		err := waitServing(n.proc, 10*time.Second, func() error { return httpStatus(url, http.StatusOK) })
		if err == nil {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("nginx %s error log:\n%s", name, procs.FileTail(n.errorLog(), 20))
				}
			})
			return n
		}
		taken := portTaken(n.proc, stderr, 0) // each try has its own prefix: its log starts empty
		n.proc.stop()
		last = fmt.Sprintf("%v\nstderr:\n%s\nerror.log:\n%s", err, n.proc.logTail(), procs.FileTail(n.errorLog(), 20))
		if !taken {
			break
		}
	}
	t.Fatalf("nginx %s (%s) did not start: %s", name, conf, last)
	return nil
}

// safeName turns a test name into a directory name: nothing but letters,
// digits, '-' and '_' (a ';' in the prefix would break lua_package_path).
func safeName(name string) string {
	return strings.Trim(unsafeChars.ReplaceAllString(name, "_"), "_")
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

func (n *nginxServer) errorLog() string { return filepath.Join(n.prefix, "logs", "error.log") }

// errorLogSize is the error log's length, to read what a test adds to it.
func (n *nginxServer) errorLogSize(t testing.TB) int64 {
	t.Helper()
	fi, err := os.Stat(n.errorLog())
	if err != nil {
		if os.IsNotExist(err) {
			return 0
		}
		t.Fatal(err)
	}
	return fi.Size()
}

// errorLogSince returns what the error log gained after offset.
func (n *nginxServer) errorLogSince(t testing.TB, offset int64) string {
	t.Helper()
	b, err := os.ReadFile(n.errorLog())
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if int64(len(b)) < offset {
		return string(b)
	}
	return string(b[offset:])
}

// failTimeout is fail_timeout= of the shipped upstream: how long NGINX
// skips an instance that failed.
func failTimeout(t testing.TB) time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "nginx", "rategate-upstream.conf"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`fail_timeout=(\d+)s`).FindSubmatch(b)
	if m == nil {
		return 10 * time.Second // NGINX's default
	}
	n, _ := strconv.Atoi(string(m[1]))
	return time.Duration(n) * time.Second
}

// ---- the upstream application ---------------------------------------------

// app is the application behind NGINX. It answers every request with the
// identity headers it received and counts requests per X-User-Id, so a test
// can tell what got through.
type app struct {
	addr string
	mu   sync.Mutex
	hits map[string]int // by X-User-Id, "" for none
}

// appEcho is the app's JSON answer.
type appEcho struct {
	Method        string `json:"method"`
	URI           string `json:"uri"`
	XRealIP       string `json:"x_real_ip"`
	XForwardedFor string `json:"x_forwarded_for"`
	XUserID       string `json:"x_user_id"`
	HasXUserID    bool   `json:"has_x_user_id"`
	BodyBytes     int64  `json:"body_bytes"`
	// XRateLimitStatus is what NGINX says about the decision (bypassed,
	// unavailable, local), HasXRateLimitStatus whether the header came.
	XRateLimitStatus    string `json:"x_ratelimit_status"`
	HasXRateLimitStatus bool   `json:"has_x_ratelimit_status"`
	XRequestID          string `json:"x_request_id"`
	// XLocation is set by a test's own config: which location proxied.
	XLocation string `json:"x_location"`
	// Users holds every copy of the headers applications read the
	// signed-in user from (identityHeaders), joined by " | ", absent when
	// none came.
	Users map[string]string `json:"users"`
}

// identityHeaders are the headers an application behind an auth layer may
// take as the signed-in user: the auth configs set each from the auth
// layer's answer.
var identityHeaders = []string{"X-User", "X-Auth-Request-User", "X-Forwarded-User", "Remote-User",
	"X-Email", "X-Auth-Request-Email", "X-Forwarded-Email", "Remote-Email",
	"X-Auth-Request-Groups", "X-Forwarded-Groups", "Remote-Groups",
	"X-Auth-Request-Preferred-Username", "X-Forwarded-Preferred-Username", "Remote-Name"}

func startApp(t testing.TB) *app {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &app{addr: ln.Addr().String(), hits: map[string]int{}}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	user, has := r.Header["X-User-Id"]
	e := appEcho{
		Method: r.Method, URI: r.RequestURI, BodyBytes: n, HasXUserID: has,
		XRealIP: r.Header.Get("X-Real-IP"), XForwardedFor: r.Header.Get("X-Forwarded-For"),
		XRequestID: r.Header.Get("X-Request-Id"), XLocation: r.Header.Get("X-Location"),
	}
	if has {
		e.XUserID = strings.Join(user, ",")
	}
	for _, h := range identityHeaders {
		if v, ok := r.Header[h]; ok {
			if e.Users == nil {
				e.Users = map[string]string{}
			}
			e.Users[h] = strings.Join(v, " | ")
		}
	}
	if st, ok := r.Header["X-Ratelimit-Status"]; ok {
		e.HasXRateLimitStatus, e.XRateLimitStatus = true, strings.Join(st, ",")
	}
	a.mu.Lock()
	a.hits[e.XUserID]++
	a.mu.Unlock()
	if strings.HasSuffix(r.URL.Path, "/boom") {
		http.Error(w, "app error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(e)
}

// hitsOf is how many requests with X-User-Id user reached the app.
func (a *app) hitsOf(user string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hits[user]
}

// hangListener accepts connections and never answers: a rategate that hangs.
func hangListener(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// fakeRategate stands in for rategate where a test needs answers the real
// one only gives when something is wrong (400, 503), and records the
// subrequests NGINX sends it.
type fakeRategate struct {
	addr string
	mu   sync.Mutex
	seen []seenRequest
}

// seenRequest is one subrequest as the fake received it.
type seenRequest struct {
	Proto     string
	Method    string
	Path      string
	Header    http.Header
	BodyBytes int64
}

func startFakeRategate(t testing.TB) *fakeRategate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRategate{addr: ln.Addr().String()}
	srv := &http.Server{Handler: f, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return f
}

// ServeHTTP answers by the original URI: .../bad-request gets 400 (what
// rategate says when NGINX fails to send a header), .../deny-403 a denial
// as with deny_status: 403, .../store-down 503 (rategate's failure_mode:
// deny), .../overloaded the bare 503 of rategate at its connection limit,
// anything else 204 with one header.
func (f *fakeRategate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	f.mu.Lock()
	f.seen = append(f.seen, seenRequest{Proto: r.Proto, Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), BodyBytes: n})
	f.mu.Unlock()
	uri := r.Header.Get("X-Original-URI")
	switch {
	case strings.Contains(uri, "/bad-request"):
		http.Error(w, "missing X-Original-URI header", http.StatusBadRequest)
	case strings.Contains(uri, "/deny-403"):
		w.Header().Set("Retry-After", "7")
		w.Header().Set("X-RateLimit-Rule", "fake")
		http.Error(w, "rate limited by rule \"fake\"", http.StatusForbidden)
	case strings.Contains(uri, "/store-down"):
		w.Header().Set("X-RateLimit-Status", "unavailable")
		http.Error(w, "rate-limit store unavailable", http.StatusServiceUnavailable)
	case strings.Contains(uri, "/overloaded"):
		// what rategate's server (handler.NewServer) answers a connection
		// beyond its MaxConns: fasthttp's own 503, without the handler's
		// headers (handler's TestServerMaxConns)
		w.Header().Set("Connection", "close")
		http.Error(w, "The connection cannot be served because Server.Concurrency limit exceeded", http.StatusServiceUnavailable)
	default:
		w.Header().Set("X-RateLimit-Limit", "1000")
		w.WriteHeader(http.StatusNoContent)
	}
}

// last is the most recent subrequest.
func (f *fakeRategate) last(t testing.TB) seenRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.seen) == 0 {
		t.Fatal("the fake rategate received no subrequest")
	}
	return f.seen[len(f.seen)-1]
}
