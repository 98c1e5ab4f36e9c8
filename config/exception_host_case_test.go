package config

import (
	"testing"

	"github.com/rategate/rategate/limits"
)

// TestExceptionHostNonASCIIUpperCase: docs/identities.md says hosts are
// normalized "lower-case" so that an exception or override lands on the
// identity's own key, and the config accepts "BÜCHER.example" (its check
// lower-cases with strings.ToLower, Unicode included), but the identity is
// built with limits.AppendHost, which lower-cases ASCII only:
// "b%C3%9Ccher.example" (capital Ü). match.host, written the same way,
// matches both spellings (strings.EqualFold). Through the real /auth a
// block written for BÜCHER.example denied 6 of 6 requests for host
// bÜcher.example and 0 of 6 for bücher.example (3 of 6 admitted, the
// rule's own limit): the block misses the lower-case host it names.
func TestExceptionHostNonASCIIUpperCase(t *testing.T) {
	id, ok := exceptionNaming(t, `
rules:
  - name: byh
    key: [host]
    algorithm: fixed_window
    limit: 3
    period: 1h
    exceptions:
      - match: {host: "BÜCHER.example"}
        block: true
`)
	if !ok {
		return
	}
	c, _ := Parse("x.yaml", []byte("rules:\n  - name: byh\n    key: [host]\n    algorithm: fixed_window\n    limit: 3\n    period: 1h\n"))
	lower := &limits.Request{Host: limits.AppendHost(nil, []byte("bücher.example"))}
	lowerID, _ := limits.KeyIdentity(c.Rules[0], lower)
	if id != lowerID {
		t.Fatalf("exception {host: BÜCHER.example} block was accepted and names %q; a request for the lower-case host bücher.example "+
			"is %q, which it does not block (want the file refused, or the lower-case host's identity)", id, lowerID)
	}
}
