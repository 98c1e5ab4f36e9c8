package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
)

// TestOutOfFileDescriptors: idle connections that use up rategate's
// open-files limit, on both listeners, do not stop it. fasthttp takes an
// accept error other than a timeout for the end of its listener, so
// EMFILE made rategate exit ("listener stopped"), and every limit with it.
// Now it logs what to change, keeps serving the connections it has, and
// accepts again once connections close, with its counts intact.
func TestOutOfFileDescriptors(t *testing.T) {
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "rategate-nofile")
	// dash's ulimit sets the hard limit too: Go cannot raise it again
	writeFile(t, wrapper, "#!/bin/sh\nulimit -n 128 || exit 1\nexec "+rategateBin(t)+" \"$@\"\n")
	if err := os.Chmod(wrapper, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "rategate.yaml")
	writeFile(t, cfg, "rules:\n  - name: login\n    match: {path: /login}\n    key: [ip]\n    algorithm: sliding_log\n    limit: 5\n    period: 1h\n")
	rg, err := procs.StartRategate(procs.Options{Name: "nofile", Bin: wrapper, Dir: dir, Args: []string{"-config", cfg}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rg.Kill)
	// a new connection per request: the answers after the flood must come
	// from connections accepted after it
	fresh := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	get := func(url string, hdr ...string) int {
		req, _ := http.NewRequest("GET", url, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := fresh.Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	login := func() int {
		return get("http://"+rg.Main+"/auth", "X-Original-URI", "/login", "X-Real-IP", "203.0.113.9")
	}
	for i := range 3 {
		if code := login(); code != 204 {
			t.Fatalf("request %d before the flood: %d", i+1, code)
		}
	}

	// 200 idle connections to each listener: more than the 128 descriptors
	// the process may hold (the kernel completes them into the backlog)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, addr := range []string{rg.Main, rg.Admin} {
		for range 200 {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				time.Sleep(200 * time.Millisecond)
				if rg.Exited() {
					t.Fatalf("rategate exited with its descriptors used up (%v):\n%s", rg.Err(), rg.LogTail(20))
				}
				// the listener stopped (its process winds down after it)
				t.Fatalf("dial %s after %d connections: %v; rategate's log:\n%s", addr, len(conns), err, rg.LogTail(10))
			}
			conns = append(conns, c)
		}
	}
	within(t, 20*time.Second, "the log line on running out of descriptors", func() error {
		if rg.Exited() {
			t.Fatalf("rategate exited with its descriptors used up (%v):\n%s", rg.Err(), rg.LogTail(20))
		}
		if !strings.Contains(rg.LogTail(40), "cannot accept connections") {
			return os.ErrNotExist
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond)
	if rg.Exited() {
		t.Fatalf("rategate exited with its descriptors used up (%v):\n%s", rg.Err(), rg.LogTail(20))
	}

	for _, c := range conns {
		c.Close()
	}
	conns = nil
	// the counts survived: two more admissions, then the limit
	within(t, 15*time.Second, "an answer once the connections closed", func() error {
		if code := login(); code != 204 {
			return os.ErrDeadlineExceeded
		}
		return nil
	})
	if code := login(); code != 204 {
		t.Fatalf("the 5th request: %d, want 204", code)
	}
	if code := login(); code != 429 {
		t.Fatalf("the 6th request: %d, want 429 (the counts were lost?)", code)
	}
	if code := get("http://" + rg.Admin + "/v1/rules"); code != 200 {
		t.Fatalf("admin API after the flood: %d", code)
	}
}
