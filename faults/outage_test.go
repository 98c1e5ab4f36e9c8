package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// Bounds the outage tests assert, measured from the client (a -race test
// process on the same two cores as rategate and Redis, so they include the
// client's own scheduling).
const (
	// waitedBound: an answer that waited for Redis comes within the budget
	// plus 10ms, plus the client's scheduling jitter on the machine of
	// the run (see waitedLimit).
	waitedBound = budget + 10*time.Millisecond
	// With the breaker open, by rategate's own histogram
	// (rategate_request_duration_seconds, from reading the headers to
	// writing the answer): at least serverFast of the answers take at most
	// 1ms, and none comes near the budget (all within 25ms), so none
	// waited for Redis.
	serverFast = 0.99
	// With the breaker open, at the client: half the answers within
	// openP50, 99% within openP99, far below the budget. The client is a
	// -race process sharing two cores with rategate, Redis and, under
	// `make test`, other packages' tests, so its own stalls show in its
	// maximum (reported, not asserted).
	openP50 = time.Millisecond
	openP99 = budget / 2
	// slowCut separates answers that waited for Redis (and gave up after
	// the budget) from those that did not.
	slowCut = budget * 3 / 4
	// recoverWithin: Redis back, Redis decides again within this.
	recoverWithin = 3 * time.Second
	// outageLength is how long each fault lasts.
	outageLength = 1500 * time.Millisecond
)

// fault breaks the Redis rs for outageLength and repairs it.
type fault struct {
	name string
	// extra are redis-server directives the fault needs.
	extra []string
	// inject breaks Redis; repair undoes it. repair may be nil when the
	// fault ends by itself (DEBUG SLEEP).
	inject, repair func(t *testing.T, rs *testredis.Controlled)
}

var faultsUnderTest = []fault{
	{
		name:   "killed",
		inject: func(t *testing.T, rs *testredis.Controlled) { rs.Kill() },
		// A killed Redis without persistence comes back empty.
		repair: func(t *testing.T, rs *testredis.Controlled) { rs.RestartEmpty(t) },
	},
	{
		name:   "frozen",
		inject: func(t *testing.T, rs *testredis.Controlled) { rs.Freeze() },
		repair: func(t *testing.T, rs *testredis.Controlled) { rs.Thaw() },
	},
	{
		name:  "slow",
		extra: []string{"enable-debug-command yes"},
		// DEBUG SLEEP blocks the server for the whole outage, then it
		// answers again by itself.
		inject: func(t *testing.T, rs *testredis.Controlled) {
			c := redis.NewClient(&redis.Options{Addr: rs.Addr, ReadTimeout: 10 * time.Second})
			ok := make(chan error, 1)
			go func() {
				defer c.Close()
				ok <- c.Do(context.Background(), "DEBUG", "SLEEP", fmt.Sprintf("%.3f", outageLength.Seconds())).Err()
			}()
			// The command must have started before the test measures.
			select {
			case err := <-ok:
				t.Fatalf("DEBUG SLEEP returned at once: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
		},
	},
}

// attempts is how often an outage is measured before its problems are
// reported. Every measurement starts with a healthy phase that serves as a
// control, and a two-core machine running other packages' tests can stall
// rategate, Redis or the client for longer than the bounds allow; a broken
// breaker or failure mode, by contrast, fails every attempt alike.
const attempts = 3

// problems collects what one measurement found wrong.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// measure runs one measurement up to attempts times, until one finds no
// problem, and reports the last attempt's problems.
func measure(t *testing.T, run func(t *testing.T) problems) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p := run(t)
		if len(p) == 0 {
			return
		}
		if attempt == attempts {
			for _, msg := range p {
				t.Error(msg)
			}
			return
		}
		t.Logf("attempt %d of %d: %s; measuring again", attempt, attempts, strings.Join(p, "; "))
	}
}

// TestRedisOutages breaks Redis in every way of faultsUnderTest under a
// steady load, for every failure mode, and checks each answer: its kind
// matches the mode, those that waited for Redis came within the budget,
// only a handful waited before the breaker opened, the others came at once,
// and Redis decides again soon after it is back.
func TestRedisOutages(t *testing.T) {
	for _, f := range faultsUnderTest {
		for _, mode := range []string{"allow", "deny", "local"} {
			t.Run(f.name+"/"+mode, func(t *testing.T) {
				measure(t, func(t *testing.T) problems { return runOutage(t, f, mode) })
			})
		}
	}
}

// modeAnswer reports whether s is what failure_mode mode answers while the
// store fails.
func modeAnswer(mode string, s sample) bool {
	switch mode {
	case "allow":
		return s.status == 204 && s.mark == "unavailable"
	case "deny":
		return s.status == 503 && s.mark == "unavailable"
	case "local":
		return (s.status == 204 || s.status == 429) && s.mark == "local"
	}
	return false
}

// checkAnswers checks every answer's kind: none hangs; before tFault (and
// answered before it) Redis decides; from tOpen to tEnd the mode answers;
// anything else is one or the other, or (before tOpen) a local decision.
func checkAnswers(p *problems, mode string, samples []sample, tFault, tOpen, tEnd time.Duration) {
	for _, s := range samples {
		switch {
		case s.err != nil:
			p.addf("request at %v: no answer: %v", s.at, s.err)
		case s.at+s.took < tFault && !s.normal():
			p.addf("before the fault, request at %v: status %d mark %q, want a decision by Redis", s.at, s.status, s.mark)
		case s.at >= tOpen && s.at < tEnd && !modeAnswer(mode, s):
			p.addf("breaker open, request at %v: status %d mark %q, want failure_mode %s", s.at, s.status, s.mark, mode)
		case s.at < tOpen && modeAnswer("local", s):
			// Redis failed this one decision while the breaker was still
			// closed: the local fallback decides it, whatever failure_mode
			// says (no slow decision may become an admission).
			continue
		case !s.normal() && !modeAnswer(mode, s):
			p.addf("request at %v: status %d mark %q: neither a Redis decision, a local decision before the breaker opened, nor failure_mode %s", s.at, s.status, s.mark, mode)
		default:
			continue
		}
		return // the first wrong answer says enough
	}
}

func runOutage(t *testing.T, f fault, mode string) (p problems) {
	rs := testredis.StartControlled(t, f.extra...)
	defer rs.Kill()
	g := startGate(t, "rategate", rs.Addr, mode, 1)
	defer g.stop(t)
	if err := g.exact("/gcra", "198.51.100.1", 0); err != nil {
		p.addf("before the fault: %v", err)
		return p
	}

	l := startLoad(g)
	time.Sleep(300 * time.Millisecond)
	goroutinesBefore, connsBefore := g.goroutines(t), g.clientConns(t)

	tFault := l.now()
	f.inject(t, rs)
	if err := g.waitBreakerOpen(time.Second); err != nil {
		l.finish()
		p.addf("%v", err)
		return p
	}
	tOpen := l.now()
	histOpen := g.durationsAfterOpen(t)
	time.Sleep(outageLength - (l.now() - tFault))
	histRepair := g.durations(t)
	tRepair := l.now()
	if f.repair != nil {
		f.repair(t, rs)
	}
	tBack, recovered := l.waitNormal(tRepair, recoverWithin+time.Second)
	time.Sleep(300 * time.Millisecond)
	goroutinesAfter, connsAfter, redisConns := g.goroutines(t), g.clientConns(t), tcpConns(t, 0, port(rs.Addr))
	poolSize := 10 * int(g.metric(t, "go_gomaxprocs")) // go-redis's default
	samples := l.finish()
	if !recovered {
		p.addf("Redis did not decide again within %v of the repair", recoverWithin+time.Second)
		return p
	}
	// Once the breaker is open every answer is the mode's, until the
	// repair (a DEBUG SLEEP ends by itself at about tRepair).
	checkAnswers(&p, mode, samples, tFault, tOpen, tRepair-50*time.Millisecond)

	before := between(samples, 0, tFault)
	waited := between(samples, tFault, tOpen)
	open := between(samples, tOpen, tRepair-50*time.Millisecond)
	slow := 0
	for _, s := range waited {
		if s.took >= slowCut {
			slow++
		}
	}
	bs, ws, ops := statsOf(before), statsOf(waited), statsOf(open)
	fast, n := within(histOpen, histRepair, "0.001")
	t.Logf("%s/%s: before %s | until the breaker opened (%v) %s, %d waited for Redis (limit %v) | breaker open: client %s, server %.2f%% of %d within 1ms | Redis decides again %v after the repair",
		f.name, mode, bs, (tOpen - tFault).Round(time.Millisecond), ws, slow, waitedLimit(bs).Round(time.Microsecond),
		ops, 100*fast, n, (tBack - tRepair).Round(time.Millisecond))
	t.Logf("%s/%s: goroutines %d -> %d, client connections %d -> %d, Redis connections %d (pool size %d)",
		f.name, mode, goroutinesBefore, goroutinesAfter, connsBefore, connsAfter, redisConns, poolSize)

	if limit := waitedLimit(bs); ws.max > limit {
		p.addf("an answer before the breaker opened took %v, want <= redis.timeout + 10ms + jitter = %v", ws.max, limit)
	}
	// Before the breaker opens, only the requests in flight when the
	// fault began and those that make up the failure threshold wait.
	if maxSlow := 2*loadWorkers + 5; slow > maxSlow {
		p.addf("%d answers waited for Redis before the breaker opened, want <= %d", slow, maxSlow)
	}
	if len(open) < 100 {
		p.addf("only %d answers while the breaker was open", len(open))
	}
	// With the breaker open nothing waits for Redis: rategate's own answer
	// time (its histogram) is sub-millisecond, and the client sees no
	// answer anywhere near the budget.
	checkOpen(&p, histOpen, histRepair, ops)
	if d := tBack - tRepair; d > recoverWithin {
		p.addf("Redis decided again %v after the repair, want <= %v", d, recoverWithin)
	}
	// The breaker's state changes are logged once per outage.
	if n, m := g.logMessages("store circuit breaker open"), g.logMessages("store circuit breaker closed"); n != 1 || m != 1 {
		p.addf("breaker logged %d openings and %d closings for one outage, want 1 and 1", n, m)
	}
	// Nothing piled up: under the same load, goroutines and client
	// connections are back where they were (give or take the /readyz and
	// /metrics connections the test added), and Redis connections within
	// the pool.
	if goroutinesAfter > goroutinesBefore+5 || connsAfter > connsBefore+2 || redisConns > poolSize {
		p.addf("goroutines %d -> %d, client connections %d -> %d, Redis connections %d of %d: something leaked during the outage",
			goroutinesBefore, goroutinesAfter, connsBefore, connsAfter, redisConns, poolSize)
	}

	// Exact limiting resumes, on a fresh identity.
	for _, path := range []string{"/gcra", "/window"} {
		if err := g.exact(path, "198.51.100.2", 0); err != nil {
			p.addf("after the repair: %v", err)
		}
	}
	if len(p) > 0 {
		t.Logf("rategate's log:\n%s", g.logTail())
	}
	return p
}

// TestRedisBusyScript runs a Lua busy loop in Redis: after lua-time-limit
// every other command gets BUSY at once, which the breaker counts as a
// failure; SCRIPT KILL ends it.
func TestRedisBusyScript(t *testing.T) {
	measure(t, runBusyScript)
}

func runBusyScript(t *testing.T) (p problems) {
	rs := testredis.StartControlled(t, "lua-time-limit 100")
	defer rs.Kill()
	g := startGate(t, "rategate", rs.Addr, "deny", 1)
	defer g.stop(t)
	l := startLoad(g)
	time.Sleep(300 * time.Millisecond)

	tFault := l.now()
	busy := redis.NewClient(&redis.Options{Addr: rs.Addr, ReadTimeout: -1})
	defer busy.Close()
	loopDone := make(chan error, 1)
	go func() {
		loopDone <- busy.Eval(context.Background(), "while true do end", nil).Err()
	}()
	if err := g.waitBreakerOpen(time.Second); err != nil {
		l.finish()
		p.addf("%v", err)
		return p
	}
	tOpen := l.now()
	histOpen := g.durationsAfterOpen(t)
	time.Sleep(outageLength - (l.now() - tFault))
	histRepair := g.durations(t)
	tRepair := l.now()
	admin := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: -1})
	defer admin.Close()
	if err := admin.ScriptKill(context.Background()).Err(); err != nil {
		t.Fatalf("SCRIPT KILL: %v", err)
	}
	select {
	case <-loopDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the busy script did not end after SCRIPT KILL")
	}
	tBack, ok := l.waitNormal(tRepair, recoverWithin)
	samples := l.finish()
	if !ok {
		p.addf("Redis did not decide again within %v of SCRIPT KILL", recoverWithin)
		return p
	}
	checkAnswers(&p, "deny", samples, tFault, tOpen, tRepair)
	bs, ws, ops := statsOf(between(samples, 0, tFault)), statsOf(between(samples, tFault, tOpen)), statsOf(between(samples, tOpen, tRepair))
	fast, n := within(histOpen, histRepair, "0.001")
	t.Logf("busy script: before %s | until the breaker opened (%v) %s | breaker open: client %s, server %.2f%% of %d within 1ms | Redis decides again %v after SCRIPT KILL",
		bs, (tOpen - tFault).Round(time.Millisecond), ws, ops, 100*fast, n, (tBack - tRepair).Round(time.Millisecond))
	// Until lua-time-limit (100ms) requests wait for Redis and time out.
	if limit := waitedLimit(bs); ws.max > limit {
		p.addf("an answer before the breaker opened took %v, want <= redis.timeout + 10ms + jitter = %v", ws.max, limit)
	}
	checkOpen(&p, histOpen, histRepair, ops)
	if err := g.exact("/gcra", "198.51.100.3", 0); err != nil {
		p.addf("after SCRIPT KILL: %v", err)
	}
	return p
}

// checkOpen checks the answers given while the breaker was open: rategate's
// histogram between snapshots a and b, and the client's view.
func checkOpen(p *problems, a, b histogram, client stats) {
	if fast, n := within(a, b, "0.001"); fast < serverFast {
		p.addf("breaker open: %.2f%% of %d answers within 1ms by rategate's histogram, want >= %.0f%%", 100*fast, n, 100*serverFast)
	}
	if all, n := within(a, b, "0.025"); all < 1 {
		p.addf("breaker open: %d of %d answers took over 25ms by rategate's histogram: some waited for Redis", int((1-all)*float64(n)+0.5), n)
	}
	if client.p50 > openP50 || client.p99 > openP99 {
		p.addf("breaker open, seen by the client: %s, want p50 <= %v and p99 <= %v", client, openP50, openP99)
	}
}

// durationsAfterOpen snapshots rategate's answer times once the answers
// that began before the breaker opened have ended. The histogram counts an
// answer when it is written, so a request that started waiting for Redis
// a moment before the opening would otherwise land in the breaker-open
// window with its full wait. None takes longer than waitedBound by
// rategate's own clock; twice that leaves room for a stalled scheduler.
func (g *gate) durationsAfterOpen(t *testing.T) histogram {
	t.Helper()
	time.Sleep(2 * waitedBound)
	return g.durations(t)
}

// waitedLimit is waitedBound plus the client's scheduling jitter seen in
// the same run with a healthy Redis (p99 - p50 of those answers): on a quiet
// machine a millisecond or two, on a two-core machine running other
// packages' tests beside this one ten or more, which no server can promise
// to beat.
func waitedLimit(healthy stats) time.Duration {
	return waitedBound + max(healthy.p99-healthy.p50, 0)
}
