package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/adaptive"
	"github.com/rategate/rategate/adaptive/signal"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"
	"github.com/rategate/rategate/metrics"
)

// The table of these tests: signal below 50 -> x2, below 80 -> x1, above
// -> x0.5, on a rule of 10 per hour: limits 20, 10 and 5.
const adaptiveYAML = `rules:
  - name: api
    key: [user]
    algorithm: fixed_window
    limit: 10
    period: 1h
    adaptive:
      http: {url: "%s"}
      steps:
        - {below: 50, factor: 2}
        - {below: 80, factor: 1}
        - {factor: 0.5}
      cooldown: 0s
`

// fastConfig parses the policy for url and speeds its adaptive block up
// past what a config file may say (interval 50ms), for tests.
func fastConfig(t *testing.T, url string, keepOnError time.Duration) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(adaptiveYAML, url)))
	if err != nil {
		t.Fatal(err)
	}
	s := *cfg.Rules[0].Adaptive
	s.Interval, s.Timeout, s.LeaseTTL, s.KeepOnError = 50*time.Millisecond, 40*time.Millisecond, 200*time.Millisecond, keepOnError
	cfg.Rules[0].Adaptive = &s
	return cfg
}

// logBuffer collects log lines from several goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count returns how many lines contain every one of subs.
func (l *logBuffer) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.b.String(), "\n") {
		all := line != ""
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ruleInfos records what the manager tells the metrics.
type ruleInfos struct {
	mu    sync.Mutex
	infos []metrics.RuleInfo
}

func (r *ruleInfos) SetRules(infos []metrics.RuleInfo) {
	r.mu.Lock()
	r.infos = infos
	r.mu.Unlock()
}
func (r *ruleInfos) OverrideSyncFailed() {}
func (r *ruleInfos) override(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, i := range r.infos {
		if i.Name == name {
			return i.Override
		}
	}
	return false
}

// instance is one rategate's policy: a limiter and its manager.
type instance struct {
	m   *Manager
	lim *limits.Limiter
	obs *ruleInfos
	log *logBuffer
}

func newInstance(t *testing.T, cfg *config.Config, ovs OverrideStore, ad AdaptiveStore, name string, reader SignalReader) *instance {
	t.Helper()
	mem := memstore.New()
	t.Cleanup(func() { mem.Close() })
	lim := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: cfg.Rules})
	in := &instance{lim: lim, obs: &ruleInfos{}, log: &logBuffer{}}
	in.m = NewManager(ManagerOptions{Config: cfg, Limiter: lim, Metrics: in.obs, Overrides: ovs, Log: zerolog.New(in.log),
		Adaptive: AdaptiveOptions{Store: ad, Instance: name, Signals: reader}})
	return in
}

// run runs the manager's loops until the returned stop is called (or the
// test ends).
func (in *instance) run(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); in.m.Run(ctx) }()
	go func() { defer wg.Done(); in.m.RunAdaptive(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func (in *instance) limit() int64 { return in.lim.Rule("api").Limit }

func (in *instance) view(t *testing.T) RuleView {
	t.Helper()
	for _, rv := range in.m.View().Rules {
		if rv.Name == "api" {
			return rv
		}
	}
	t.Fatal("no rule api in the view")
	return RuleView{}
}

// waitLimit waits until every instance enforces want.
func waitLimit(t *testing.T, within time.Duration, want int64, ins ...*instance) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok := true
		for _, in := range ins {
			ok = ok && in.limit() == want
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			got := make([]int64, len(ins))
			for i, in := range ins {
				got[i] = in.limit()
			}
			t.Fatalf("limits %v after %v, want %d everywhere\nlog of the first:\n%s", got, within, want, ins[0].log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// number is a real HTTP endpoint answering a number the test sets.
type number struct {
	url string
	v   atomic.Value // string
}

func newNumber(t *testing.T, v string) *number {
	n := &number{}
	n.v.Store(v)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, n.v.Load().(string))
	}))
	t.Cleanup(srv.Close)
	n.url = srv.URL + "/load"
	return n
}

func (n *number) set(v string) { n.v.Store(v) }

// storePair is an override store and an adaptive store of one kind.
type storePair struct {
	name string
	open func(t *testing.T) (func() OverrideStore, func() AdaptiveStore)
}

var storePairs = []storePair{
	{"memory", func(t *testing.T) (func() OverrideStore, func() AdaptiveStore) {
		o, a := NewMemoryOverrides(), NewMemoryAdaptive()
		return func() OverrideStore { return o }, func() AdaptiveStore { return a }
	}},
	{"redis", func(t *testing.T) (func() OverrideStore, func() AdaptiveStore) {
		srv := testredis.Start(t)
		return func() OverrideStore { return redisstore.NewOverrides(srv.Client(t), "rg") },
			func() AdaptiveStore {
				a, err := redisstore.NewAdaptive(srv.Client(t), "rg")
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
	}},
}

// TestAdaptiveManualWins: a manual override is in force while it lasts,
// whatever the adaptive controller decides meanwhile (it writes its own
// record, never the override); once the override expires or is deleted,
// the adaptive factor applies again. A decision nobody refreshes goes
// stale and stops applying.
func TestAdaptiveManualWins(t *testing.T) {
	for _, sp := range storePairs {
		t.Run(sp.name, func(t *testing.T) {
			ctx := testredis.Ctx(t)
			ovs, ads := sp.open(t)
			cfg := fastConfig(t, "http://127.0.0.1:1/unused", time.Second)
			in := newInstance(t, cfg, ovs(), ads(), "me", nil)
			clock := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
			in.m.mu.Lock()
			in.m.now = func() time.Time { return clock }
			in.m.mu.Unlock()
			leader := ads() // another instance's handle on the same store
			decide := func(f float64) {
				t.Helper()
				if ok, err := leader.Lead(ctx, "api", "leader-x", time.Minute); !ok || err != nil {
					t.Fatal(ok, err)
				}
				sig := 42.0
				b, _ := json.Marshal(AdaptiveRecord{Factor: f, Reason: AdaptiveReason, Step: -1, Signal: &sig, SignalAt: &clock, SetBy: "leader-x", SetAt: clock})
				if ok, err := leader.Write(ctx, "api", "leader-x", string(b), true); !ok || err != nil {
					t.Fatal(ok, err)
				}
				if err := in.m.syncAdaptive(ctx); err != nil {
					t.Fatal(err)
				}
			}
			want := func(limit int64, applied bool) {
				t.Helper()
				if got := in.limit(); got != limit {
					t.Fatalf("limit %d, want %d", got, limit)
				}
				if av := in.view(t).Adaptive; av == nil || av.Applied != applied {
					t.Fatalf("adaptive view %+v, want applied=%v", av, applied)
				}
			}

			decide(2)
			want(20, true)
			if av := in.view(t).Adaptive; av.Factor != 2 || av.SetBy != "leader-x" || av.Signal == nil || *av.Signal != 42 || av.Leader {
				t.Errorf("view %+v: want factor 2 set by leader-x, signal 42, not this instance", av)
			}
			if in.obs.override("api") {
				t.Error("the adaptive factor counts as a manual override in rategate_rule_override_active")
			}

			if _, err := in.m.SetOverride(ctx, "api", []byte(`{"limit":3,"ttl":"1m","reason":"incident"}`)); err != nil {
				t.Fatal(err)
			}
			want(3, false)
			if !in.obs.override("api") {
				t.Error("the manual override is not in rategate_rule_override_active")
			}
			stored, err := ovs().Load(ctx)
			if err != nil {
				t.Fatal(err)
			}

			decide(0.5) // the controller keeps deciding: the manual override still wins
			want(3, false)
			if av := in.view(t).Adaptive; av.Factor != 0.5 || !strings.Contains(av.NotApplied, "manual override") {
				t.Errorf("view %+v: want factor 0.5, not applied because of the manual override", av)
			}
			after, err := ovs().Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(after) != 1 || after["api"] != stored["api"] {
				t.Fatalf("the manual override changed under the controller: %q, was %q", after, stored)
			}

			// The override expires: the adaptive factor applies again.
			clock = clock.Add(61 * time.Second)
			decide(0.5)
			if err := in.m.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			want(5, true)

			// One without a ttl, deleted.
			if _, err := in.m.SetOverride(ctx, "api", []byte(`{"factor":3}`)); err != nil {
				t.Fatal(err)
			}
			want(30, false)
			if _, err := in.m.DeleteOverride(ctx, "api"); err != nil {
				t.Fatal(err)
			}
			want(5, true)

			// Nobody refreshes the decision: stale, the file's limit.
			clock = clock.Add(staleAfter(cfg.Rules[0].Adaptive) + time.Second)
			if err := in.m.syncAdaptive(ctx); err != nil {
				t.Fatal(err)
			}
			want(10, false)
			if av := in.view(t).Adaptive; !strings.HasPrefix(av.NotApplied, "stale") {
				t.Errorf("view %+v: want stale", av)
			}
		})
	}
}

// TestAdaptiveRecordIsBounded: a record written by anyone (a bug, an
// attacker with Redis access) is clamped to the rule's bounds.
func TestAdaptiveRecordIsBounded(t *testing.T) {
	ctx := context.Background()
	ads := NewMemoryAdaptive()
	cfg := fastConfig(t, "http://127.0.0.1:1/unused", time.Second)
	in := newInstance(t, cfg, nil, ads, "me", nil)
	for _, c := range []struct {
		json  string
		limit int64
	}{
		{`{"factor":1e300,"set_at":"%s"}`, 20}, // max_factor 2
		{`{"factor":1e-300,"set_at":"%s"}`, 5}, // min_factor 0.5
		{`{"factor":-4,"set_at":"%s"}`, 10},    // not a factor: 1
		{`{"factor":"x","set_at":"%s"}`, 10},   // not JSON of a record
		{`{"factor":2,"step":99,"set_at":"%s"}`, 20},
	} {
		if ok, _ := ads.Lead(ctx, "api", "x", time.Minute); !ok {
			t.Fatal("lead")
		}
		ads.Write(ctx, "api", "x", fmt.Sprintf(c.json, time.Now().UTC().Format(time.RFC3339Nano)), false)
		if err := in.m.syncAdaptive(ctx); err != nil {
			t.Fatal(err)
		}
		if got := in.limit(); got != c.limit {
			t.Errorf("record %s: limit %d, want %d", c.json, got, c.limit)
		}
	}
}

// TestAdaptiveFollowsSignal: the controller reads the signal, decides a
// factor per step and the limiter enforces it; one log line per change,
// none per evaluation; the statuses the metrics read.
func TestAdaptiveFollowsSignal(t *testing.T) {
	n := newNumber(t, "30")
	in := newInstance(t, fastConfig(t, n.url, time.Second), nil, nil, "solo", nil)
	in.run(t)
	waitLimit(t, 3*time.Second, 20, in)
	n.set("90")
	waitLimit(t, 3*time.Second, 5, in)
	n.set("60")
	waitLimit(t, 3*time.Second, 10, in)
	time.Sleep(200 * time.Millisecond) // a few evaluations that change nothing

	if got := in.log.count("adaptive factor changed"); got != 3 {
		t.Errorf("%d factor-change lines, want 3 (x1->x2->x0.5->x1)\n%s", got, in.log)
	}
	if got := in.log.count("now evaluates"); got != 1 {
		t.Errorf("%d takeover lines, want 1", got)
	}
	if lines := strings.Count(in.log.String(), "\n"); lines > 6 {
		t.Errorf("%d log lines for 3 changes: evaluations log\n%s", lines, in.log)
	}
	st := in.m.AdaptiveStatuses()
	if len(st) != 1 || st[0].Rule != "api" || st[0].Factor != 1 || !st[0].HasSignal || st[0].Signal != 60 || !st[0].Leader ||
		st[0].Evaluations < 5 || st[0].Errors != [adaptive.NumReasons]uint64{} {
		t.Errorf("statuses %+v", st)
	}
	av := in.view(t).Adaptive
	if av == nil || !av.Leader || av.SetBy != "solo" || !av.Applied || av.Factor != 1 || av.Error != "" {
		t.Errorf("view %+v", av)
	}
}

// failingSource is a real HTTP server playing a Prometheus query API that
// answers well or fails in one of the ways a signal can.
type failingSource struct {
	url  string
	mode atomic.Value // string
}

func newFailingSource(t *testing.T) *failingSource {
	f := &failingSource{}
	f.mode.Store("good")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		one := func(v string) string {
			return `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"` + v + `"]}]}}`
		}
		switch f.mode.Load().(string) {
		case "good":
			fmt.Fprint(w, one("30"))
		case "hangup":
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
		case "slow":
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
			fmt.Fprint(w, one("30"))
		case "text":
			fmt.Fprint(w, "cpu is fine")
		case "nan":
			fmt.Fprint(w, one("NaN"))
		case "inf":
			fmt.Fprint(w, one("+Inf"))
		case "empty":
			fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[]}}`)
		case "several":
			fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"1"},"value":[1,"30"]},{"metric":{"a":"2"},"value":[1,"31"]}]}}`)
		}
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// TestAdaptiveFailures: for each way the signal fails, the factor is kept
// for keep_on_error after the last good reading, then it is 1 (never
// earlier, never unbounded); the failure is counted under its reason and
// logged once when it starts and once when it ends.
func TestAdaptiveFailures(t *testing.T) {
	const keep = 500 * time.Millisecond
	src := newFailingSource(t)
	for _, c := range []struct{ mode, reason string }{
		{"hangup", "unreachable"},
		{"slow", "timeout"},
		{"text", "not_a_number"},
		{"nan", "nan"},
		{"inf", "infinite"},
		{"empty", "empty"},
		{"several", "several_series"},
	} {
		t.Run(c.reason, func(t *testing.T) {
			src.mode.Store("good")
			cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(strings.Replace(adaptiveYAML,
				`http: {url: "%s"}`, `prometheus: {url: "%s", query: "load"}`, 1), src.url)))
			if err != nil {
				t.Fatal(err)
			}
			s := *cfg.Rules[0].Adaptive
			s.Interval, s.Timeout, s.LeaseTTL, s.KeepOnError = 50*time.Millisecond, 40*time.Millisecond, 200*time.Millisecond, keep
			cfg.Rules[0].Adaptive = &s
			in := newInstance(t, cfg, nil, nil, "solo", nil)
			in.run(t)
			waitLimit(t, 3*time.Second, 20, in)
			reason, _ := adaptive.ParseReason(c.reason)
			errorsOf := func() uint64 { return in.m.AdaptiveStatuses()[0].Errors[reason] }

			switched := time.Now()
			src.mode.Store(c.mode)
			for errorsOf() == 0 {
				if time.Since(switched) > 3*time.Second {
					t.Fatalf("no %s error counted\n%s", c.reason, in.log)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if got := in.limit(); got != 20 && time.Since(switched) < keep-100*time.Millisecond {
				t.Fatalf("limit %d at the first failure, want 20 kept", got)
			}
			waitLimit(t, 3*time.Second, 10, in)
			// The last good reading was at most one interval (plus a reading)
			// before the switch.
			if held := time.Since(switched); held < keep-100*time.Millisecond {
				t.Errorf("the factor returned to 1 after %v, keep_on_error is %v", held, keep)
			}
			if got := in.log.count("adaptive signal failing", `"reason":"`+c.reason+`"`); got != 1 {
				t.Errorf("%d failing lines with reason %s, want 1\n%s", got, c.reason, in.log)
			}
			if got := in.log.count("back to x1"); got != 1 {
				t.Errorf("%d reset lines, want 1\n%s", got, in.log)
			}
			if av := in.view(t).Adaptive; av.Error == "" || !strings.HasPrefix(av.Error, c.reason) {
				t.Errorf("view error %q, want it to start with %s", av.Error, c.reason)
			}
			for i, e := range in.m.AdaptiveStatuses()[0].Errors {
				if adaptive.Reason(i) != reason && e != 0 {
					t.Errorf("%d errors counted as %s", e, adaptive.Reason(i))
				}
			}

			src.mode.Store("good")
			waitLimit(t, 3*time.Second, 20, in)
			if got := in.log.count("adaptive signal readable again"); got != 1 {
				t.Errorf("%d recovery lines, want 1\n%s", got, in.log)
			}
			if got := in.log.count("adaptive signal failing"); got != 1 {
				t.Errorf("%d failing lines in all, want 1 (not one per evaluation)\n%s", got, in.log)
			}
		})
	}
}

// countingReader counts one instance's readings.
type countingReader struct {
	r SignalReader
	n atomic.Int64
	// stall, when set, makes the next reading take the value and then
	// freeze for the given time, ignoring its deadline: a process that
	// stopped (SIGSTOP, a long GC pause) in the middle of an evaluation.
	stall atomic.Int64
}

func (c *countingReader) Read(ctx context.Context, src *adaptive.Source) (float64, error) {
	c.n.Add(1)
	v, err := c.r.Read(ctx, src)
	if d := c.stall.Swap(0); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return v, err
}

// crashed is a store whose instance dies without releasing anything.
type crashed struct{ AdaptiveStore }

func (crashed) Release(context.Context, string, string) error { return nil }

func leaders(ins ...*instance) []int {
	var out []int
	for i, in := range ins {
		if st := in.m.AdaptiveStatuses(); len(st) == 1 && st[0].Leader {
			out = append(out, i)
		}
	}
	return out
}

func waitOneLeader(t *testing.T, within time.Duration, ins ...*instance) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if l := leaders(ins...); len(l) == 1 {
			return l[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("leaders %v after %v, want exactly one", leaders(ins...), within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAdaptiveTakeover: two instances on one Redis: one evaluates, both
// enforce its decision; when it dies without a word, the other takes the
// lease over within lease_ttl plus an interval and keeps following the
// signal from the state the first left.
func TestAdaptiveTakeover(t *testing.T) {
	srv := testredis.Start(t)
	n := newNumber(t, "30")
	cfg := fastConfig(t, n.url, time.Second)
	spec := cfg.Rules[0].Adaptive
	var ins []*instance
	var readers []*countingReader
	var stops []func()
	for _, name := range []string{"a", "b"} {
		ad, err := redisstore.NewAdaptive(srv.Client(t), "rg")
		if err != nil {
			t.Fatal(err)
		}
		cr := &countingReader{r: signal.NewReader()}
		in := newInstance(t, cfg, redisstore.NewOverrides(srv.Client(t), "rg"), crashed{ad}, name, cr)
		ins, readers, stops = append(ins, in), append(readers, cr), append(stops, in.run(t))
	}
	waitLimit(t, 3*time.Second, 20, ins...)
	lead := waitOneLeader(t, 3*time.Second, ins...)
	other := 1 - lead

	// Only the leader reads the signal.
	readers[0].n.Store(0)
	readers[1].n.Store(0)
	time.Sleep(300 * time.Millisecond)
	if readers[other].n.Load() != 0 || readers[lead].n.Load() < 3 {
		t.Errorf("readings in 300ms: leader %d, other %d; want only the leader's", readers[lead].n.Load(), readers[other].n.Load())
	}
	n.set("90")
	waitLimit(t, 3*time.Second, 5, ins...)

	// The leader crashes (no release): the other takes over after the TTL.
	stops[lead]()
	died := time.Now()
	n.set("60")
	for leaders(ins[other]) == nil {
		if time.Since(died) > spec.LeaseTTL+spec.Interval+time.Second {
			t.Fatalf("no takeover %v after the leader died (lease %v, interval %v)\n%s", time.Since(died), spec.LeaseTTL, spec.Interval, ins[other].log)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if took := time.Since(died); took < spec.LeaseTTL/2 {
		t.Errorf("took over after %v, before the lease could expire (%v)", took, spec.LeaseTTL)
	}
	waitLimit(t, 3*time.Second, 10, ins[other])
	if av := ins[other].view(t).Adaptive; av.SetBy != ins[other].m.Instance() || !av.Leader {
		t.Errorf("survivor's view %+v", av)
	}
	if got := ins[other].log.count("now evaluates", `"previous":"`+ins[lead].m.Instance()+`"`); got != 1 {
		t.Errorf("the takeover line does not name the previous instance\n%s", ins[other].log)
	}
}

// TestAdaptiveStalledLeader: a leader that freezes past its lease, then
// wakes up with an outdated reading, cannot overwrite its successor's
// decision: its write is refused and it steps down.
func TestAdaptiveStalledLeader(t *testing.T) {
	srv := testredis.Start(t)
	n := newNumber(t, "30")
	cfg := fastConfig(t, n.url, time.Second)
	var ins []*instance
	var readers []*countingReader
	for _, name := range []string{"a", "b"} {
		ad, err := redisstore.NewAdaptive(srv.Client(t), "rg")
		if err != nil {
			t.Fatal(err)
		}
		cr := &countingReader{r: signal.NewReader()}
		in := newInstance(t, cfg, redisstore.NewOverrides(srv.Client(t), "rg"), ad, name, cr)
		in.run(t)
		ins, readers = append(ins, in), append(readers, cr)
	}
	waitLimit(t, 3*time.Second, 20, ins...)
	lead := waitOneLeader(t, 3*time.Second, ins...)
	other := 1 - lead

	stall := 4 * cfg.Rules[0].Adaptive.LeaseTTL
	readers[lead].stall.Store(int64(stall)) // reads 30, then freezes
	time.Sleep(100 * time.Millisecond)      // the frozen reading has its 30
	n.set("90")
	waitLimit(t, 3*time.Second, 5, ins...) // the other took over and decided x0.5
	if l := leaders(ins[other]); len(l) != 1 {
		t.Fatalf("the other instance decided x0.5 without the lease")
	}
	// The frozen one wakes with its outdated 30 (x2): refused.
	deadline := time.Now().Add(stall + time.Second)
	for time.Now().Before(deadline) {
		if got := ins[other].limit(); got != 5 {
			t.Fatalf("limit %d: the stalled leader's outdated decision got through", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := ins[lead].log.count("no longer evaluates", "another instance took the lease over"); got != 1 {
		t.Errorf("the stalled leader did not step down on its refused write\n%s", ins[lead].log)
	}
	if l := leaders(ins...); len(l) != 1 || l[0] != other {
		t.Errorf("leaders %v after the stall, want only %d", l, other)
	}
}

// TestAdaptiveReload: removing the adaptive block returns the rule to the
// file's limit and stops the controller; adding it back resumes.
func TestAdaptiveReload(t *testing.T) {
	n := newNumber(t, "90")
	cfg := fastConfig(t, n.url, time.Second)
	in := newInstance(t, cfg, nil, nil, "solo", nil)
	in.run(t)
	waitLimit(t, 3*time.Second, 5, in)

	plain := *cfg.Rules[0]
	plain.Adaptive = nil
	_, _, changed := in.m.SetFile([]*limits.Rule{&plain}, "test.yaml")
	if len(changed) != 1 {
		t.Errorf("a reload that removes the adaptive block changed %v, want [api]", changed)
	}
	if got := in.limit(); got != 10 {
		t.Fatalf("limit %d after removing the adaptive block, want the file's 10", got)
	}
	if in.view(t).Adaptive != nil {
		t.Error("the view still shows an adaptive factor")
	}
	leading := func() bool {
		in.m.mu.Lock()
		defer in.m.mu.Unlock()
		return in.m.adaptive.leading["api"]
	}
	deadline := time.Now().Add(2 * time.Second)
	for leading() || len(in.m.AdaptiveStatuses()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the controller still runs after its adaptive block was removed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	n.set("30")
	in.m.SetFile(cfg.Rules, "test.yaml")
	waitLimit(t, 3*time.Second, 20, in) // a new controller follows the signal again
	if !leading() {
		t.Error("no controller leads after the block came back")
	}
}

// unreadableAdaptive is an adaptive store whose records cannot be read
// while down is set (Redis gone).
type unreadableAdaptive struct {
	AdaptiveStore
	down bool
}

func (u *unreadableAdaptive) Load(ctx context.Context) (map[string]string, error) {
	if u.down {
		return nil, errors.New("connection refused")
	}
	return u.AdaptiveStore.Load(ctx)
}

// TestAdaptiveStaleWhileTheStoreIsDown: while the records cannot be read,
// the decision in force stays, but not past the time it goes stale: a
// raise nobody refreshes ends then, as it does when the store answers.
func TestAdaptiveStaleWhileTheStoreIsDown(t *testing.T) {
	ctx := context.Background()
	shared := NewMemoryAdaptive()
	store := &unreadableAdaptive{AdaptiveStore: shared}
	cfg := fastConfig(t, "http://127.0.0.1:1/unused", time.Second)
	in := newInstance(t, cfg, NewMemoryOverrides(), store, "me", nil)
	clock := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	in.m.mu.Lock()
	in.m.now = func() time.Time { return clock }
	in.m.mu.Unlock()
	if ok, err := shared.Lead(ctx, "api", "leader-x", time.Minute); !ok || err != nil {
		t.Fatal(ok, err)
	}
	b, _ := json.Marshal(AdaptiveRecord{Factor: 2, Reason: AdaptiveReason, Step: -1, SetBy: "leader-x", SetAt: clock})
	if ok, err := shared.Write(ctx, "api", "leader-x", string(b), true); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := in.m.syncAdaptive(ctx); err != nil {
		t.Fatal(err)
	}
	if got := in.limit(); got != 20 {
		t.Fatalf("limit %d, want 20 (x2)", got)
	}
	store.down = true
	clock = clock.Add(time.Second)
	if err := in.m.syncAdaptive(ctx); err == nil {
		t.Fatal("no error from an unreadable store")
	}
	if got := in.limit(); got != 20 {
		t.Fatalf("store down, decision fresh: limit %d, want the 20 in force", got)
	}
	clock = clock.Add(staleAfter(cfg.Rules[0].Adaptive))
	_ = in.m.syncAdaptive(ctx)
	if got := in.limit(); got != 10 {
		t.Fatalf("store down, decision stale: limit %d, want the file's 10", got)
	}
}
