package procs

import (
	"os"
	"sync"
	"testing"
	"time"
)

var testBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// TestBinary builds rategate once per test binary and returns its path.
// Call RemoveTestBinary from TestMain to delete it afterwards.
func TestBinary(t testing.TB) string {
	t.Helper()
	testBuild.once.Do(func() {
		testBuild.dir, testBuild.err = os.MkdirTemp("", "rategate-bin-")
		if testBuild.err == nil {
			testBuild.path, testBuild.err = Build(testBuild.dir)
		}
	})
	if testBuild.err != nil {
		t.Fatal(testBuild.err)
	}
	return testBuild.path
}

// RemoveTestBinary deletes what TestBinary built.
func RemoveTestBinary() {
	if testBuild.dir != "" {
		os.RemoveAll(testBuild.dir)
	}
}

// StartT is StartRategate for a test: Bin defaults to TestBinary and Dir to
// a temporary directory; a failure fails the test; at cleanup the process
// gets SIGTERM and the test fails unless it exits 0 within 10 s.
func StartT(t testing.TB, o Options) *Rategate {
	t.Helper()
	if o.Bin == "" {
		o.Bin = TestBinary(t)
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	r, err := StartRategate(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r.Exited() {
			return
		}
		if err := r.Stop(10 * time.Second); err != nil {
			t.Errorf("%s: %v\n%s", r.Name, err, r.LogTail(40))
		}
	})
	return r
}
