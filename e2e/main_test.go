//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rategate/rategate/internal/procs"
)

var (
	// repoRoot is the rategate module root (the parent of e2e/).
	repoRoot string
	// workDir holds everything a run writes: the binary, nginx prefixes,
	// configs and logs. It is world-readable because nginx workers run as
	// nobody when the suite runs as root.
	workDir string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	root, err := filepath.Abs("..")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	repoRoot = root
	dir, err := os.MkdirTemp("", "rategate-e2e-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: work directory:", err)
		return 1
	}
	workDir = dir
	code := m.Run()
	if os.Getenv("RATEGATE_E2E_KEEP") != "" {
		fmt.Println("e2e: work directory kept:", dir)
	} else {
		os.RemoveAll(dir)
	}
	return code
}

// installHint is the Debian command that provides a binary the suite runs.
func installHint(pkg string) string {
	return fmt.Sprintf("apt-get update && apt-get install -y %s (or run `make deps`)", pkg)
}

// needBinary returns the path of a binary the suite needs, or fails the
// test with the command that installs it. Never a skip: a suite that
// silently runs nothing proves nothing.
func needBinary(t testing.TB, name, pkg string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	// root's PATH may lack the sbin directories where nginx lives.
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/local/openresty/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	t.Fatalf("%s not found in PATH: %s", name, installHint(pkg))
	return ""
}

// luaModules are the modules nginx/lua-modules.conf loads.
var luaModules = []string{
	"/usr/lib/nginx/modules/ndk_http_module.so",
	"/usr/lib/nginx/modules/ngx_http_lua_module.so",
}

// needLuaModule fails the test when Debian's lua-nginx-module is missing.
func needLuaModule(t testing.TB) {
	t.Helper()
	for _, m := range luaModules {
		if _, err := os.Stat(m); err != nil {
			t.Fatalf("%s not found: %s", m, installHint("libnginx-mod-http-lua"))
		}
	}
}

var build struct {
	once sync.Once
	path string
	err  error
}

// rategateBinary builds rategate from the repository once per run
// (internal/procs) and returns its path. RATEGATE_BINARY names a prebuilt
// binary to test instead (a release build, say).
func rategateBinary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		dir := filepath.Join(workDir, "bin")
		if build.err = os.MkdirAll(dir, 0o755); build.err == nil {
			build.path, build.err = procs.Build(dir)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}
