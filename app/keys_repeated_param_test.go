package app

import (
	"strings"
	"testing"

	"github.com/rategate/rategate/limits"
)

// TestKeyResetRefusesARepeatedParameter: DELETE /v1/keys/r?ip=A&ip=B (two
// clients to unban, one call) answered 200 and reset A alone, B still
// denied, without a word; header.X-Plan=a&header.x-plan=b the same.
// /v1/rules/{rule}/identities refuses a dimension given twice ("given
// twice"); the key endpoints must too, and reset nothing.
func TestKeyResetRefusesARepeatedParameter(t *testing.T) {
	s := newStack(t, ruleYAML(limits.FixedWindow, false), "")
	a := []string{"X-Original-URI", "/a", "X-Real-IP", "192.0.2.7", "X-Plan", "free"}
	b := []string{"X-Original-URI", "/a", "X-Real-IP", "192.0.2.8", "X-Plan", "free"}
	for range 3 {
		s.ask(a...)
		s.ask(b...)
	}
	for _, uri := range []string{
		"/v1/keys/r?ip=192.0.2.7&ip=192.0.2.8&header.X-Plan=free",
		"/v1/keys/r?ip=192.0.2.7&header.X-Plan=free&header.x-plan=gold",
	} {
		for _, method := range []string{"GET", "DELETE"} {
			code, out := call(t, s.admin, method, uri, "")
			if code != 400 || !strings.Contains(out, "given twice") {
				t.Errorf("%s %s: %d %s, want 400 naming the parameter given twice", method, uri, code, out)
			}
		}
	}
	if got := s.ask(a...); got != 429 {
		t.Errorf("192.0.2.7 after the refused resets: %d, want 429 (nothing reset)", got)
	}
	if got := s.ask(b...); got != 429 {
		t.Errorf("192.0.2.8 after the refused resets: %d, want 429 (nothing reset)", got)
	}
}
