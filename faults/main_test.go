package faults

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/rategate/rategate/internal/procs"
)

// binPath is the rategate binary every test runs, built once by TestMain
// (without -race: the suite measures answer times, and those of a -race
// build say little about production; the Go code itself is race-tested by
// the unit tests).
var binPath string

// functions is redis.functions in every config of the suite: make test runs
// the suite on both ways of deciding (FCALL of the function library, and
// EVALSHA with -faults.functions=false).
var functions = flag.Bool("faults.functions", true, "redis.functions of the rategate processes (false: EVALSHA)")

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
	if binPath, err = procs.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		return 1
	}
	return m.Run()
}
