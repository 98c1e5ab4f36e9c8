package app

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/limits"
)

// TestProbeGReloadOfACutInsideARule: docs/operations.md ("Reload") says of a
// config file rewritten in place and caught midway (what -watch reads when
// a tool truncates and writes): "while a cut inside a rule or an emptied
// file is refused, a cut between two rules is a valid, shorter policy".
// A cut inside the last rule that drops its trailing optional fields, or
// cuts a number short, is accepted, and the policy it applies hands out
// more than the file allows: a cost of 10 read as 1 (ten times the
// requests), and "exceptions:" with nothing under it (the block of an
// abuser gone), though "rules:" with nothing under it is refused for this
// very reason.
func TestProbeGReloadOfACutInsideARule(t *testing.T) {
	const full = `rules:
  - name: api
    key: [ip]
    algorithm: gcra
    limit: 100
    period: 1h
    cost: 10
    exceptions:
      - match: {ip: 203.0.113.66}
        block: true
`
	for _, tc := range []struct{ name, cutAfter string }{
		{"mid-number cost", "    cost: 1"},
		{"before exceptions", "    cost: 10\n"},
		{"empty exceptions", "    exceptions:\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, write := fileApp(t, full, zerolog.Nop())
			decide := func(ip string) bool {
				var d limits.Decision
				req := limits.Request{Route: []byte("/"), IP: []byte(ip), Addr: netip.MustParseAddr(ip)}
				if err := a.Limiter().Decide(context.Background(), &req, &d); err != nil {
					t.Fatal(err)
				}
				return d.Admitted
			}
			i := strings.Index(full, tc.cutAfter)
			if i < 0 {
				t.Fatal("bad cut")
			}
			cut := full[:i+len(tc.cutAfter)]
			write(cut) // an in-place rewrite caught midway
			res, err := a.Reload("file watch")
			if err == nil {
				t.Errorf("reload of the file cut inside its rule (%q) was accepted (%+v), want it refused as docs/operations.md says", cut[strings.LastIndex(cut[:len(cut)-1], "\n")+1:], res)
			}
			admitted := 0
			for range 30 {
				if decide("198.51.100.1") {
					admitted++
				}
			}
			if admitted > 10 {
				t.Errorf("after the reload of the cut file one client got %d of 30 requests admitted, the file allows 10 (100 per hour at cost 10)", admitted)
			}
			if decide("203.0.113.66") {
				t.Errorf("after the reload of the cut file the blocked 203.0.113.66 is admitted")
			}
		})
	}
}
