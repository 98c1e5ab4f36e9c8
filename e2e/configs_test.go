//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
)

// shippedConfigs are the complete configs in nginx/ that run on this
// machine's nginx (compose.conf needs the compose service names; see
// TestComposeNginxConfig).
var shippedConfigs = []string{"nginx.conf", "nginx-quiet.conf", "openresty.conf", "nginx-auth.conf", "openresty-auth.conf"}

// TestShippedConfigsParse runs `nginx -t` on an unmodified copy of nginx/.
func TestShippedConfigsParse(t *testing.T) {
	bin := needBinary(t, "nginx", "nginx")
	needLuaModule(t)
	prefix := filepath.Join(workDir, "unmodified")
	copyNginxDir(t, prefix, rewrite{})
	for _, conf := range shippedConfigs {
		out, err := exec.Command(bin, "-t", "-p", prefix+"/", "-c", conf).CombinedOutput()
		if err != nil {
			t.Errorf("nginx -t -c %s: %v\n%s", conf, err, out)
		}
	}
}

// TestShippedConfigsRunUnprivileged starts every config as an unprivileged
// user (nobody, when the suite runs as root; the suite's own user
// otherwise): no path outside the prefix, no `user` directive needed.
// The gateway tests run them as root.
func TestShippedConfigsRunUnprivileged(t *testing.T) {
	bin := needBinary(t, "nginx", "nginx")
	needLuaModule(t)
	var wrap []string
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		nobody, err := user.Lookup("nobody")
		if err != nil {
			t.Fatalf("look up user nobody: %v", err)
		}
		uid, _ = strconv.Atoi(nobody.Uid)
		gid, _ = strconv.Atoi(nobody.Gid)
		wrap = []string{needBinary(t, "runuser", "util-linux"), "-u", "nobody", "--"}
	}
	for _, conf := range shippedConfigs {
		t.Run(conf, func(t *testing.T) {
			prefix := filepath.Join(workDir, "unprivileged-"+safeName(conf))
			logPath := filepath.Join(workDir, "unprivileged-"+safeName(conf)+".log")
			_, _, err := onFreePort(t, logPath, 10*time.Second, func(port int) *proc {
				copyNginxDir(t, prefix, rewrite{listen: port})
				if uid >= 0 {
					err := filepath.Walk(prefix, func(p string, _ os.FileInfo, err error) error {
						if err != nil {
							return err
						}
						return os.Chown(p, uid, gid)
					})
					if err != nil {
						t.Fatal(err)
					}
				}
				args := append(append([]string{}, wrap...), bin, "-p", prefix+"/", "-c", conf, "-g", "daemon off;")
				return startProc(t, "nginx "+conf, logPath, args[0], args[1:]...)
			}, func(port int) error {
				return httpStatus(fmt.Sprintf("http://127.0.0.1:%d/nginx-health", port), http.StatusOK)
			})
			if err != nil {
				t.Fatalf("nginx -c %s as an unprivileged user: %v\nerror.log:\n%s",
					conf, err, procs.FileTail(filepath.Join(prefix, "logs", "error.log"), 10))
			}
		})
	}
}
