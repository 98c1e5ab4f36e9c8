package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// binPath is the rategate binary every test runs, built once by TestMain
// without -race: the suite measures answer times, and those of a -race
// build say little about production. The Go code itself is race-tested by
// the unit tests.
var binPath string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "rategate-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "rategate")
	goBin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults: the go command is needed to build rategate:", err)
		return 1
	}
	build := exec.Command(goBin, "build", "-o", binPath, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "faults: go build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}
