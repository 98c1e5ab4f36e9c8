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
	wantKeyCallsRefused(t, s, "given twice",
		"/v1/keys/r?ip=192.0.2.7&ip=192.0.2.8&header.X-Plan=free",
		"/v1/keys/r?ip=192.0.2.7&header.X-Plan=free&header.x-plan=gold")
	if got := s.ask(a...); got != 429 {
		t.Errorf("192.0.2.7 after the refused resets: %d, want 429 (nothing reset)", got)
	}
	if got := s.ask(b...); got != 429 {
		t.Errorf("192.0.2.8 after the refused resets: %d, want 429 (nothing reset)", got)
	}
}

// wantKeyCallsRefused checks that GET and DELETE of each /v1/keys uri
// answer 400 with want in the body.
func wantKeyCallsRefused(t *testing.T, s *stack, want string, uris ...string) {
	t.Helper()
	for _, uri := range uris {
		for _, method := range []string{"GET", "DELETE"} {
			if code, out := call(t, s.admin, method, uri, ""); code != 400 || !strings.Contains(out, want) {
				t.Errorf("%s %s: %d %.300s, want 400 saying %q", method, uri, code, out, want)
			}
		}
	}
}
