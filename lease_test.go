package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// leaseConfig: one leased global rule; 2000 per 1 s window, so a slice is
// at most 2000/8 = 250 units.
const leaseConfig = `
redis:
  url: redis://%s/0
  key_prefix: %s
  timeout: 2s  # exact counts, not latency: a loaded machine must not answer by failure_mode
failure_mode: deny
rules:
  - name: global
    key: []
    algorithm: fixed_window
    limit: %d
    period: 1s
    lease: true
`

const (
	leaseLimit = 2000
	// leaseSlice is a slice's cap: limit / 8.
	leaseSlice = leaseLimit / 8
	// leaseQuiet: no request is sent this close to a window boundary, so
	// every answer belongs to the window it was sent in.
	leaseQuiet = 15 * time.Millisecond
	// leaseWorkers per instance, each one request at a time.
	leaseWorkers = 4
)

// windowCounts are the answers of one 1 s window, from the clients' side.
type windowCounts struct {
	admitted, denied, other int64
	// straddled: answers received after their window ended; arrived:
	// those received in this window, sent in an earlier one. A 204 of
	// either is counted in both windows' admitted (it was decided in one
	// of them), which makes admitted an upper bound by up to straddled +
	// arrived (over).
	straddled, arrived int64
}

// over reports whether the window surely admitted more than limit: more
// than limit even without the late 204s it may count twice.
func (c *windowCounts) over(limit int64) bool {
	return c.admitted-c.straddled-c.arrived > limit
}

// leaseLoad sends requests through every instance in procs as fast as
// leaseWorkers each allow, from start until stop, and counts the answers
// per window (by the wall clock, which is Redis's TIME on this machine).
type leaseLoad struct {
	mu      sync.Mutex
	windows map[int64]*windowCounts
	total   atomic.Int64
	stop    atomic.Bool
	wg      sync.WaitGroup
}

func (l *leaseLoad) count(w int64) *windowCounts {
	c := l.windows[w]
	if c == nil {
		c = &windowCounts{}
		l.windows[w] = c
	}
	return c
}

func (l *leaseLoad) run(procs []*proc) {
	for _, p := range procs {
		for i := 0; i < leaseWorkers; i++ {
			l.wg.Add(1)
			go l.worker(p)
		}
	}
}

func (l *leaseLoad) worker(p *proc) {
	defer l.wg.Done()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for n := 0; n < 2_000_000 && !l.stop.Load(); n++ {
		now := time.Now()
		into := now.Sub(now.Truncate(time.Second))
		if into < leaseQuiet || into > time.Second-leaseQuiet {
			wait := leaseQuiet - into
			if into > leaseQuiet {
				wait = time.Second - into + leaseQuiet
			}
			time.Sleep(wait)
			continue
		}
		sent := now.UnixMicro() / 1_000_000
		req, _ := http.NewRequest("GET", "http://"+p.main+"/auth", nil)
		req.Header.Set("X-Original-URI", "/api")
		req.Header.Set("X-Real-IP", "192.0.2.7")
		resp, err := client.Do(req)
		status := 0
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status = resp.StatusCode
		}
		got := time.Now().UnixMicro() / 1_000_000
		l.total.Add(1)
		l.mu.Lock()
		c := l.count(sent)
		switch status {
		case 204:
			c.admitted++
			if got != sent {
				c.straddled++
				g := l.count(got)
				g.admitted++
				g.arrived++
			}
		case 429:
			c.denied++
		default:
			c.other++
		}
		l.mu.Unlock()
		if err != nil && p.rg.Exited() {
			return // this instance was killed
		}
	}
}

func (l *leaseLoad) finish() {
	l.stop.Store(true)
	l.wg.Wait()
}

// scriptCalls is Redis's count of script runs since the last CONFIG RESETSTAT.
func scriptCalls(t *testing.T, rs *testredis.Server) int64 {
	t.Helper()
	info, err := rs.Client(t).Info(testredis.Ctx(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				v, _ := strconv.ParseInt(calls, 10, 64)
				n += v
			}
		}
	}
	return n
}

// leaseMetric reads one rategate_lease_* series of rule "global" from an
// instance's /metrics.
func leaseMetric(t *testing.T, p *proc, series string) int64 {
	t.Helper()
	_, body := p.get("http://"+p.admin+"/metrics", p.token)
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return int64(v)
		}
	}
	t.Fatalf("%s: no %s in /metrics", p.name, series)
	return 0
}

// startLeased starts three rategate processes on one Redis with the leased
// rule, and resets Redis's statistics.
func startLeased(t *testing.T) (*testredis.Server, []*proc) {
	rs := testredis.Start(t)
	cfg := filepath.Join(t.TempDir(), "rategate.yaml")
	writeFile(t, cfg, fmt.Sprintf(leaseConfig, rs.Addr, uniquePrefix(t), leaseLimit))
	var procs []*proc
	for _, name := range []string{"a", "b", "c"} {
		procs = append(procs, startRategate(t, name, cfg, ""))
	}
	if err := rs.Client(t).ConfigResetStat(testredis.Ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	return rs, procs
}

// waitWindow sleeps until the next window has just started.
func waitWindow() int64 {
	now := time.Now()
	time.Sleep(now.Truncate(time.Second).Add(time.Second).Sub(now) + 2*time.Millisecond)
	return time.Now().Unix()
}

// TestLeaseThreeInstances: three rategate processes share one leased global
// limit of 2000 per second; load of at least twice that goes through all
// three for six windows after the one it starts in. Counted from the 204 and 429 answers: no window
// admits more than the limit, each admits at least 95 % of it, and Redis
// runs at most one script per 20 decisions (INFO commandstats).
func TestLeaseThreeInstances(t *testing.T) {
	t.Parallel()
	rs, procs := startLeased(t)
	load := &leaseLoad{windows: map[int64]*windowCounts{}}
	start := waitWindow()
	load.run(procs)
	// The load's first window is its ramp (its connections are dialed,
	// and on a loaded machine it once stayed under the limit throughout):
	// the windows judged start at the next.
	first := start + 1
	const windows = 6
	time.Sleep(time.Until(time.Unix(first+windows, 0)))
	load.finish()
	calls := scriptCalls(t, rs)

	total := load.total.Load()
	for w := first; w < first+windows; w++ {
		c := load.count(w)
		t.Logf("window %d: admitted %d, denied %d, other %d, answered late %d, arrived late %d", w-first, c.admitted, c.denied, c.other, c.straddled, c.arrived)
		switch {
		case c.over(leaseLimit):
			t.Errorf("window %d admitted %d (%d answered or arrived late), limit %d", w-first, c.admitted, c.straddled+c.arrived, leaseLimit)
		case c.admitted < leaseLimit*95/100:
			t.Errorf("window %d admitted %d, want at least 95%% of %d", w-first, c.admitted, leaseLimit)
		case c.denied < leaseLimit/5:
			// well over the limit offered: all three instances compete
			// for the window to its end (under -race on two shared cores
			// the load reaches 1.4 to 3 times the limit, by machine)
			t.Errorf("window %d: only %d denied; the load was not at least 1.2 times the limit", w-first, c.denied)
		case c.other != 0:
			t.Errorf("window %d: %d answers neither 204 nor 429", w-first, c.other)
		}
	}
	perDecision := float64(calls) / float64(total)
	t.Logf("%d decisions, %d script runs in Redis: %.4f per decision", total, calls, perDecision)
	if perDecision > 0.05 {
		t.Errorf("%.4f script runs per decision, want at most 0.05", perDecision)
	}
	var slice int64
	for _, p := range procs {
		slice += leaseMetric(t, p, `rategate_lease_decisions_total{rule="global",served="slice"}`) +
			leaseMetric(t, p, `rategate_lease_decisions_total{rule="global",served="denied"}`)
	}
	if slice < total*9/10 {
		t.Errorf("only %d of %d decisions answered without Redis", slice, total)
	}
	// The admin API shows the lease of an instance.
	var kv struct {
		Lease *limits.LeaseState `json:"lease"`
	}
	if err := json.Unmarshal([]byte(procs[0].api("GET", "/v1/keys/global", "", 200)), &kv); err != nil || kv.Lease == nil || kv.Lease.Store == nil {
		t.Errorf("GET /v1/keys/global: no lease view (%v): %+v", err, kv.Lease)
	}
}

// TestLeaseInstanceKilled: the same three instances; one is SIGKILLed 50 ms
// into a window, while it holds slices, and another is stopped (SIGTERM)
// 50 ms into a later one. No window goes over the limit. In the window of
// the kill the others admit at least the limit less what the dead instance
// held (at most two slices, 2 × 250) and its answers that were in flight
// (leaseWorkers); the stopped one gives its slices back, so its window is
// whole again (and Redis holds none of its slices once it has exited).
func TestLeaseInstanceKilled(t *testing.T) {
	t.Parallel()
	rs, procs := startLeased(t)
	var kv struct {
		Lease *limits.LeaseState `json:"lease"`
	}
	if err := json.Unmarshal([]byte(procs[1].api("GET", "/v1/keys/global", "", 200)), &kv); err != nil || kv.Lease == nil {
		t.Fatalf("GET /v1/keys/global on b: %v %+v", err, kv.Lease)
	}
	stopped := kv.Lease.Held.Instance
	load := &leaseLoad{windows: map[int64]*windowCounts{}}
	first := waitWindow()
	load.run(procs)
	time.Sleep(time.Until(time.Unix(first+2, 0).Add(50 * time.Millisecond)))
	procs[2].kill()
	killed := first + 2
	time.Sleep(time.Until(time.Unix(first+4, 0).Add(50 * time.Millisecond)))
	procs[1].stop()
	const windows = 6
	time.Sleep(time.Until(time.Unix(first+windows, 0)))
	load.finish()

	bound := int64(2*leaseSlice + leaseWorkers)
	for w := first; w < first+windows; w++ {
		c := load.count(w)
		t.Logf("window %d: admitted %d, denied %d, other %d, answered late %d, arrived late %d", w-first, c.admitted, c.denied, c.other, c.straddled, c.arrived)
		want := int64(leaseLimit * 95 / 100)
		if w == killed {
			want = leaseLimit - bound
		}
		switch {
		case c.over(leaseLimit):
			t.Errorf("window %d admitted %d (%d answered or arrived late), limit %d", w-first, c.admitted, c.straddled+c.arrived, leaseLimit)
		case c.admitted < want && (c.denied > 0 || w < first+4):
			t.Errorf("window %d admitted %d (denied %d), want at least %d", w-first, c.admitted, c.denied, want)
		case c.admitted < want:
			// After the stop one instance is left, and on a slow machine
			// under -race the load cannot offer it the limit: it denied
			// nothing, so nothing was held back from it (its slices are
			// checked below).
			t.Logf("window %d: the instance left was offered less than the limit and denied nothing", w-first)
		}
	}
	c := load.count(killed)
	t.Logf("under-admission in the window of the kill: %d (bound: %d held + %d in flight)", leaseLimit-c.admitted, 2*leaseSlice, leaseWorkers)
	// The stopped instance's slices went back: none is left in Redis.
	fields, err := rs.Client(t).HKeys(testredis.Ctx(t), procs[0].leaseKey(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		if strings.HasPrefix(f, stopped+"-") {
			t.Errorf("slice %s of the stopped instance is still in Redis (fields %v)", f, fields)
		}
	}
	if !strings.Contains(procs[1].logTail(), "leased slices given back") {
		t.Errorf("the stopped instance did not log giving its slices back:\n%s", procs[1].logTail())
	}
}

// leaseKey returns the lease record of the global rule's key.
func (p *proc) leaseKey(t *testing.T) string {
	var kv struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal([]byte(p.api("GET", "/v1/keys/global", "", 200)), &kv); err != nil {
		t.Fatal(err)
	}
	return limits.LeaseKey(kv.Key)
}
