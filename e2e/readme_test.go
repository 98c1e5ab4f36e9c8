//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
	"github.com/rategate/rategate/internal/testredis"
)

// readmeBlocks returns the README's ```sh blocks in order.
func readmeBlocks(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// blockWith returns the README block holding every one of the lines.
func blockWith(t *testing.T, lines ...string) string {
	t.Helper()
	for _, b := range readmeBlocks(t) {
		ok := true
		for _, l := range lines {
			ok = ok && strings.Contains(b, l)
		}
		if ok {
			return b
		}
	}
	t.Fatalf("no ```sh block in README.md holds %q: the README and this test disagree", lines)
	return ""
}

// TestReadmeQuickStart runs the README's first quick start as written: the
// binary with no flags but -listen (the in-memory store, the built-in
// policy), then the README's own curl loop, its port rewritten.
func TestReadmeQuickStart(t *testing.T) {
	blockWith(t, "go run .")
	loop := blockWith(t, "for i in 1 2 3 4 5 6 7", "http://127.0.0.1:8080/auth")
	rg, err := procs.StartRategate(procs.Options{Name: "readme", Bin: rategateBinary(t), Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rg.Kill)
	cmd := exec.Command("bash", "-eu", "-c", strings.ReplaceAll(loop, "127.0.0.1:8080", rg.Main))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's loop: %v\n%s", err, out)
	}
	if got, want := string(out), "204\n204\n204\n204\n204\n429\n429\n"; got != want {
		t.Fatalf("the README's loop printed %q, the README says five 204 then 429: %q", got, want)
	}
}

// TestReadmeRedisAndNginx runs the README's second quick start: the same
// commands (checked to be there), each with its port rewritten to a free
// one: Redis, rategate on it, a demo application, the shipped nginx.conf,
// and the curl, which must get the application's answer with rategate's
// headers.
func TestReadmeRedisAndNginx(t *testing.T) {
	blockWith(t, "redis-server --port 6379", "-redis redis://127.0.0.1:6379/0",
		"python3 -m http.server 8001", "nginx -p /tmp/gw/ -c nginx.conf", "curl -i http://127.0.0.1:8000/")
	srv := testredis.Start(t)
	rg, err := procs.StartRategate(procs.Options{Name: "readme-redis", Bin: rategateBinary(t), Dir: t.TempDir(),
		Args: []string{"-redis", "redis://" + srv.Addr + "/0"}, Ready: "readyz"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rg.Kill)
	py := needBinary(t, "python3", "python3")
	appLog := filepath.Join(t.TempDir(), "app.log")
	appPort, _ := startOnFreePort(t, "python3 -m http.server", appLog, 10*time.Second, func(port int) *proc {
		return startProc(t, "http.server", appLog, py, "-m", "http.server", strconv.Itoa(port), "--bind", "127.0.0.1")
	}, func(port int) error {
		return httpStatus(fmt.Sprintf("http://127.0.0.1:%d/", port), http.StatusOK)
	})
	n := startNginx(t, "readme", "nginx.conf", rewrite{rategates: []string{rg.Main}, app: fmt.Sprintf("127.0.0.1:%d", appPort)})
	r := n.do(t, request{Path: "/"})
	wantStatus(t, r, 200)
	wantHeader(t, r, "RateLimit-Policy", `"global";q=1000;w=1`)
	if !strings.Contains(r.Body, "Directory listing") {
		t.Errorf("not the demo application's answer: %.200s", r.Body)
	}
}
