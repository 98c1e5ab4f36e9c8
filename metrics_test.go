package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/rategate/rategate/internal/testredis"
)

// scrape reads /metrics and parses it with Prometheus's own text parser.
func (p *proc) scrape() map[string]*dto.MetricFamily {
	p.t.Helper()
	out := p.api("GET", "/metrics", "", 200)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(out))
	if err != nil {
		p.t.Fatalf("/metrics does not parse: %v\n%s", err, out)
	}
	return fams
}

// metric finds the sample of a family whose labels include the given
// name, value pairs; nil when absent.
func metric(fams map[string]*dto.MetricFamily, name string, labels ...string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value returns a counter's, gauge's or untyped sample's value, -1 when absent.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	m := metric(fams, name, labels...)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return -1
}

// rawStatus sends request bytes as they are and returns the status.
func rawStatus(t testing.TB, addr, request string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(request)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

const metricsConfig = `
redis:
  url: redis://%s/0
  key_prefix: %s
  timeout: 2s  # exact counts, not latency: no undecided answers on a loaded machine
failure_mode: allow
rules:
  - name: login
    match: {path: /login}
    key: [ip]
    algorithm: gcra
    limit: 2
    period: 1h
  - name: api-shadow
    match: {path: /api}
    key: [user]
    algorithm: sliding_log
    limit: 1
    period: 1h
    shadow: true
`

// TestMetricsExact sends a known mix of requests to a real process and
// checks every counter it should move, read with expfmt.
func TestMetricsExact(t *testing.T) {
	t.Parallel()
	rs := testredis.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	writeFile(t, cfg, fmt.Sprintf(metricsConfig, rs.Addr, uniquePrefix(t)))
	p := startRategate(t, "metrics", cfg, "")

	want := func(status int, kv ...string) {
		t.Helper()
		if got := p.auth(kv...); got != status {
			t.Fatalf("%v: %d, want %d", kv, got, status)
		}
	}
	for _, s := range []int{204, 204, 429} { // login: 2 allowed, 1 limited
		want(s, "X-Original-URI", "/login", "X-Real-IP", "192.0.2.10")
	}
	for i := 0; i < 3; i++ { // shadow: 1 allowed, then would-deny twice, never denies
		want(204, "X-Original-URI", "/api/items", "X-Real-IP", "192.0.2.11", "X-User-Id", "alice")
	}
	want(204, "X-Original-URI", "/static/x.css", "X-Real-IP", "192.0.2.12") // no rule
	want(400, "X-Real-IP", "192.0.2.13")                                    // no URI
	want(400, "X-Real-IP", "192.0.2.13")                                    // no URI
	want(400, "X-Original-URI", "/login", "X-Real-IP", "not-an-ip")         // bad IP

	m := p.scrape()
	exact := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"rategate_decisions_total", []string{"rule", "login", "decision", "allowed"}, 2},
		{"rategate_decisions_total", []string{"rule", "login", "decision", "limited"}, 1},
		{"rategate_decisions_total", []string{"rule", "login", "decision", "shadow_limited"}, 0},
		{"rategate_decisions_total", []string{"rule", "api-shadow", "decision", "allowed"}, 1},
		{"rategate_decisions_total", []string{"rule", "api-shadow", "decision", "limited"}, 0},
		{"rategate_decisions_total", []string{"rule", "api-shadow", "decision", "shadow_limited"}, 2},
		{"rategate_requests_total", []string{"outcome", "allowed"}, 5},
		{"rategate_requests_total", []string{"outcome", "limited"}, 1},
		{"rategate_requests_total", []string{"outcome", "no_match"}, 1},
		{"rategate_requests_total", []string{"outcome", "bad_request"}, 3},
		{"rategate_requests_total", []string{"outcome", "unavailable"}, 0},
		{"rategate_bad_requests_total", []string{"reason", "missing_uri"}, 2},
		{"rategate_bad_requests_total", []string{"reason", "invalid_ip"}, 1},
		{"rategate_bad_requests_total", []string{"reason", "invalid_cost"}, 0},
		{"rategate_failure_mode_decisions_total", []string{"mode", "allow"}, 0},
		{"rategate_store_errors_total", []string{"op", "decide", "kind", "connection"}, 0},
		{"rategate_config_reloads_total", []string{"result", "success"}, 0},
		{"rategate_config_reloads_total", []string{"result", "error"}, 0},
		{"rategate_rules", nil, 2},
		{"rategate_rule_limit", []string{"rule", "login"}, 2},
		{"rategate_rule_shadow", []string{"rule", "api-shadow"}, 1},
		{"rategate_rule_override_active", []string{"rule", "login"}, 0},
	}
	for _, e := range exact {
		if got := value(m, e.name, e.labels...); got != e.want {
			t.Errorf("%s%v = %v, want %v", e.name, e.labels, got, e.want)
		}
	}
	// Histograms: one observation per request of each outcome; one store
	// decide per request that matched a rule (3 login + 3 api).
	for outcome, n := range map[string]uint64{"allowed": 5, "limited": 1, "no_match": 1, "bad_request": 3} {
		h := metric(m, "rategate_request_duration_seconds", "outcome", outcome).GetHistogram()
		if h.GetSampleCount() != n {
			t.Errorf("request_duration{outcome=%s} count %d, want %d", outcome, h.GetSampleCount(), n)
		}
		b := h.GetBucket()
		if len(b) < 10 || b[0].GetUpperBound() > 0.0001 || b[len(b)-1].GetCumulativeCount() != n {
			t.Errorf("request_duration{outcome=%s} buckets %v", outcome, b)
		}
	}
	if h := metric(m, "rategate_store_duration_seconds", "op", "decide").GetHistogram(); h.GetSampleCount() != 6 {
		t.Errorf("store_duration{op=decide} count %d, want 6", h.GetSampleCount())
	}
	if m["rategate_request_duration_seconds"].GetType() != dto.MetricType_HISTOGRAM {
		t.Errorf("request duration is %v, want a histogram", m["rategate_request_duration_seconds"].GetType())
	}
	// Redis health, Go and process metrics.
	within(t, 3*time.Second, "redis INFO read", func() error {
		if got := value(p.scrape(), "rategate_redis_up"); got != 1 {
			return fmt.Errorf("rategate_redis_up %v", got)
		}
		return nil
	})
	m = p.scrape()
	for _, name := range []string{"rategate_redis_used_memory_bytes", "rategate_redis_connected_clients", "go_goroutines",
		"go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "process_open_fds", "process_max_fds"} {
		if got := value(m, name); got <= 0 {
			t.Errorf("%s = %v, want > 0", name, got)
		}
	}
	for _, name := range []string{"rategate_redis_ops_per_second", "rategate_redis_evicted_keys_total", "rategate_redis_expired_keys_total",
		"process_cpu_seconds_total", "go_gc_cpu_seconds_total", "go_threads"} {
		if got := value(m, name); got < 0 {
			t.Errorf("%s missing", name)
		}
	}

	// Redis gone: while the breaker is still closed (one failure), the
	// request is decided by the local fallback, whatever failure_mode
	// says; counted by reason and error kind. The error is the deadline
	// (timeout) or the refusal (connection).
	rs.Stop()
	want(204, "X-Original-URI", "/login", "X-Real-IP", "192.0.2.20")
	m = p.scrape()
	for _, e := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"rategate_local_decisions_total", []string{"reason", "call_failed"}, 1},
		{"rategate_failure_mode_decisions_total", []string{"mode", "allow"}, 0},
		{"rategate_requests_total", []string{"outcome", "unavailable"}, 0},
		{"rategate_store_errors_total", []string{"op", "decide", "kind", "script"}, 0},
		{"rategate_store_errors_total", []string{"op", "decide", "kind", "cluster"}, 0},
		{"rategate_store_errors_total", []string{"op", "decide", "kind", "other"}, 0},
	} {
		if got := value(m, e.name, e.labels...); got != e.want {
			t.Errorf("after Redis stopped: %s%v = %v, want %v", e.name, e.labels, got, e.want)
		}
	}
	if got := value(m, "rategate_store_errors_total", "op", "decide", "kind", "timeout") +
		value(m, "rategate_store_errors_total", "op", "decide", "kind", "connection"); got != 1 {
		t.Errorf("after Redis stopped: decide errors of kind timeout+connection = %v, want 1", got)
	}
	within(t, 8*time.Second, "redis_up drops", func() error {
		if got := value(p.scrape(), "rategate_redis_up"); got != 0 {
			return fmt.Errorf("rategate_redis_up %v", got)
		}
		return nil
	})
}
