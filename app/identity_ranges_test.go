package app

import (
	"strings"
	"testing"

	"github.com/rategate/rategate/config"
)

// TestNestedRangeExceptions: range exceptions apply in file order, the first
// that holds an address wins, so a block of a subnet written after an
// exemption of a network holding it would never apply (its requests exempt,
// not even counted): the config is refused with the fix. Written narrower
// first, or on another value of the rule's other key part, both apply.
func TestNestedRangeExceptions(t *testing.T) {
	const head = `
rules:
  - name: per-ip
    key: [ip, method]
    algorithm: fixed_window
    limit: 3
    period: 1h
    exceptions:
`
	const office = "      - match: {ip: 10.0.0.0/8, method: GET}\n        exempt: true\n        reason: office and VPN\n"
	const farm = "      - match: {ip: 10.1.2.0/24, method: GET}\n        block: true\n        reason: compromised build farm\n"
	const farmPost = "      - match: {ip: 10.1.2.0/24, method: POST}\n        block: true\n"
	_, err := config.Parse("x.yaml", []byte(head+office+farm))
	if err == nil || !strings.Contains(err.Error(), "lies inside exceptions[0]'s 10.0.0.0/8") {
		t.Fatalf("block of 10.1.2.0/24 after the exemption of 10.0.0.0/8: %v, want refused", err)
	}
	s := newStack(t, head+farm+office+farmPost, "")
	for _, c := range []struct {
		ip, method string
		want       int
	}{{"10.1.2.3", "GET", 429}, {"10.1.2.3", "POST", 429}, {"10.9.9.9", "GET", 204}, {"10.9.9.9", "POST", 204}} {
		for i := 0; i < 5; i++ {
			code := s.ask("X-Original-URI", "/x", "X-Real-IP", c.ip, "X-Original-Method", c.method)
			want := c.want
			if c.method == "POST" && c.want == 204 && i >= 3 {
				want = 429 // counted: the rule's 3 an hour
			}
			if code != want {
				t.Errorf("%s %s, request %d: %d, want %d", c.method, c.ip, i+1, code, want)
			}
		}
	}
}
