package config

import (
	"strings"
	"testing"
)

// TestInvalidUTF8NamesTheLine: a byte that is not UTF-8 (a Latin-1 "é"
// pasted into a header value, line 7 of a long file) was reported as the
// YAML decoder's "invalid leading UTF-8 octet", without a line; every other
// syntax error names its line.
func TestInvalidUTF8NamesTheLine(t *testing.T) {
	src := "rules:\n  - name: r1\n    key: [ip]\n    algorithm: fixed_window\n    limit: 5\n    period: 1m\n    match: {header: {X-Plan: \"caf\xe9\"}}\n"
	_, err := Parse("t.yaml", []byte(src))
	if err == nil {
		t.Fatal("accepted a file that is not UTF-8")
	}
	if !strings.Contains(err.Error(), "line 7") {
		t.Errorf("error %q does not say where the bad byte is (line 7)", err)
	}
}
