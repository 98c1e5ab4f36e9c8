package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// oneCheck is a batch of one fixed_window check of key.
func oneCheck(key string, limit int64) *limits.Batch {
	return &limits.Batch{Checks: []limits.Check{{Key: key, Algorithm: limits.FixedWindow, Limit: limit, PeriodUS: 3_600_000_000, Burst: limit, Cost: 1}}}
}

// waitTaken waits until the runners have taken n calls from the queue.
func waitTaken(t *testing.T, c *coalescer, n uint64) {
	t.Helper()
	waitCount(t, &c.taken, n, "calls taken by the runners")
}

// waitPipelines waits until the runners have sent at least n pipelines
// (each is counted a moment after its calls were taken).
func waitPipelines(t *testing.T, c *coalescer, n uint64) {
	t.Helper()
	waitCount(t, &c.pipelines, n, "pipelines sent")
}

// waitCount waits until v reaches n, failing after 5s.
func waitCount(t *testing.T, v *atomic.Uint64, n uint64, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for v.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d %s in 5s, want %d", v.Load(), what, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitQueued waits until exactly n calls are queued.
func waitQueued(t *testing.T, c *coalescer, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		q := len(c.queue)
		c.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued after 5s, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// oneRunnerStore starts a controllable redis-server and a store over it
// with a single pipeline runner, its script already loaded. The test
// closes the store when it needs to; otherwise cleanup does.
func oneRunnerStore(t *testing.T) (*testredis.Controlled, *redis.Client, *Store) {
	t.Helper()
	return controlledStore(t, CoalesceOptions{Pipelines: 1})
}

// controlledStore is oneRunnerStore with the coalescing options o.
func controlledStore(t *testing.T, o CoalesceOptions) (*testredis.Controlled, *redis.Client, *Store) {
	t.Helper()
	rs := testredis.StartControlled(t)
	client := redis.NewClient(&redis.Options{Addr: rs.Addr, ContextTimeoutEnabled: true})
	store, err := New(client, "redis", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := store.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	return rs, client, store
}

// TestCoalescedBatchesWhileBusy: with one pipeline in flight (Redis
// frozen), the calls that arrive meanwhile leave together in the next
// pipeline, as one FCALL of DecideMany, and every one of them gets its own
// answer.
func TestCoalescedBatchesWhileBusy(t *testing.T) {
	rs, client, store := oneRunnerStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	rs.Freeze()
	first := make(chan error, 1)
	go func() {
		var r [1]limits.Result
		_, err := store.Decide(ctx, oneCheck("co:{first}:fw", 10), r[:])
		first <- err
	}()
	waitTaken(t, store.co, 1) // the only runner holds the first call

	const n = 50
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r [1]limits.Result
			// Keys alternate between two counters of limit 20: exactly 20
			// of the 25 calls on each are admitted.
			ok, err := store.Decide(ctx, oneCheck([]string{"co:{a}:fw", "co:{b}:fw"}[i%2], 20), r[:])
			if err != nil {
				errs <- err
				return
			}
			if ok {
				admitted.Add(1)
			}
		}()
	}
	waitQueued(t, store.co, n) // all of them, before Redis thaws
	rs.Thaw()
	if err := <-first; err != nil {
		t.Fatalf("first call: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("queued call: %v", err)
	}
	if got := admitted.Load(); got != 40 {
		t.Fatalf("admitted %d, want 40 (20 per counter)", got)
	}
	st, _ := store.Coalescing()
	if st.Pipelines != 2 || st.Calls != n+1 {
		t.Fatalf("stats %+v, want 2 pipelines carrying %d calls", st, n+1)
	}
	if calls := commandCalls(t, client); calls["fcall"] != 2 || calls["time"] != 2 {
		t.Fatalf("commandstats fcall=%d time=%d, want 2 of each: the first call, then the %d as one", calls["fcall"], calls["time"], n)
	}
}

// takenAt is when each of c's pipelines in flight was taken, oldest first.
func takenAt(c *coalescer) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at []time.Time
	for _, t := range c.flying {
		if !t.IsZero() {
			at = append(at, t)
		}
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	return at
}

// decideLater returns a function that decides a one-check call (limit
// 10) on a key in a goroutine of its own, and sends its error to errs.
func decideLater(ctx context.Context, store *Store, errs chan<- error) func(key string) {
	return func(key string) {
		go func() {
			var r [1]limits.Result
			_, err := store.Decide(ctx, oneCheck(key, 10), r[:])
			errs <- err
		}()
	}
}

// primeBatches makes c's recent batches look like the load's of a busy
// service (mean batch n), so that the hold-back engages at once.
func primeBatches(c *coalescer, n float64) {
	c.mu.Lock()
	c.batchMean, c.sentMean = n, n
	c.mu.Unlock()
}

// TestCoalescedOverlap: with two runners and batches that grow by waiting,
// a second pipeline leaves while the first is in flight only once the
// first has waited Overlap (here a frozen Redis: the stall the second
// connection is for), or at once when a full batch is queued, or at once
// with a negative Overlap, or at once while the batches hold single calls
// (few callers: waiting would not grow them). Every call is answered once
// Redis thaws.
func TestCoalescedOverlap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		overlap  time.Duration
		maxBatch int
		mean     float64 // recent batches' mean size
		// queued is how many calls follow the first; minGap and maxGap
		// bound when the second pipeline leaves after the first
		queued         int
		minGap, maxGap time.Duration
	}{
		{"after the overlap", 300 * time.Millisecond, 0, 10, 1, 300 * time.Millisecond, 2 * time.Second},
		{"full batch at once", 10 * time.Second, 4, 10, 4, 0, time.Second},
		{"negative: at once", -1, 0, 10, 1, 0, time.Second},
		{"single calls: at once", 10 * time.Second, 0, 1, 1, 0, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, _, store := controlledStore(t, CoalesceOptions{Pipelines: 2, Overlap: tc.overlap, MaxBatch: tc.maxBatch})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			primeBatches(store.co, tc.mean)
			rs.Freeze()
			defer rs.Thaw()
			errs := make(chan error, 1+tc.queued)
			decide := decideLater(ctx, store, errs)
			decide("co:{first}:fw")
			waitTaken(t, store.co, 1)
			first := takenAt(store.co)[0] // the coalescer's own clock, not this goroutine's
			for i := range tc.queued {
				decide(fmt.Sprintf("co:{q%d}:fw", i))
			}
			if tc.minGap > 50*time.Millisecond {
				time.Sleep(50 * time.Millisecond)
				st, _ := store.Coalescing()
				// (read before the clock: a second pipeline counted here
				// left before now)
				if st.Pipelines != 1 && time.Since(first) < tc.minGap {
					t.Fatalf("%v into the stall: %d pipelines sent, want the first alone", time.Since(first), st.Pipelines)
				}
			}
			waitTaken(t, store.co, uint64(1+tc.queued))
			waitPipelines(t, store.co, 2)
			if st, _ := store.Coalescing(); st.Pipelines != 2 {
				t.Fatalf("%d pipelines sent, want 2: the first, then the queued calls together", st.Pipelines)
			}
			// Redis is frozen: both pipelines are still in flight
			at := takenAt(store.co)
			if len(at) != 2 {
				t.Fatalf("%d pipelines in flight, want 2", len(at))
			}
			if gap := at[1].Sub(at[0]); gap < tc.minGap || gap > tc.maxGap {
				t.Fatalf("the second pipeline left %v after the first, want between %v and %v", gap, tc.minGap, tc.maxGap)
			}
			rs.Thaw()
			for range 1 + tc.queued {
				if err := <-errs; err != nil {
					t.Fatalf("call after the thaw: %v", err)
				}
			}
		})
	}
}

// TestCoalescedStallHoldsBack: with three runners, once two pipelines have
// stalled (a frozen Redis) the third does not follow them with the calls
// that keep arriving (each would end past its deadline, as a late reply to
// refund); once Redis thaws, it sends them.
func TestCoalescedStallHoldsBack(t *testing.T) {
	rs, _, store := controlledStore(t, CoalesceOptions{Pipelines: 3, Overlap: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	primeBatches(store.co, 10)
	rs.Freeze()
	defer rs.Thaw()
	errs := make(chan error, 3)
	decide := decideLater(ctx, store, errs)
	decide("co:{one}:fw")
	waitTaken(t, store.co, 1)
	decide("co:{two}:fw")
	waitTaken(t, store.co, 2) // after the first has waited 50ms
	decide("co:{three}:fw")
	waitQueued(t, store.co, 1)
	time.Sleep(300 * time.Millisecond) // both in flight have stalled for long
	if st, _ := store.Coalescing(); st.Pipelines != 2 {
		t.Fatalf("%d pipelines sent into a frozen Redis, want 2", st.Pipelines)
	}
	waitQueued(t, store.co, 1)
	rs.Thaw()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("call after the thaw: %v", err)
		}
	}
	if st, _ := store.Coalescing(); st.Pipelines != 3 {
		t.Fatalf("%d pipelines after the thaw, want 3", st.Pipelines)
	}
}

// TestBatchMeanFollowsTakes: the mean that turns the hold-back on follows
// the batches taken: it passes 2 after a run of batches of ten and falls
// below 2 again after a run of single calls.
func TestBatchMeanFollowsTakes(t *testing.T) {
	c := &coalescer{opt: CoalesceOptions{MaxBatch: 128}, flying: make([]time.Time, 2), ready: make(chan struct{}, 1), batchMean: 1}
	run := func(size, times int) float64 {
		for range times {
			c.queue = make([]*scriptCall, size)
			c.mu.Lock()
			c.takeLocked(0, nil)
			c.flying[0] = time.Time{}
		}
		return c.batchMean
	}
	if m := run(10, 8); m < 2 {
		t.Fatalf("after 8 batches of 10 the mean is %.2f, want >= 2", m)
	}
	if m := run(1, 24); m >= 2 {
		t.Fatalf("after 24 single calls the mean is %.2f, want < 2", m)
	}
}

// TestOverlapWait: how long a runner holding calls holds back, from what
// is in flight: the youngest pipeline in flight counts; a full queue, a
// negative Overlap or batches of fewer than two calls on average send at
// once; two stalled pipelines hold back even a full batch; nothing in
// flight is no wait.
func TestOverlapWait(t *testing.T) {
	now := time.Now()
	ms := time.Millisecond
	for _, tc := range []struct {
		name    string
		overlap time.Duration
		flying  []time.Time
		queued  int
		want    time.Duration
	}{
		{"none in flight", ms, []time.Time{{}, {}}, 1, 0},
		{"one young", 10 * ms, []time.Time{now.Add(-4 * ms), {}}, 1, 6 * ms},
		{"youngest counts", 10 * ms, []time.Time{now.Add(-9 * ms), now.Add(-2 * ms), {}}, 1, 8 * ms},
		{"waited enough", 10 * ms, []time.Time{now.Add(-11 * ms), {}}, 1, 0},
		{"two stalled", 10 * ms, []time.Time{now.Add(-11 * ms), now.Add(-30 * ms), {}}, 1, 10 * ms},
		{"two stalled, full batch", 10 * ms, []time.Time{now.Add(-11 * ms), now.Add(-30 * ms), {}}, 4, 10 * ms},
		{"one stalled, full batch", 10 * ms, []time.Time{now.Add(-30 * ms), now.Add(-1 * ms), {}}, 4, 0},
		{"full batch", 10 * ms, []time.Time{now.Add(-1 * ms), {}}, 4, 0},
		{"negative", -1, []time.Time{now.Add(-1 * ms), {}}, 1, 0},
		{"single calls", 10 * ms, []time.Time{now.Add(-1 * ms), {}}, 1, 0},
	} {
		mean := 5.0 // batches that grow by waiting
		if tc.name == "single calls" {
			mean = 1.5
		}
		c := &coalescer{opt: CoalesceOptions{Overlap: tc.overlap, MaxBatch: 4}, flying: tc.flying, queue: make([]*scriptCall, tc.queued),
			batchMean: mean}
		if got := c.overlapWait(now); got != tc.want {
			t.Errorf("%s: overlapWait %v, want %v", tc.name, got, tc.want)
		}
	}
	// Coalescing off: one call per round trip, as many at once as there
	// are runners; nothing holds back.
	if o := (CoalesceOptions{Disabled: true}).withDefaults(); o.Overlap >= 0 {
		t.Errorf("coalescing off: Overlap %v, want negative (no holding back)", o.Overlap)
	}
}

// TestCoalescedDeadlines: a frozen Redis holds the only runner, yet every
// caller is answered (with an error) by its own deadline, calls whose
// deadline passed in the queue are never sent, and once Redis is back the
// next call is decided normally.
func TestCoalescedDeadlines(t *testing.T) {
	rs, client, store := oneRunnerStore(t)

	rs.Freeze()
	defer rs.Thaw()
	// The first call takes the runner for 400 ms; the second, queued behind
	// it with a 100 ms budget, must fail after ~100 ms, not ~500 ms.
	slow := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
		defer cancel()
		var r [1]limits.Result
		_, err := store.Decide(ctx, oneCheck("co:{slow}:fw", 10), r[:])
		slow <- err
	}()
	waitTaken(t, store.co, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	var r [1]limits.Result
	_, err := store.Decide(ctx, oneCheck("co:{queued}:fw", 10), r[:])
	took := time.Since(start)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued call: err %v, want deadline exceeded", err)
	}
	if took < 100*time.Millisecond || took > 300*time.Millisecond {
		t.Fatalf("queued call answered after %v, want its own 100 ms budget", took)
	}
	if err := <-slow; err == nil {
		t.Fatal("slow call against a frozen Redis succeeded")
	}

	rs.Thaw()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ok, err := store.Decide(ctx, oneCheck("co:{after}:fw", 10), r[:]); err != nil || !ok {
		t.Fatalf("after thaw: admitted %v, err %v", ok, err)
	}
	st, _ := store.Coalescing()
	if st.Expired != 1 {
		t.Fatalf("stats %+v: want the queued call expired unsent", st)
	}
	// Nothing was written for the call that expired in the queue.
	if n, err := client.Exists(ctx, "co:{queued}:fw").Result(); err != nil || n != 0 {
		t.Fatalf("expired call's key exists: %d, %v", n, err)
	}
}

// TestCoalescedNoScript: after SCRIPT FLUSH (a restart, a failover) the
// pipelined EVALSHAs answer NOSCRIPT and are sent again as EVAL.
func TestCoalescedNoScript(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	store, err := New(client, "redis")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round := range 3 {
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var admitted atomic.Int64
		for range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var r [1]limits.Result
				ok, err := store.Decide(ctx, oneCheck("co:{noscript}:fw", 1000), r[:])
				if err != nil {
					t.Errorf("round %d: %v", round, err)
				}
				if ok {
					admitted.Add(1)
				}
			}()
		}
		wg.Wait()
		if admitted.Load() != 30 {
			t.Fatalf("round %d: admitted %d of 30", round, admitted.Load())
		}
	}
	r, err := store.Peek(ctx, oneCheck("co:{noscript}:fw", 1000).Checks[0])
	if err != nil || r.Remaining != 910 {
		t.Fatalf("after 90 admitted: remaining %d, err %v; want 910", r.Remaining, err)
	}
}

// TestCoalescedClose: Close fails what is still queued, returns although
// Redis is frozen mid-pipeline no later than that pipeline's deadline plus
// the late grace (its runner waits that long for a reply to give back),
// and later calls fail at once.
func TestCoalescedClose(t *testing.T) {
	rs, _, store := oneRunnerStore(t)
	rs.Freeze()
	defer rs.Thaw()
	results := make(chan error, 2)
	for i := range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			var r [1]limits.Result
			_, err := store.Decide(ctx, oneCheck("co:{close}:fw", 10), r[:])
			results <- err
		}()
		if i == 0 {
			waitTaken(t, store.co, 1)
		}
	}
	waitQueued(t, store.co, 1)
	start := time.Now()
	store.Close()
	if took := time.Since(start); took > 300*time.Millisecond+DefaultLateGrace+time.Second {
		t.Fatalf("Close took %v", took)
	}
	for range 2 {
		if err := <-results; err == nil {
			t.Fatal("a call in flight at Close succeeded against a frozen Redis")
		}
	}
	var r [1]limits.Result
	if _, err := store.Decide(context.Background(), oneCheck("co:{late}:fw", 10), r[:]); !errors.Is(err, errCoalescerClosed) {
		t.Fatalf("call after Close: %v, want %v", err, errCoalescerClosed)
	}
}

// TestCoalescedWaitUnderLoadOnly: a runner lingers Wait for more decisions
// only while its batches show load (two or more on average): an idle
// store answers a lone decision at once, a busy one gathers the decisions
// that arrive during the linger into one pipeline.
func TestCoalescedWaitUnderLoadOnly(t *testing.T) {
	const wait = 300 * time.Millisecond
	_, _, store := controlledStore(t, CoalesceOptions{Pipelines: 1, Wait: wait})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	co := store.co
	primeBatches(co, 1) // idle
	start := time.Now()
	var r [1]limits.Result
	if _, err := store.Decide(ctx, oneCheck("wl:{idle}", 10), r[:]); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= wait/2 {
		t.Fatalf("an idle store took %v to answer a lone decision, want far less than Wait (%v)", took, wait)
	}

	primeBatches(co, 8) // busy
	took, n := lingerThree(ctx, t, store, "wl")
	if took < wait*3/4 {
		t.Fatalf("a busy store answered after %v, want it to have lingered about Wait (%v)", took, wait)
	}
	if n != 1 {
		t.Fatalf("three decisions during a linger went in %d pipelines, want 1", n)
	}
}

// lingerThree makes three decisions on a store with one runner: one, and
// two more once the runner holds the first (lingering, when it does). It
// returns how long the three took to be answered and in how many
// pipelines they went.
func lingerThree(ctx context.Context, t *testing.T, store *Store, prefix string) (time.Duration, uint64) {
	t.Helper()
	co := store.co
	before, taken := co.pipelines.Load(), co.taken.Load()
	errs := make(chan error, 3)
	decide := decideLater(ctx, store, errs)
	start := time.Now()
	decide(prefix + ":{a}")
	waitTaken(t, co, taken+1) // the runner holds the first while it lingers
	decide(prefix + ":{b}")
	decide(prefix + ":{c}")
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return time.Since(start), co.pipelines.Load() - before
}

// TestCoalescedLingerEndsWhenFull: a lingering runner sends as soon as its
// batch is as full as its recent pipelines were, not at the end of Wait:
// with few callers in a closed loop the rest of Wait would be idle time
// on every decision. Fewer calls than that still wait out Wait
// (TestCoalescedWaitUnderLoadOnly).
func TestCoalescedLingerEndsWhenFull(t *testing.T) {
	const wait = 2 * time.Second
	_, _, store := controlledStore(t, CoalesceOptions{Pipelines: 1, Wait: wait})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	primeBatches(store.co, 3) // the last pipelines carried three decisions
	took, n := lingerThree(ctx, t, store, "lf")
	if took >= wait/2 {
		t.Fatalf("three decisions, as many as the recent pipelines carried, were answered after %v: the runner lingered on for Wait (%v)", took, wait)
	}
	if n != 1 {
		t.Fatalf("three decisions gathered by a linger went in %d pipelines, want 1", n)
	}
}
