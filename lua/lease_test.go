package lua

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rategate/rategate/internal/testredis"
)

// TestLeaseScriptByHand: the assembled lease script (what `go run
// ./lua/print lease` prints) runs under redis-cli --eval as its header
// says: a take of at most 10 units of a fixed_window key, then a look that
// lists the slice, then its return.
func TestLeaseScriptByHand(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found: %s", testredis.InstallHint)
	}
	srv := testredis.Start(t)
	src, _ := Lease()
	file := filepath.Join(t.TempDir(), "lease.lua")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []string {
		t.Helper()
		full := append([]string{"-p", strconv.Itoa(srv.Port), "--eval", file, "rg:{demo:}:fw", "rg:{demo:}:lease", ","}, args...)
		out, err := exec.Command(cli, full...).CombinedOutput()
		if err != nil || strings.Contains(string(out), "ERR") {
			t.Fatalf("redis-cli %v: %v\n%s", full, err, out)
		}
		return strings.Fields(string(out))
	}
	take := run("0", "take", "1", "100", "3600000000", "100", "1", "10", "a-1", "0")
	// {now, granted, until, allowed, remaining, reset, retry}
	if len(take) != 7 || take[1] != "10" || take[3] != "1" || take[4] != "90" {
		t.Fatalf("take answered %v, want 10 granted and 90 remaining", take)
	}
	if look := run("0", "look", "1", "100", "3600000000", "100"); len(look) != 5 || look[1] != "1" || look[2] != "a-1" || look[3] != "10" {
		t.Fatalf("look answered %v, want the one slice a-1 of 10", look)
	}
	if back := run("0", "return", "1", "100", "3600000000", "100", "a-1", "4"); len(back) != 2 || back[1] != "4" {
		t.Fatalf("return answered %v, want 4 units back", back)
	}
	if n := fwCount(t, srv.Client(t), "rg:{demo:}:fw"); n != "6" {
		t.Fatalf("the count holds %q, want 6: 10 leased, 4 returned", n)
	}
}
