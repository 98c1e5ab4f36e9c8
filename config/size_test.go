package config

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestLoadRefusesAHugeFile: Load read the whole file, whatever its size
// or kind, and yaml.v3 builds a node per value (some 35 to 90 bytes of
// memory per byte of a long list): a 72 MB list took a running rategate
// from 17 MB to 2.5 GB of RSS and 10 s on POST /v1/reload (refused in the
// end for its unknown key, the memory kept), and -config /dev/zero read
// until "fatal error: out of memory" with a stack trace. A file over the
// bound must be refused, naming the file and the bound, having read no
// more than the bound.
func TestLoadRefusesAHugeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	line := "# " + strings.Repeat("x", 97) + "\n"
	src := "rules: []\n" + strings.Repeat(line, 300_000) // 30 MB
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Load(path)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a 30 MB config file was accepted: rategate reads any size (a 72 MB list costs 2.5 GB)")
	}
	for _, want := range []string{path, "MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
		t.Errorf("refusing the file allocated %d MB: it read past the bound", got>>20)
	}
}
