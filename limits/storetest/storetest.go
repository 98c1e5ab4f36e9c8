// Package storetest is the store conformance suite: Run runs every case
// against a store a test opens, and each store package runs it on every
// way it can be reached (memstore; redisstore on one server with and
// without coalescing, Sentinel and Cluster). Its own tests compare the
// stores with reference models and with each other.
package storetest

import (
	"context"
	"flag"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// Store is one store under test plus the test-only views the conformance
// suite needs besides limits.Store.
type Store struct {
	// Name names the store in failure messages ("memory", "redis", ...).
	Name  string
	Store limits.Store
	// PeekAt is Peek on a timeline's own clock (nowUS), consuming nothing.
	PeekAt func(c limits.Check, nowUS int64) (limits.Result, error)
	// TTL is the remaining time to live of key, false when it is absent.
	TTL func(key string) (time.Duration, bool)
	// Raw is the store's limits.Inspector: the key's value as Redis holds it.
	Raw func(ctx context.Context, key string) (limits.RawValue, error)
}

// WindowStart returns the start of the current epoch-aligned window of
// length p, in µs: timelines start there so TTLs relative to the fake clock
// stay close to Redis's own clock.
func WindowStart(p time.Duration) int64 {
	pu := limits.PeriodUS(p)
	return time.Now().UnixMicro() / pu * pu
}

// SteadyPeriod returns a period of an hour or a little more whose
// epoch-aligned window, the one fixed_window and sliding_window count in,
// has at least half an hour left when the test process first asks: a test
// that decides on the store's own clock (NowUS 0) never sees its window
// turn over. With an hour-long period, a test that ran across a full hour
// found its limit whole again: a cluster refund test once counted 3
// admissions for a limit of 2 in a CI run near 20:00. The same value for
// the whole process: a key is never counted under two periods.
var SteadyPeriod = sync.OnceValue(func() int64 {
	const half = int64(30 * time.Minute / time.Microsecond)
	now := time.Now().UnixMicro()
	p := limits.PeriodUS(time.Hour)
	for p-now%p < half {
		p += limits.PeriodUS(time.Second)
	}
	return p
})

// SteadyDuration is SteadyPeriod as a duration, for a rule's Period or a
// config's "period:" (time.Duration's String, which config takes).
func SteadyDuration() time.Duration { return time.Duration(SteadyPeriod()) * time.Microsecond }

func DecideOne(t *testing.T, s limits.Store, c limits.Check, now int64) limits.Result {
	t.Helper()
	var r [1]limits.Result
	admitted, err := s.Decide(context.Background(), &limits.Batch{Checks: []limits.Check{c}, NowUS: now}, r[:])
	if err != nil {
		t.Fatalf("decide: %v", err)
	}
	if admitted != r[0].Allowed && !c.Shadow {
		t.Fatalf("admitted=%v but rule allowed=%v", admitted, r[0].Allowed)
	}
	return r[0]
}

// Step is one request of a timeline: advance the clock, send cost, expect.
type Step struct {
	advance       time.Duration
	cost          int64
	wantAllowed   bool
	wantRemaining int64
	wantRetry     time.Duration // -1µs = NeverFits
	wantReset     time.Duration
}

const NeverFits = time.Duration(limits.NeverFits) * time.Microsecond

func RunTimeline(t *testing.T, s limits.Store, c limits.Check, start int64, steps []Step) {
	t.Helper()
	now := start
	for i, st := range steps {
		now += int64(st.advance / time.Microsecond)
		c.Cost = st.cost
		r := DecideOne(t, s, c, now)
		got := Step{advance: st.advance, cost: st.cost, wantAllowed: r.Allowed, wantRemaining: r.Remaining,
			wantRetry: time.Duration(r.RetryUS) * time.Microsecond, wantReset: time.Duration(r.ResetUS) * time.Microsecond}
		if got != st {
			t.Fatalf("step %d (t=+%v): got %+v\nwant %+v", i, time.Duration(now-start)*time.Microsecond, got, st)
		}
	}
}

// ConcurrencyPeriod is long enough that a test never crosses a window
// boundary or sees a refill while it runs.
const ConcurrencyPeriod = 100 * 24 * time.Hour

var seedFlag = flag.Int64("seed", 0, "seed of the randomized store tests (0 = from the clock)")

// Seed returns the seed of a randomized test: the -seed flag, or the clock.
// It is logged, with the command that replays it, when the test fails.
func Seed(t testing.TB) int64 {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: replay with -run '^%s$' -seed=%d", seed, t.Name(), seed)
		}
	})
	return seed
}
