package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDesignImportGraph: the import graph in docs/design.md is what
// `make graph` prints for the tree as it is.
func TestDesignImportGraph(t *testing.T) {
	out, err := exec.Command("make", "-s", "graph").CombinedOutput()
	if err != nil {
		t.Fatalf("make graph: %v\n%s", err, out)
	}
	doc, err := os.ReadFile("docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- graph:begin -->\n```\n", "```\n<!-- graph:end -->"
	s := string(doc)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("docs/design.md has no graph block (%q ... %q)", begin, end)
	}
	if got := s[i+len(begin) : j]; got != string(out) {
		t.Fatalf("docs/design.md's import graph is out of date; replace the block with `make -s graph`:\n%s", out)
	}
}

// TestRaceSkippedTestsRunWithoutRace: a test that skips under the race
// detector (allocation counts, heap sizes) runs in `make test` only
// through the Makefile's second, race-free `go test -run` line; one whose
// name or package that line misses would never run at all.
func TestRaceSkippedTestsRunWithoutRace(t *testing.T) {
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^\t\$\(GO\) test -count=1 -run '([^']+)' ((?:\./\S+/ ?)+)$`).FindSubmatch(mk)
	if line == nil {
		t.Fatal("no race-free `$(GO) test -count=1 -run '...' ./pkg/...` line in the Makefile")
	}
	run := regexp.MustCompile(string(line[1]))
	pkgs := map[string]bool{}
	for _, p := range strings.Fields(string(line[2])) {
		pkgs[strings.Trim(p, "./")] = true
	}
	funcRE := regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\) \{\n(?:.*\n){0,2}?\s*if (?:raceEnabled|race\.Enabled) \{\n\s*t\.Skip`)
	n := 0
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcRE.FindAllSubmatch(src, -1) {
			n++
			name, dir := string(m[1]), filepath.Dir(path)
			if !run.MatchString(name) || !pkgs[dir] {
				t.Errorf("%s (%s) skips under -race but the Makefile's race-free run (-run '%s' %s) misses it", name, path, line[1], line[2])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d tests skip under -race", n)
	if n < 10 {
		t.Fatalf("found %d tests that skip under -race; the pattern no longer finds them", n)
	}
}
