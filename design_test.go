package main

import (
	"os"
	"os/exec"
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
