package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/policy"
)

// TestAdaptiveWiring: an adaptive rule, wired as the binary wires it (on
// the memory store and on Redis), follows a real HTTP signal; GET
// /v1/rules shows the factor, the signal and who set it, and /metrics
// exports the adaptive series, errors by reason included.
func TestAdaptiveWiring(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			var load atomic.Value
			load.Store("30")
			sig := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, load.Load().(string))
			}))
			defer sig.Close()
			redisAddr := ""
			if store == "redis" {
				redisAddr = "yes"
			}
			s := newStack(t, fmt.Sprintf(`rules:
  - name: api
    algorithm: fixed_window
    limit: 10
    period: 1h
    adaptive:
      http: {url: "%s/load"}
      steps: [{below: 50, factor: 2}, {below: 80, factor: 1}, {factor: 0.5}]
      interval: 1s
      cooldown: 0s
`, sig.URL), redisAddr)
			rules := func() policy.RuleView {
				code, body := call(t, s.admin, "GET", "/v1/rules", "")
				var v policy.RulesView
				if code != 200 || json.Unmarshal([]byte(body), &v) != nil || len(v.Rules) != 1 {
					t.Fatalf("GET /v1/rules: %d %s", code, body)
				}
				return v.Rules[0]
			}
			within(t, 5*time.Second, "factor x2", func() error {
				if rv := rules(); rv.Effective.Limit != 20 {
					return fmt.Errorf("effective %+v", rv.Effective)
				}
				return nil
			})
			av := rules().Adaptive
			if av == nil || av.Factor != 2 || av.Signal == nil || *av.Signal != 30 || av.SetBy != s.rules.Instance() || !av.Leader || !av.Applied {
				t.Fatalf("adaptive view %+v", av)
			}
			load.Store("oops")
			within(t, 5*time.Second, "an error counted", func() error {
				_, body := call(t, s.admin, "GET", "/metrics", "")
				// one error a second from here on: at least one (a poll
				// late by more than a second sees two)
				if !notANumber.MatchString(body) {
					return fmt.Errorf("no not_a_number error in the metrics")
				}
				return nil
			})
			_, body := call(t, s.admin, "GET", "/metrics", "")
			for _, want := range []string{
				`rategate_adaptive_factor{rule="api"} 2`,
				`rategate_adaptive_signal{rule="api"} 30`,
				`rategate_adaptive_leader{rule="api"} 1`,
				`rategate_adaptive_evaluation_errors_total{rule="api",reason="timeout"} 0`,
				`rategate_rule_limit{rule="api"} 20`,
				`rategate_rule_override_active{rule="api"} 0`,
			} {
				if !strings.Contains(body, want+"\n") {
					t.Errorf("/metrics lacks %s", want)
				}
			}
			if !strings.Contains(body, `rategate_adaptive_evaluations_total{rule="api"} `) {
				t.Error("/metrics lacks rategate_adaptive_evaluations_total")
			}
			if av := rules().Adaptive; !strings.HasPrefix(av.Error, "not_a_number") || av.Factor != 2 {
				t.Errorf("view while failing %+v: want the error and the factor kept", av)
			}
		})
	}
}

var notANumber = regexp.MustCompile(`(?m)^rategate_adaptive_evaluation_errors_total\{rule="api",reason="not_a_number"\} [1-9][0-9]*$`)
