package limits_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"

	"github.com/rategate/rategate/internal/race"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// fakeStore is a Store whose decisions and pings fail, succeed or block as
// the test says, counting every call that reaches it.
type fakeStore struct {
	mu        sync.Mutex
	decideErr error
	pingErr   error
	hold      chan struct{} // when non-nil, Decide waits for it (or ctx) first

	decides, pings atomic.Int64
	closed         atomic.Bool
}

func (f *fakeStore) set(decideErr, pingErr error) {
	f.mu.Lock()
	f.decideErr, f.pingErr = decideErr, pingErr
	f.mu.Unlock()
}

func (f *fakeStore) Decide(ctx context.Context, b *limits.Batch, results []limits.Result) (bool, error) {
	f.decides.Add(1)
	f.mu.Lock()
	err, hold := f.decideErr, f.hold
	f.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	if err != nil {
		return false, err
	}
	for i := range results {
		results[i] = limits.Result{Allowed: true, Remaining: 1}
	}
	return true, nil
}

func (f *fakeStore) Peek(ctx context.Context, c limits.Check) (limits.Result, error) {
	var r [1]limits.Result
	_, err := f.Decide(ctx, &limits.Batch{Checks: []limits.Check{c}}, r[:])
	return r[0], err
}

func (f *fakeStore) Reset(ctx context.Context, c limits.Check) error {
	_, err := f.Peek(ctx, c)
	return err
}

func (f *fakeStore) Ping(context.Context) error {
	f.pings.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pingErr
}

func (f *fakeStore) Name() string { return "fake" }
func (f *fakeStore) Close() error { f.closed.Store(true); return nil }

// replyError is a Redis error reply, as go-redis returns them.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var (
	errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	errTimeout = fmt.Errorf("redis store: decide: %w", context.DeadlineExceeded)
)

// transitions records OnStateChange calls.
type transitions struct {
	mu  sync.Mutex
	got []string
}

func (tr *transitions) hook(from, to limits.BreakerState) {
	tr.mu.Lock()
	tr.got = append(tr.got, from.String()+">"+to.String())
	tr.mu.Unlock()
}

func (tr *transitions) list() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.got)
}

// gate runs a fake store's calls through a breaker, as the limiter does.
type gate struct {
	*limits.Breaker
	f *fakeStore
}

func (g *gate) Decide(ctx context.Context, b *limits.Batch, results []limits.Result) (bool, error) {
	t, err := g.Allow()
	if err != nil {
		return false, err
	}
	ok, err := g.f.Decide(ctx, b, results)
	g.Done(t, err)
	return ok, err
}

func (g *gate) Peek(ctx context.Context, c limits.Check) (limits.Result, error) {
	var r [1]limits.Result
	_, err := g.Decide(ctx, &limits.Batch{Checks: []limits.Check{c}}, r[:])
	return r[0], err
}

func (g *gate) Reset(ctx context.Context, c limits.Check) error {
	_, err := g.Peek(ctx, c)
	return err
}

func (g *gate) Ping(ctx context.Context) error {
	if err := g.OpenError(); err != nil {
		return err
	}
	return g.f.Ping(ctx)
}

// newTestBreaker returns a breaker over f that probes every 5ms, closed at
// the end of the test.
func newTestBreaker(t *testing.T, f *fakeStore, opts limits.BreakerOptions) (*gate, *transitions) {
	t.Helper()
	tr := &transitions{}
	if opts.ProbeInterval == 0 {
		opts.ProbeInterval = 5 * time.Millisecond
	}
	if opts.OpenAfter == 0 {
		opts.OpenAfter = -1 // the count alone decides, unless the test says
	}
	opts.OnStateChange = tr.hook
	b := &gate{Breaker: limits.NewBreaker(f.Ping, "fake", opts), f: f}
	t.Cleanup(func() { b.Close() })
	return b, tr
}

func decideErr(b *gate) error {
	var r [1]limits.Result
	_, err := b.Decide(context.Background(), &limits.Batch{Checks: []limits.Check{{Key: "k"}}}, r[:])
	return err
}

// waitState polls until b is in state want, failing after a second.
func waitState(t *testing.T, b *gate, want limits.BreakerState) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for b.State() != want {
		if time.Now().After(deadline) {
			t.Fatalf("breaker is %s after 1s, want %s", b.State(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	f := &fakeStore{}
	f.set(errRefused, errRefused)
	b, tr := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 3, ProbeInterval: time.Hour})

	// Two failures, a success, two failures: never three in a row.
	for i, fail := range []bool{true, true, false, true, true} {
		if fail {
			f.set(errRefused, errRefused)
		} else {
			f.set(nil, nil)
		}
		if err := decideErr(b); (err != nil) != fail {
			t.Fatalf("call %d: err = %v, want failure %v", i, err, fail)
		}
	}
	if s := b.State(); s != limits.BreakerClosed {
		t.Fatalf("state %s after at most 2 consecutive failures, want closed", s)
	}
	f.set(errRefused, errRefused)
	if err := decideErr(b); !errors.Is(err, errRefused.Err) || errors.Is(err, limits.ErrBreakerOpen) {
		t.Fatalf("third consecutive failure returned %v, want the store's own error", err)
	}
	if s := b.State(); s != limits.BreakerOpen {
		t.Fatalf("state %s after 3 consecutive failures, want open", s)
	}

	// Open: nothing reaches the store, the error says why.
	before := f.decides.Load()
	for range 100 {
		err := decideErr(b)
		if !errors.Is(err, limits.ErrBreakerOpen) {
			t.Fatalf("open breaker returned %v, want ErrBreakerOpen", err)
		}
		if !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("open error %q does not name the failure that opened it", err)
		}
	}
	if n := f.decides.Load() - before; n != 0 {
		t.Fatalf("%d calls reached the store while the breaker was open", n)
	}
	if _, err := b.Peek(context.Background(), limits.Check{Key: "k"}); !errors.Is(err, limits.ErrBreakerOpen) {
		t.Fatalf("Peek while open: %v", err)
	}
	if err := b.Reset(context.Background(), limits.Check{Key: "k"}); !errors.Is(err, limits.ErrBreakerOpen) {
		t.Fatalf("Reset while open: %v", err)
	}
	if err := b.Ping(context.Background()); !errors.Is(err, limits.ErrBreakerOpen) {
		t.Fatalf("Ping while open: %v (readiness must say the breaker is open)", err)
	}
	if got, want := tr.list(), []string{"closed>open"}; !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
}

// TestBreakerRidesOutAShortStall: a stall shorter than OpenAfter fails
// every request it caught, however many, without opening the breaker; a
// store that keeps failing past OpenAfter opens it.
func TestBreakerRidesOutAShortStall(t *testing.T) {
	f := &fakeStore{}
	b, tr := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 5, OpenAfter: 50 * time.Millisecond, ProbeInterval: time.Hour})
	f.set(errTimeout, nil)
	for range 100 { // a wave of timeouts, all at once
		_ = decideErr(b)
	}
	if s := b.State(); s != limits.BreakerClosed {
		t.Fatalf("100 failures within a moment opened the breaker (%s)", s)
	}
	f.set(nil, nil)
	if err := decideErr(b); err != nil {
		t.Fatal(err)
	}
	// The stall is over; a new streak starts from zero.
	f.set(errTimeout, nil)
	start := time.Now()
	for b.State() == limits.BreakerClosed {
		if time.Since(start) > time.Second {
			t.Fatal("failures lasting a second did not open the breaker")
		}
		_ = decideErr(b)
		time.Sleep(time.Millisecond)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("opened after %v of failures, want >= OpenAfter (50ms)", d)
	}
	if got := tr.list(); !slices.Equal(got, []string{"closed>open"}) {
		t.Fatalf("transitions %v", got)
	}
}

func TestIsStoreFailure(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.Canceled, false},
		{fmt.Errorf("redis store: decide: %w", context.Canceled), false},
		{errTimeout, true},
		{errRefused, true},
		{io.EOF, true},
		{redis.ErrPoolTimeout, true},
		{redis.ErrClosed, true},
		{errors.New("redis store: reply has 3 items, want 6"), true},
		{redis.Nil, false},
		{fmt.Errorf("x: %w", replyError("ERR user_script:1: Script attempted to access nonexistent global variable")), false},
		{replyError("NOSCRIPT No matching script. Please use EVAL."), false},
		{replyError("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{replyError("LOADING Redis is loading the dataset in memory"), true},
		{fmt.Errorf("x: %w", replyError("BUSY Redis is busy running a script.")), true},
		{replyError("READONLY You can't write against a read only replica."), true},
		{replyError("MASTERDOWN Link with MASTER is down"), true},
		{replyError("OOM command not allowed when used memory > 'maxmemory'."), false},
		{replyError("MISCONF Redis is configured to save RDB snapshots"), true},
		{replyError("NOAUTH Authentication required."), true},
		{replyError("CLUSTERDOWN The cluster is down"), true},
		{replyError("ERR max number of clients reached"), true},
	} {
		if got := redisstore.IsStoreFailure(tt.err); got != tt.want {
			t.Errorf("IsStoreFailure(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestBreakerAnsweredErrorsDoNotOpen(t *testing.T) {
	f := &fakeStore{}
	f.set(replyError("ERR script error"), nil)
	b, _ := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 2, IsFailure: redisstore.IsStoreFailure})
	for range 10 {
		if err := decideErr(b); err == nil || errors.Is(err, limits.ErrBreakerOpen) {
			t.Fatalf("got %v, want the script error passed through", err)
		}
	}
	if s := b.State(); s != limits.BreakerClosed {
		t.Fatalf("a store that answers with script errors opened the breaker (%s)", s)
	}
}

func TestBreakerProbesThenCloses(t *testing.T) {
	f := &fakeStore{}
	f.set(errRefused, errRefused)
	b, tr := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 1})
	_ = decideErr(b)
	waitState(t, b, limits.BreakerOpen)

	// The probe keeps pinging while the store is down, and stays open.
	deadline := time.Now().Add(time.Second)
	for f.pings.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := f.pings.Load(); n < 3 {
		t.Fatalf("%d probes in 1s at a 5ms interval", n)
	}
	if s := b.State(); s != limits.BreakerOpen {
		t.Fatalf("state %s while probes fail, want open", s)
	}

	// The store answers: the probe half-opens, one real call closes it.
	f.set(nil, nil)
	waitState(t, b, limits.BreakerHalfOpen)
	pings := f.pings.Load()
	if err := decideErr(b); err != nil {
		t.Fatalf("trial call: %v", err)
	}
	if s := b.State(); s != limits.BreakerClosed {
		t.Fatalf("state %s after a successful trial, want closed", s)
	}
	time.Sleep(20 * time.Millisecond)
	if n := f.pings.Load() - pings; n != 0 {
		t.Fatalf("%d probes after the breaker half-opened; the probe should have stopped", n)
	}
	if got, want := tr.list(), []string{"closed>open", "open>half_open", "half_open>closed"}; !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
}

func TestBreakerFailedTrialReopens(t *testing.T) {
	f := &fakeStore{}
	f.set(errRefused, nil) // PING answers but decisions fail (e.g. a script problem that is an outage)
	b, tr := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 1})
	_ = decideErr(b)
	waitState(t, b, limits.BreakerHalfOpen)
	if err := decideErr(b); errors.Is(err, limits.ErrBreakerOpen) || err == nil {
		t.Fatalf("trial returned %v, want the store's error", err)
	}
	if s := b.State(); s != limits.BreakerOpen {
		t.Fatalf("state %s after a failed trial, want open", s)
	}
	waitState(t, b, limits.BreakerHalfOpen) // probing resumed
	f.set(nil, nil)
	if err := decideErr(b); err != nil {
		t.Fatal(err)
	}
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed"}
	if got := tr.list(); !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
}

func TestBreakerHalfOpenAdmitsOnlyTrials(t *testing.T) {
	f := &fakeStore{}
	f.set(errRefused, nil)
	b, _ := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 1, HalfOpenTrials: 2})
	_ = decideErr(b)
	waitState(t, b, limits.BreakerHalfOpen)

	// Two trials hang in the store; a third call is refused at once.
	hold := make(chan struct{})
	f.mu.Lock()
	f.decideErr, f.hold = nil, hold
	f.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { errs[i] = decideErr(b) })
	}
	for f.decides.Load() < 3 { // 1 opening call + 2 trials
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if err := decideErr(b); !errors.Is(err, limits.ErrBreakerOpen) {
		t.Fatalf("third call while two trials run: %v, want ErrBreakerOpen", err)
	}
	// a call that waited for a trial would wait forever (the trials hang);
	// the bound only leaves room for a busy machine
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("refused call took %v", d)
	}
	close(hold)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trial %d: %v", i, err)
		}
	}
	if s := b.State(); s != limits.BreakerClosed {
		t.Fatalf("state %s after 2 successful trials, want closed", s)
	}
}

func TestBreakerLateResultsChangeNothing(t *testing.T) {
	f := &fakeStore{}
	b, tr := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 1, ProbeInterval: time.Hour})

	// A slow call starts while closed...
	hold := make(chan struct{})
	f.mu.Lock()
	f.hold = hold
	f.mu.Unlock()
	done := make(chan error)
	go func() { done <- decideErr(b) }()
	for f.decides.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	// ...another call fails and opens the breaker...
	f.mu.Lock()
	f.hold, f.decideErr = nil, errRefused
	f.mu.Unlock()
	_ = decideErr(b)
	if s := b.State(); s != limits.BreakerOpen {
		t.Fatalf("state %s, want open", s)
	}
	// ...and the slow call then succeeds: it belongs to the closed period
	// that ended, so it must not close the breaker.
	f.set(nil, nil)
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := b.State(); s != limits.BreakerOpen {
		t.Fatalf("a late success from before the opening moved the breaker to %s", s)
	}
	if got := tr.list(); !slices.Equal(got, []string{"closed>open"}) {
		t.Fatalf("transitions %v", got)
	}
}

func TestBreakerCostsNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	f := &fakeStore{}
	b, _ := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 1, ProbeInterval: time.Hour})
	batch := &limits.Batch{Checks: []limits.Check{{Key: "k"}}}
	res := make([]limits.Result, 1)
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { _, _ = b.Decide(ctx, batch, res) }); n != 0 {
		t.Errorf("closed breaker allocates %v per call", n)
	}
	f.set(errRefused, errRefused)
	_, _ = b.Decide(ctx, batch, res)
	if n := testing.AllocsPerRun(1000, func() { _, _ = b.Decide(ctx, batch, res) }); n != 0 {
		t.Errorf("open breaker allocates %v per refused call", n)
	}
}

func TestBreakerOpenAnswersInMicroseconds(t *testing.T) {
	// A store that takes the whole 50ms budget to fail, like a frozen Redis.
	f := &fakeStore{hold: make(chan struct{})}
	b, _ := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 5, ProbeInterval: time.Hour})
	call := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		var r [1]limits.Result
		_, err := b.Decide(ctx, &limits.Batch{Checks: []limits.Check{{Key: "k"}}}, r[:])
		return time.Since(start), err
	}
	for i := range 5 {
		if d, err := call(); err == nil || d < 45*time.Millisecond {
			t.Fatalf("call %d before opening: %v after %v, want a timeout after ~50ms", i, err, d)
		}
	}
	var worst time.Duration
	durs := make([]time.Duration, 10000)
	for i := range durs {
		d, err := call()
		if !errors.Is(err, limits.ErrBreakerOpen) {
			t.Fatalf("call %d: %v", i, err)
		}
		durs[i] = d
		worst = max(worst, d)
	}
	slices.Sort(durs)
	p99 := durs[len(durs)*99/100]
	t.Logf("open breaker: p50 %v, p99 %v, max %v over %d calls", durs[len(durs)/2], p99, worst, len(durs))
	if p99 > time.Millisecond {
		t.Fatalf("open breaker p99 %v, want far below the 50ms budget (< 1ms)", p99)
	}
}

func TestBreakerLogsOncePerOutage(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	w := zerolog.SyncWriter(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}))
	f := &fakeStore{}
	f.set(errRefused, nil)
	b, _ := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 2, Logger: zerolog.New(w).Level(zerolog.InfoLevel)})
	// An outage with several failed trials (PING answers, decisions fail).
	for range 200 {
		_ = decideErr(b)
	}
	for i := 0; i < 5; i++ {
		waitState(t, b, limits.BreakerHalfOpen)
		_ = decideErr(b)
	}
	f.set(nil, nil)
	waitState(t, b, limits.BreakerHalfOpen)
	if err := decideErr(b); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"level":"warn"`) || !strings.Contains(lines[0], "breaker open") ||
		!strings.Contains(lines[1], "breaker closed") || !strings.Contains(lines[1], `"failed_trials":5`) {
		t.Fatalf("want one warn line at opening and one info line at closing, got:\n%s", out)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestBreakerCloseStopsTheProbe(t *testing.T) {
	base := runtime.NumGoroutine()
	f := &fakeStore{}
	f.set(errRefused, errRefused)
	b := &gate{Breaker: limits.NewBreaker(f.Ping, "fake", limits.BreakerOptions{FailureThreshold: 1, OpenAfter: -1, ProbeInterval: time.Millisecond}), f: f}
	_ = decideErr(b)
	if b.State() != limits.BreakerOpen {
		t.Fatal("not open")
	}
	b.Close()
	b.Close() // twice is fine
	deadline := time.Now().Add(time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		t.Fatalf("%d goroutines after Close, %d before the breaker", n, base)
	}
}

// TestBreakerUnderFlappingStore hammers a breaker from many goroutines while
// the store flips between up and down, and checks that every transition is
// one the state machine allows and that the breaker ends closed.
func TestBreakerUnderFlappingStore(t *testing.T) {
	f := &fakeStore{}
	b, tr := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 3, ProbeInterval: time.Millisecond, HalfOpenTrials: 2})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = decideErr(b)
				_ = b.Ping(context.Background())
			}
		})
	}
	for i := range 40 {
		if i%2 == 0 {
			f.set(errRefused, errRefused)
		} else {
			f.set(nil, nil)
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.set(nil, nil)
	waitState(t, b, limits.BreakerClosed)
	close(stop)
	wg.Wait()

	allowed := map[string]bool{"closed>open": true, "open>half_open": true, "half_open>open": true, "half_open>closed": true}
	got := tr.list()
	state := "closed"
	for _, s := range got {
		from, to, _ := strings.Cut(s, ">")
		if !allowed[s] || from != state {
			t.Fatalf("impossible transition %s from state %s in %v", s, state, got)
		}
		state = to
	}
	if state != "closed" || len(got) < 3 {
		t.Fatalf("transitions %v: want several outages, ending closed", got)
	}
	t.Logf("%d transitions", len(got))
}

func TestBreakerFeedsTheLocalFallback(t *testing.T) {
	f := &fakeStore{}
	f.set(errRefused, errRefused)
	b, _ := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 2, ProbeInterval: time.Hour})
	rule := &limits.Rule{Name: "r", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.GCRA, Limit: 10, Period: time.Hour, Burst: 10, Cost: 1}
	local := memstore.New()
	defer local.Close()
	l := limits.New(limits.Options{Store: f, Breaker: b.Breaker, Fallback: local, LocalShare: 2, FailureMode: limits.FailLocal,
		Prefix: "rg", Rules: []*limits.Rule{rule}})
	var d limits.Decision
	admitted := 0
	for range 20 {
		_ = l.Decide(context.Background(), &limits.Request{IP: []byte("192.0.2.1")}, &d)
		if !d.Local {
			t.Fatal("decision not local while the store is down")
		}
		if d.Admitted {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d, want 5 (limit 10 / local_share 2)", admitted)
	}
	if n := f.decides.Load(); n != 2 {
		t.Fatalf("%d of 20 decisions reached the dead store, want 2 (the threshold)", n)
	}
}

// TestBreakerStarvedTimeoutsDoNotOpen: while the process is short of CPU
// (Starved), timed-out calls neither open the breaker nor reopen it from
// half-open; other failures still do, and timeouts do again once the
// process has CPU.
func TestBreakerStarvedTimeoutsDoNotOpen(t *testing.T) {
	var starved atomic.Bool
	timeout := fmt.Errorf("redis store: decide: %w", context.DeadlineExceeded)
	ioTimeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	f := &fakeStore{}
	b, tr := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 3, Starved: starved.Load})

	starved.Store(true)
	for i := range 20 {
		f.set([]error{timeout, ioTimeout}[i%2], nil)
		if err := decideErr(b); err == nil || errors.Is(err, limits.ErrBreakerOpen) {
			t.Fatalf("call %d: %v, want the store's timeout", i, err)
		}
	}
	if s := b.State(); s != limits.BreakerClosed || b.Starved() != 18 {
		t.Fatalf("state %s, %d starved timeouts after 20 while short of CPU; want closed, 18 (every one past the threshold)", s, b.Starved())
	}
	f.set(errRefused, nil)
	if _ = decideErr(b); b.State() != limits.BreakerOpen {
		t.Fatalf("a refused connection while short of CPU left the breaker %s, want open", b.State())
	}

	// Half-open: a starved trial's timeout keeps it half-open, another
	// trial may go; a timeout with CPU to spare reopens it.
	f.set(timeout, nil)
	waitState(t, b, limits.BreakerHalfOpen)
	if err := decideErr(b); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("trial: %v, want its timeout", err)
	}
	if s := b.State(); s != limits.BreakerHalfOpen {
		t.Fatalf("state %s after a starved trial timed out, want half_open", s)
	}
	starved.Store(false)
	if err := decideErr(b); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second trial: %v, want its timeout", err)
	}
	if s := b.State(); s != limits.BreakerOpen {
		t.Fatalf("state %s after a trial timed out with CPU to spare, want open", s)
	}
	want := []string{"closed>open", "open>half_open", "half_open>open"}
	if got := tr.list(); !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}

	// Closed again, with CPU: timeouts open it as before.
	f.set(nil, nil)
	waitState(t, b, limits.BreakerHalfOpen)
	if err := decideErr(b); err != nil {
		t.Fatal(err)
	}
	f.set(timeout, nil)
	for range 3 {
		_ = decideErr(b)
	}
	if s := b.State(); s != limits.BreakerOpen {
		t.Fatalf("state %s after 3 timeouts with CPU to spare, want open", s)
	}
}

// TestBreakerStarvedGraceEnds: timeouts while short of CPU keep the breaker
// closed for a second at most, so a Redis that froze during an overload
// is still taken for down.
func TestBreakerStarvedGraceEnds(t *testing.T) {
	timeout := fmt.Errorf("redis store: decide: %w", context.DeadlineExceeded)
	f := &fakeStore{}
	f.set(timeout, timeout)
	b, _ := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 3, Starved: func() bool { return true }})
	start := time.Now()
	for b.State() == limits.BreakerClosed && time.Since(start) < 3*time.Second {
		_ = decideErr(b)
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	if b.State() != limits.BreakerOpen || took < 900*time.Millisecond || took > 2*time.Second {
		t.Fatalf("state %s after %v of timeouts while short of CPU, want open after about 1s", b.State(), took)
	}
}

// TestBreakerCanceledTrialDecidesNothing: a half-open trial whose caller
// gave up (context.Canceled) says nothing about the store. It must not
// close the breaker as a success would: the store may still be failing,
// and every request would wait for it again.
func TestBreakerCanceledTrialDecidesNothing(t *testing.T) {
	f := &fakeStore{}
	f.set(errRefused, nil) // PING answers, decisions fail
	b, tr := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 1})
	_ = decideErr(b)
	waitState(t, b, limits.BreakerHalfOpen)
	f.set(context.Canceled, nil)
	if err := decideErr(b); !errors.Is(err, context.Canceled) {
		t.Fatalf("trial returned %v, want context.Canceled", err)
	}
	if s := b.State(); s != limits.BreakerHalfOpen {
		t.Fatalf("state %s after a canceled trial, want still half_open", s)
	}
	f.set(errRefused, nil)
	if err := decideErr(b); errors.Is(err, limits.ErrBreakerOpen) || err == nil {
		t.Fatalf("the next trial returned %v, want the store's error (a trial slot must be free)", err)
	}
	if got, want := tr.list(), []string{"closed>open", "open>half_open", "half_open>open"}; !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
}

// TestBreakerCanceledIsNoFailure: with the default failure test, callers
// that gave up (context.Canceled) do not count toward opening the breaker,
// however many there are; the store's own errors do.
func TestBreakerCanceledIsNoFailure(t *testing.T) {
	f := &fakeStore{}
	f.set(context.Canceled, nil)
	b, _ := newTestBreaker(t, f, limits.BreakerOptions{FailureThreshold: 2})
	for i := 0; i < 5; i++ {
		if err := decideErr(b); !errors.Is(err, context.Canceled) {
			t.Fatalf("call %d returned %v, want context.Canceled", i+1, err)
		}
	}
	if s := b.State(); s != limits.BreakerClosed {
		t.Fatalf("state %s after 5 canceled calls, want closed", s)
	}
	f.set(errRefused, nil)
	_ = decideErr(b)
	_ = decideErr(b)
	if s := b.State(); s == limits.BreakerClosed {
		t.Fatalf("state %s after 2 failures at threshold 2, want open", s)
	}
}
