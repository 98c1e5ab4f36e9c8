package procs

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestStartRategateRetriesATakenPort: a port StartRategate picked may be
// taken by another test's server before rategate binds it; rategate then
// stops at once, and StartRategate starts it again on other ports instead
// of failing the test that asked for it.
func TestStartRategateRetriesATakenPort(t *testing.T) {
	bin, err := Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	handed := 0
	freePort = func() (int, error) {
		handed++
		if handed == 2 { // the first try's admin port
			return takenPort, nil
		}
		return FreePort()
	}
	defer func() { freePort = FreePort }()
	r, err := StartRategate(Options{Bin: bin, Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("StartRategate with its admin port taken once: %v", err)
	}
	defer r.Kill()
	if strings.HasSuffix(r.Admin, ":"+strconv.Itoa(takenPort)) || handed < 4 {
		t.Fatalf("admin %s after %d ports handed out, want a second try on other ports", r.Admin, handed)
	}
}
