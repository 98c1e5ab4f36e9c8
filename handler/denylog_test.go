package handler

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// logLines returns the JSON lines of buf whose message contains substr.
func (s *syncBuffer) jsonLines(t *testing.T, substr string) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(s.b.String(), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON (%v): %s", err, l)
		}
		if msg, _ := m["message"].(string); strings.Contains(msg, substr) {
			out = append(out, m)
		}
	}
	return out
}

// keyedEverywhere is a rule keyed on every identity dimension.
func keyedEverywhere(name string, limit int64) *limits.Rule {
	r := rule(name, limit, time.Minute, limits.KeyIP, limits.KeyUser, limits.KeyRoute, limits.KeyMethod, limits.KeyHost, limits.KeyHeader)
	r.Key[5].Header = "X-Plan"
	return r
}

// TestDenialLogLine: a denial line answers "why was this customer
// throttled?": which rule, who (every identity dimension), which key, the
// numbers, and NGINX's request id to find the request in the access log.
func TestDenialLogLine(t *testing.T) {
	var logs syncBuffer
	ts := pinned(t, Options{Logger: zerolog.New(&logs)}, keyedEverywhere("per-plan", 1))
	req := []string{"X-Original-URI", "/api//items?page=2", "X-Real-IP", "2001:db8:1:2::7", "X-User-Id", "alice",
		"X-Original-Method", "POST", "X-Original-Host", "API.example.com", "X-Plan", "free", "X-Request-Id", "0af7651916cd43dd8448eb211c80319c"}
	equal(t, 204, ts.auth(t, req...).status)
	equal(t, 429, ts.auth(t, req...).status)

	lines := logs.jsonLines(t, "request limited")
	mustEqual(t, 1, len(lines))
	want := map[string]any{
		"level":          "info",
		"message":        "request limited",
		"rule":           "per-plan",
		"ip":             "2001:db8:1:2::/64",
		"user":           "alice",
		"route":          "/api/items",
		"method":         "POST",
		"host":           "api.example.com",
		"headers":        map[string]any{"X-Plan": "free"},
		"key":            "rg:{per-plan:2001:db8:1:2::/64|alice|/api/items|POST|api.example.com|free}:fw2",
		"limit":          float64(1),
		"period_ms":      float64(60000),
		"remaining":      float64(0),
		"cost":           float64(1),
		"retry_after_ms": float64(42000),
		"request_id":     "0af7651916cd43dd8448eb211c80319c",
	}
	equal(t, want, lines[0])
}

// TestDenialLogLineOptionalFields: no request id, no header dimension, a
// cost that can never fit, a custom request id header.
func TestDenialLogLineOptionalFields(t *testing.T) {
	var logs syncBuffer
	ts := pinned(t, Options{Logger: zerolog.New(&logs), CostHeader: "X-Cost", RequestIDHeader: "X-Trace"},
		rule("per-ip", 5, time.Minute, limits.KeyIP))
	equal(t, 429, ts.auth(t, std("192.0.2.1", "X-Cost", "6", "X-Trace", "t-1", "X-Request-Id", "ignored")...).status)
	equal(t, 429, ts.auth(t, std("192.0.2.2", "X-Cost", "6")...).status)
	lines := logs.jsonLines(t, "request limited")
	mustEqual(t, 2, len(lines))
	for i, l := range lines {
		_, hasHeaders := l["headers"]
		_, hasRetry := l["retry_after_ms"]
		check(t, !hasHeaders && !hasRetry, "line %d: no headers dimension, no retry_after_ms for a cost that never fits: %v", i, l)
		equal(t, true, l["never_fits"], "line %d", i)
		equal(t, float64(6), l["cost"], "line %d", i)
		equal(t, float64(5), l["remaining"], "line %d", i)
	}
	equal(t, "t-1", lines[0]["request_id"])
	_, has := lines[1]["request_id"]
	check(t, !has, "no request id header: no field, got %v", lines[1])
}

// TestShadowLogLine: a shadow rule that would have denied says the same.
func TestShadowLogLine(t *testing.T) {
	var logs syncBuffer
	s := rule("try-strict", 1, time.Minute, limits.KeyIP)
	s.Shadow = true
	ts := pinned(t, Options{Logger: zerolog.New(&logs)}, s)
	equal(t, 204, ts.auth(t, std("192.0.2.1", "X-Request-Id", "r1")...).status)
	equal(t, 204, ts.auth(t, std("192.0.2.1", "X-Request-Id", "r2")...).status)
	lines := logs.jsonLines(t, "shadow rule would have limited")
	mustEqual(t, 1, len(lines))
	want := map[string]any{
		"level":          "info",
		"message":        "shadow rule would have limited this request (not enforced)",
		"shadow":         true,
		"rule":           "try-strict",
		"ip":             "192.0.2.1",
		"user":           "",
		"route":          "/login",
		"method":         "GET",
		"host":           lines[0]["host"], // the test server's address
		"key":            "rg:{try-strict:192.0.2.1}:fw2",
		"limit":          float64(1),
		"period_ms":      float64(60000),
		"remaining":      float64(0),
		"cost":           float64(1),
		"retry_after_ms": float64(42000),
		"request_id":     "r2",
	}
	equal(t, want, lines[0])
}

// TestSuppressedLinesAreCounted: 54 denials in one second are 10 denial
// lines and one line saying the other 44 were suppressed; shadow lines the
// same, counted apart.
func TestSuppressedLinesAreCounted(t *testing.T) {
	var logs syncBuffer
	s := rule("shadow", 1, time.Minute, limits.KeyIP)
	s.Shadow = true
	h := New(pinnedClock{l: mustLimiter(t, rule("per-ip", 1, time.Minute, limits.KeyIP), s), now: pinnedNow()}, nil,
		Options{Logger: zerolog.New(&logs)})
	// One second that does not end before the test does: the summary comes
	// from the timer, 1s of real time after the first suppressed line.
	h.denySampler.elapsed = func() time.Duration { return 0 }
	h.shadowSampler.elapsed = func() time.Duration { return 0 }
	ts := serve(t, h)
	for range 55 {
		ts.auth(t, std("192.0.2.1")...)
	}
	equal(t, 10, len(logs.jsonLines(t, "request limited")))
	equal(t, 10, len(logs.jsonLines(t, "shadow rule would have limited")))
	var denied, shadow []map[string]any
	err := waitUntil(3*time.Second, func() bool {
		denied = logs.jsonLines(t, "denial lines suppressed")
		shadow = logs.jsonLines(t, "shadow lines suppressed")
		return len(denied) > 0 && len(shadow) > 0
	})
	noErr(t, err, "no summary of the suppressed lines")
	equal(t, []map[string]any{{
		"level": "info", "suppressed": float64(44), "period_ms": float64(1000),
		"message": "44 denial lines suppressed in the last 1s (at most 10 per 1s are logged)",
	}}, denied)
	equal(t, float64(44), shadow[0]["suppressed"])
	equal(t, "44 shadow lines suppressed in the last 1s (at most 10 per 1s are logged)", shadow[0]["message"])
}

func TestCountingSamplerWindows(t *testing.T) {
	var logs syncBuffer
	s := newCountingSampler(zerolog.New(&logs), zerolog.InfoLevel, "denial", 2, time.Second)
	now := time.Duration(0)
	s.elapsed = func() time.Duration { return now }
	var got []bool
	for _, at := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 999 * time.Millisecond,
		time.Second, 1500 * time.Millisecond, 1600 * time.Millisecond, 5 * time.Second} {
		now = at
		got = append(got, s.Sample(zerolog.InfoLevel))
	}
	equal(t, []bool{true, true, false, false, true, true, false, true}, got)
	s.timer.Stop()
	s.flush()
	equal(t, float64(3), logs.jsonLines(t, "suppressed")[0]["suppressed"])
	s.flush()
	equal(t, 1, len(logs.jsonLines(t, "suppressed")), "nothing more dropped: no second summary")
}

// TestAuthDeniedAllocs: the denied path allocates nothing in the handler,
// whether its line is logged or suppressed.
func TestAuthDeniedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items on purpose; run without -race")
	}
	r := keyedEverywhere("per-plan", 100)
	sh := rule("shadow", 1, time.Minute, limits.KeyIP)
	sh.Shadow = true
	d := &canned{Admitted: false, Denier: 0, Verdicts: []limits.Verdict{
		{Rule: r, Key: "rg:{per-plan:x}:fw", Cost: 1, Result: limits.Result{Remaining: 0, ResetUS: 42_000_000, RetryUS: 42_000_000}},
		{Rule: sh, Key: "rg:{shadow:x}:fw", Cost: 1, Result: limits.Result{Remaining: 0, ResetUS: 42_000_000, RetryUS: 42_000_000}},
	}}
	h := New(d, nil, Options{Logger: zerolog.New(io.Discard)})
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/auth")
	for _, kv := range [][2]string{{"X-Original-URI", "/api/v1/items?page=2"}, {"X-Real-IP", "2001:db8::7"},
		{"X-User-Id", "alice"}, {"X-Plan", "free"}, {"X-Request-Id", "0af7651916cd43dd8448eb211c80319c"}} {
		ctx.Request.Header.Set(kv[0], kv[1])
	}
	serve := func() {
		ctx.Response.Reset()
		h.Serve(&ctx)
	}
	serve()
	if got := ctx.Response.StatusCode(); got != 429 {
		t.Fatalf("status %d, want 429", got)
	}
	// Suppressed lines (an attack), then every line logged in full.
	for _, burst := range []int64{denialBurst, 1 << 62} {
		h.denySampler.burst, h.shadowSampler.burst = burst, burst
		n := testing.AllocsPerRun(2000, serve)
		t.Logf("allocations per denied /auth request, handler only, %d lines a second logged: %v", burst, n)
		if n > handlerAllocs {
			t.Errorf("%v allocations per denied /auth request in the handler (%d lines a second logged), want <= %d", n, burst, handlerAllocs)
		}
	}
	h.denySampler.timer.Stop()
	h.shadowSampler.timer.Stop()
}

func mustLimiter(t *testing.T, rules ...*limits.Rule) *limits.Limiter {
	l, _ := newLimiter(t, rules...)
	return l
}

// waitUntil polls cond every 20ms for up to within.
func waitUntil(within time.Duration, cond func() bool) error {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return errTimeout
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

var errTimeout = errorString("timed out")

type errorString string

func (e errorString) Error() string { return string(e) }
