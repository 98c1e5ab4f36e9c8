package app

import (
	"testing"

	"github.com/rategate/rategate/config"
)

// TestProbeAShadowedRangeException (probe A, failing test): range
// exceptions are checked "in file order", first match wins
// (limits/identities.go IdentityTable.resolve). A careless but natural
// config, a broad exemption for the office network followed by a block of
// one compromised subnet inside it, is accepted by config validation
// (rategate -check prints both) while the block can never apply: every
// address of 10.1.2.0/24 is in 10.0.0.0/8, which exempts it first. The
// operator believes 10.1.2.0/24 is blocked; its requests are not even
// counted. The config file refuses an exception that names the same
// identity as an earlier one ("names the same identity as exceptions[j]");
// one wholly covered by an earlier range is equally dead and should be
// refused with a reason (or the narrower range should win).
func TestProbeAShadowedRangeException(t *testing.T) {
	const yaml = `
rules:
  - name: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 3
    period: 1h
    exceptions:
      - match: {ip: 10.0.0.0/8}
        exempt: true
        reason: office and VPN
      - match: {ip: 10.1.2.0/24}
        block: true
        reason: compromised build farm
`
	_, perr := config.Parse("x.yaml", []byte(yaml))
	if perr == nil {
		t.Errorf("config with exceptions[1] (10.1.2.0/24 block) wholly inside exceptions[0] (10.0.0.0/8 exempt) accepted: the block can never apply")
	}
	if perr != nil {
		return
	}
	s := newStack(t, yaml, "")
	admitted := 0
	for i := 0; i < 10; i++ {
		if s.ask("X-Original-URI", "/x", "X-Real-IP", "10.1.2.3") == 204 {
			admitted++
		}
	}
	if admitted > 0 {
		t.Errorf("10.1.2.3, inside the blocked 10.1.2.0/24: %d of 10 admitted (exempt by the earlier 10.0.0.0/8), want 0", admitted)
	}
}
