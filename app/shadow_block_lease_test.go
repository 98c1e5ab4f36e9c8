package app

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/rategate/rategate/limits"
)

// counterValue reads one sample of a's /metrics exposition by its exact
// series text (name{labels}); -1 when absent.
func counterValue(a *App, series string) float64 {
	var b bytes.Buffer
	a.Metrics().WritePrometheus(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return -1
}

// A shadow rule's block only reports (docs/identities.md: "A shadow rule's
// block only reports (shadow_limited), as a shadow rule does"). With a
// leased rule after it, the block's verdict (which has no store check)
// shifted decideLeased's verdict indexes against the check indexes: the
// rule after the leased one was never asked (3 of 3 admitted at 1 an
// hour), or, the leased rule last, Decide panicked and took the process
// down.
const (
	ruleWatch = `
  - name: watch
    key: [ip]
    algorithm: fixed_window
    limit: 100
    period: 1h
    shadow: true
    exceptions:
      - match: {ip: 192.0.2.66}
        block: true`
	ruleLeased = `
  - name: leased
    key: [ip]
    algorithm: fixed_window
    limit: 100
    period: 1h
    lease: true`
	ruleTight = `
  - name: tight
    key: [ip]
    algorithm: fixed_window
    limit: 1
    period: 1h`
	shadowBlockThenLeased = "rules:" + ruleWatch + ruleLeased + ruleTight + "\n"
)

// TestShadowBlockBeforeLeasedRuleKeepsOtherRulesEnforcedAndCounted: an
// identity a shadow rule blocks must be limited by the other rules as
// anyone else, and rategate_decisions_total must say so: "tight" (1 an
// hour) admits one request of three and counts 1 allowed, 2 limited.
func TestShadowBlockBeforeLeasedRuleKeepsOtherRulesEnforcedAndCounted(t *testing.T) {
	s := newStack(t, shadowBlockThenLeased, "redis")
	var codes []int
	for i := 0; i < 3; i++ {
		codes = append(codes, s.ask("X-Original-URI", "/x", "X-Real-IP", "192.0.2.66"))
	}
	if fmt.Sprint(codes) != "[204 429 429]" {
		t.Errorf("answers %v, want [204 429 429]: rule tight (1 an hour) is not enforced for an identity a shadow rule blocks", codes)
	}
	for series, want := range map[string]float64{
		`rategate_decisions_total{rule="tight",decision="allowed"}`:        1,
		`rategate_decisions_total{rule="tight",decision="limited"}`:        2,
		`rategate_decisions_total{rule="watch",decision="shadow_limited"}`: 3,
	} {
		if got := counterValue(s.app, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

const shadowBlockThenPlainThenLeased = "rules:" + ruleWatch + ruleTight + ruleLeased + "\n"

// TestShadowBlockBeforeLeasedRuleDoesNotPanic: the same with the leased
// rule last: the request of an identity a shadow rule blocks panics in
// decideLeased (index out of range), and nothing recovers it on the /auth
// path, so one request from that identity kills the process. Called on
// the limiter directly so that the panic fails this test only.
func TestShadowBlockBeforeLeasedRuleDoesNotPanic(t *testing.T) {
	s := newStack(t, shadowBlockThenPlainThenLeased, "redis")
	var d limits.Decision
	req := &limits.Request{Route: []byte("/x"), IP: []byte("192.0.2.66")}
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Decide panicked for an identity a shadow rule blocks (the /auth handler has no recover: the process exits): %v", p)
			}
		}()
		req.Addr = netip.MustParseAddr("192.0.2.66")
		err = s.limiter.Decide(context.Background(), req, &d)
	}()
	if err != nil || !d.Admitted {
		t.Fatalf("first request: admitted=%v err=%v, want admitted", d.Admitted, err)
	}
}
