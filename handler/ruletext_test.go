package handler

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/valyala/fasthttp"
)

// ruleSets are the rules of successive answers: rules that swap places,
// more than a scratch keeps, a rule of the same name with other numbers
// (a reload), and the first set again.
func ruleSets() [][]*limits.Rule {
	rule := func(name string, limit int64, period time.Duration) *limits.Rule {
		return &limits.Rule{Name: name, Limit: limit, Period: period, Burst: limit}
	}
	a, b := rule("a", 5, time.Minute), rule("b", 7, 1500*time.Millisecond)
	var many []*limits.Rule
	for i := range maxRuleTexts + 3 {
		many = append(many, rule("r"+strconv.Itoa(i), int64(100-i), time.Duration(i+1)*time.Second))
	}
	reloaded := rule("a", 9, 2*time.Minute)
	return [][]*limits.Rule{{a, b}, {b, a}, many, {a}, {reloaded}, {b, reloaded}, many[3:], {a, b}}
}

// TestRuleTextFollowsTheRules: the header text a scratch keeps per verdict
// position is that of the rule now in that position, whether rules swap
// places, come past the kept positions, or a rule of the same name comes
// back with other numbers (a reload).
func TestRuleTextFollowsTheRules(t *testing.T) {
	var d canned
	h := New(&d, nil, Options{})
	for _, rules := range ruleSets() {
		d = canned{Admitted: true, Denier: -1}
		var policy, rl []string
		least := rules[0]
		for i, r := range rules {
			rem := int64(50 - i)
			d.Verdicts = append(d.Verdicts, limits.Verdict{Rule: r, Cost: 1, Result: limits.Result{Allowed: true, Remaining: rem, ResetUS: 2_000_000}})
			q, w, _ := limits.PolicyWindow(r.Limit, r.Period)
			policy = append(policy, fmt.Sprintf("%q;q=%d;w=%d", r.Name, q, w))
			rl = append(rl, fmt.Sprintf("%q;r=%d;t=2", r.Name, rem))
			least = r
		}
		ctx := &fasthttp.RequestCtx{}
		ctx.Request.SetRequestURI("/auth")
		ctx.Request.Header.Set("X-Original-URI", "/x")
		ctx.Request.Header.Set("X-Real-IP", "192.0.2.1")
		h.Serve(ctx)
		got := func(name string) (v string) {
			// The names are sent as spelled (SetCanonical), which Peek
			// would not find.
			for k, val := range ctx.Response.Header.All() {
				if string(k) == name {
					v = string(val)
				}
			}
			return v
		}
		equal(t, 204, ctx.Response.StatusCode(), "status")
		equal(t, strings.Join(policy, ", "), got("RateLimit-Policy"), "policy")
		equal(t, strings.Join(rl, ", "), got("RateLimit"), "RateLimit")
		equal(t, strconv.FormatInt(least.Limit, 10), got("X-RateLimit-Limit"), "limit of %s", least.Name)
	}
}

// TestScratchRuleText: the same, on one scratch, without the pool (which
// may hand another scratch back, and under -race drops some): every text
// ruleText returns is the one of the rule asked for, through the same
// sequence of rule sets.
func TestScratchRuleText(t *testing.T) {
	var s scratch
	for _, rules := range ruleSets() {
		for i, r := range rules {
			q, w, _ := limits.PolicyWindow(r.Limit, r.Period)
			text := s.ruleText(i, r)
			equal(t, fmt.Sprintf("%q;q=%d;w=%d", r.Name, q, w), string(text.policy), "policy of %s at %d", r.Name, i)
			equal(t, fmt.Sprintf("%q", r.Name), string(text.name()), "name of %s at %d", r.Name, i)
			equal(t, strconv.FormatInt(r.Limit, 10), string(text.limit), "limit of %s at %d", r.Name, i)
		}
	}
}
