package faults

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// correctnessBudget is redis.timeout in the tests that check what is
// answered, not how fast: long enough that a stall of a busy test machine
// is not mistaken for a failed decision.
const correctnessBudget = time.Second

// spend sends n allowed requests for ip on path, each decided by Redis.
func spend(t *testing.T, g *gate, path, ip string, n int) {
	t.Helper()
	for i := range n {
		status, mark, body, err := g.get(path, ip)
		if err != nil || status != 204 || mark != "" {
			t.Fatalf("%s request %d: %d %q %q %v\n%s", path, i+1, status, mark, body, err, g.logTail())
		}
	}
}

// TestRedisRestartedEmpty: Redis crashes and comes back with no data and no
// scripts while no request is in flight. The very first decision after it
// succeeds — the dead pooled connections are replaced and NOSCRIPT (or, on
// FCALL, the missing function) is answered by loading the script (the
// library) again — and the breaker never opens.
func TestRedisRestartedEmpty(t *testing.T) {
	rs := testredis.StartControlled(t)
	// deny makes any failed decision a visible 503. The generous budget
	// keeps a stall of a busy test machine from passing for a failure:
	// this test is about recovering, not about time.
	g := startGateTimeout(t, "rategate", rs.Addr, "deny", 1, correctnessBudget)
	spend(t, g, "/gcra", "198.51.100.10", 3)

	rs.RestartEmpty(t)
	status, mark, body, err := g.get("/gcra", "198.51.100.10")
	if err != nil || status != 204 || mark != "" {
		t.Fatalf("first decision after Redis restarted empty: %d %q %q %v, want 204 from Redis\n%s",
			status, mark, body, err, g.logTail())
	}
	stat := "errorstat_NOSCRIPT"
	if *functions {
		stat = "errorstat_ERR" // ERR Function not found
	}
	if n := redisInfo(t, rs.Addr, "errorstats", stat); n < 1 {
		t.Fatalf("Redis answered %s %d times: the test did not exercise the reload", stat, n)
	}
	// The counters went with the data: the quota is full again, and the
	// request above spent one of it.
	g.exactly(t, "/gcra", "198.51.100.10", 1)
	if n := g.logMessages("store circuit breaker open"); n != 0 {
		t.Fatalf("the breaker opened %d times for a restart no request saw\n%s", n, g.logTail())
	}
}

// TestRedisRestartedWithData: Redis saved, crashed and came back with its
// dump. The counters resume where they were: an identity that spent 3 of 10
// before has exactly 7 left after.
func TestRedisRestartedWithData(t *testing.T) {
	rs := testredis.StartControlled(t)
	g := startGateTimeout(t, "rategate", rs.Addr, "deny", 1, correctnessBudget)
	spend(t, g, "/gcra", "198.51.100.11", 3)
	spend(t, g, "/window", "198.51.100.11", 4)

	c := redis.NewClient(&redis.Options{Addr: rs.Addr})
	err := c.Save(context.Background()).Err()
	c.Close()
	if err != nil {
		t.Fatalf("SAVE: %v", err)
	}
	rs.Restart(t)
	g.exactly(t, "/gcra", "198.51.100.11", 3)
	g.exactly(t, "/window", "198.51.100.11", 4)
}

// TestScriptFlushUnderLoad: the scripts vanish (SCRIPT FLUSH, or FUNCTION
// FLUSH when deciding with FCALL: as after a restart or a failover to a
// replica that never saw them) while requests flow. Not one decision fails:
// EVALSHA's NOSCRIPT is answered with EVAL, FCALL's missing function by
// loading the library again.
func TestScriptFlushUnderLoad(t *testing.T) {
	rs := testredis.StartControlled(t)
	g := startGateTimeout(t, "rategate", rs.Addr, "deny", 1, correctnessBudget)
	c := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer c.Close()

	l := startLoad(g)
	for range 5 {
		time.Sleep(150 * time.Millisecond)
		flush, what := c.ScriptFlush(context.Background()).Err, "SCRIPT FLUSH"
		if *functions {
			flush, what = c.FunctionFlush(context.Background()).Err, "FUNCTION FLUSH"
		}
		if err := flush(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	time.Sleep(150 * time.Millisecond)
	samples := l.finish()
	for _, s := range samples {
		if !s.normal() {
			t.Fatalf("request at %v during SCRIPT FLUSHes: status %d mark %q err %v, want every decision from Redis\n%s",
				s.at, s.status, s.mark, s.err, g.logTail())
		}
	}
	// NOSCRIPT, or "ERR Function not found".
	stat := "errorstat_NOSCRIPT"
	if *functions {
		stat = "errorstat_ERR"
	}
	missing := redisInfo(t, rs.Addr, "errorstats", stat)
	t.Logf("%d decisions across 5 flushes, %d answers that the code was missing (%s) reloaded, none failed: %s", len(samples), missing, stat, statsOf(samples))
	if missing < 5 {
		t.Fatalf("Redis answered %s %d times for 5 flushes: the test did not exercise the reload", stat, missing)
	}
}

// TestLocalModeTwoInstances: Redis is down and two instances decide
// locally with local_share 2. Together they admit the limit, not twice it.
func TestLocalModeTwoInstances(t *testing.T) {
	rs := testredis.StartControlled(t)
	g1 := startGate(t, "rategate-1", rs.Addr, "local", 2)
	g2 := startGate(t, "rategate-2", rs.Addr, "local", 2)
	rs.Kill()

	for _, path := range []string{"/gcra", "/window"} {
		admitted := map[string]int{}
		for i := range 4 * exactLimit {
			g := []*gate{g1, g2}[i%2]
			status, mark, body, err := g.get(path, "198.51.100.20")
			if err != nil || mark != "local" || (status != 204 && status != 429) {
				t.Fatalf("%s %s request %d: %d %q %q %v, want a local decision\n%s", g.name, path, i+1, status, mark, body, err, g.logTail())
			}
			if status == 204 {
				admitted[g.name]++
			}
		}
		total := admitted[g1.name] + admitted[g2.name]
		t.Logf("%s: %d of %d admitted with Redis down (%v), limit %d", path, total, 4*exactLimit, admitted, exactLimit)
		// gcra has no windows: exactly limit/share each. A fixed window
		// may straddle a boundary once: one more local window.
		maxTotal := exactLimit
		if path == "/window" {
			maxTotal += exactLimit / 2
		}
		if total < exactLimit || total > maxTotal {
			t.Errorf("%s: the two instances admitted %d, want %d..%d", path, total, exactLimit, maxTotal)
		}
	}
}
