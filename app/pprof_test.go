package app

import (
	"bufio"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/config"
)

// TestPprof: the profiles are served only when asked for, and behind the
// admin token like every other admin path.
func TestPprof(t *testing.T) {
	start := func(pprof bool, token string) *fasthttp.HostClient {
		cfg := config.Example()
		cfg.Admin.Token = token
		a, err := New(cfg, Options{Log: zerolog.Nop(), Pprof: pprof})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Close)
		return serveOn(t, a.AdminHandler())
	}
	off := start(false, "")
	code, body := call(t, off, "GET", "/debug/pprof/heap", "")
	if code != 404 || !strings.Contains(body, "-pprof") {
		t.Fatalf("pprof off: %d %s, want 404 naming -pprof", code, body)
	}

	on := start(true, "tok")
	if code, _ := call(t, on, "GET", "/debug/pprof/heap", ""); code != 401 {
		t.Fatalf("pprof without token: %d, want 401", code)
	}
	code, body = call(t, on, "GET", "/debug/pprof/", "", "Authorization", "Bearer tok")
	if code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("pprof index: %d %.200s", code, body)
	}
	code, body = call(t, on, "GET", "/debug/pprof/goroutine?debug=1", "", "Authorization", "Bearer tok")
	if code != 200 || !strings.Contains(body, "goroutine profile:") {
		t.Fatalf("goroutine profile: %d %.200s", code, body)
	}
	code, body = call(t, on, "GET", "/debug/pprof/profile?seconds=1", "", "Authorization", "Bearer tok")
	if code != 200 || len(body) < 50 {
		t.Fatalf("cpu profile: %d, %d bytes", code, len(body))
	}
}

// TestPprofBadInput: net/http/pprof runs its default 30-second CPU profile
// (1-second trace) on a seconds it cannot read, and answers a second
// profile while one runs with a 500. Through the admin listener a
// malformed, repeated or out-of-range seconds is a 400 that names it, a
// method other than GET a 405, and a profile while another runs a 409.
func TestPprofBadInput(t *testing.T) {
	cfg := config.Example()
	cfg.Admin.Token = "tok"
	a, err := New(cfg, Options{Log: zerolog.Nop(), Pprof: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	c := serveOn(t, a.AdminHandler())
	auth := []string{"Authorization", "Bearer tok"}
	for _, q := range []string{
		"profile?seconds=abc", "profile?seconds=-1", "profile?seconds=0", "profile?seconds=1.5",
		"profile?seconds=100000", "profile?seconds=1&seconds=2", "profile?seconds=",
		"trace?seconds=abc", "trace?seconds=-2", "trace?seconds=NaN", "trace?seconds=1e9", "trace?seconds=61",
		"heap?seconds=abc", "heap?seconds=100000",
	} {
		code, body := call(t, c, "GET", "/debug/pprof/"+q, "", auth...)
		if code != 400 || !strings.Contains(body, "seconds") {
			t.Errorf("%s: %d %.200s, want 400 naming seconds", q, code, body)
		}
	}
	// net/http/pprof reads the request line as sent, '#' and all (an HTTP
	// client leaves a fragment out): the seconds it would run must be the
	// seconds checked. (Before, the first ran the default 30 s and the
	// second a trace of 100 s.)
	for _, target := range []string{"/debug/pprof/profile?seconds=2#x", "/debug/pprof/trace?#&seconds=100"} {
		if code, head := rawStatus(t, c.Addr, target, "Authorization: Bearer tok"); code != 400 {
			t.Errorf("GET %s: %d %q, want 400", target, code, head)
		}
	}
	for _, method := range []string{"POST", "HEAD"} {
		for _, path := range []string{"/debug/pprof/profile", "/debug/pprof/trace"} {
			if code, _ := call(t, c, method, path, "", auth...); code != 405 {
				t.Errorf("%s %s: %d, want 405", method, path, code)
			}
		}
	}
	if code, body := call(t, c, "POST", "/debug/pprof/profile", "seconds=abc", append(auth, "Content-Type", "application/x-www-form-urlencoded")...); code != 405 {
		t.Errorf("POST profile: %d %.200s, want 405", code, body)
	}

	// Two at once: one runs, the other is told why it did not.
	for _, target := range []string{"/debug/pprof/profile?seconds=2", "/debug/pprof/trace?seconds=2"} {
		codes := make(chan int, 2)
		for range 2 {
			go func() {
				code, _, _ := request(c, "GET", target, "", auth...) // 0 when it failed
				codes <- code
			}()
		}
		got := []int{<-codes, <-codes}
		slices.Sort(got)
		if got[0] != 200 || got[1] != 409 {
			t.Fatalf("two at once of %s: %v, want one 200 and one 409", target, got)
		}
	}
	code, body := call(t, c, "GET", "/debug/pprof/profile?seconds=1", "", auth...)
	if code != 200 || len(body) < 50 {
		t.Fatalf("a CPU profile after the others ended: %d, %d bytes", code, len(body))
	}
}

// rawStatus sends a GET of target, written into the request line as it
// is, and returns the answer's status and first line (0 and the error
// when there is none within 5 s).
func rawStatus(t *testing.T, addr, target string, headers ...string) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	req := "GET " + target + " HTTP/1.1\r\nHost: admin\r\n"
	for _, h := range headers {
		req += h + "\r\n"
	}
	if _, err := conn.Write([]byte(req + "\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, err.Error()
	}
	var code int
	fmt.Sscanf(line, "HTTP/1.1 %d", &code)
	return code, strings.TrimSpace(line)
}
