package limits

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/race"
)

// TestKeyIntern: equal bytes give equal strings, later changes to the
// buffer do not reach a string handed out, and a shard never outgrows its
// bound.
func TestKeyIntern(t *testing.T) {
	k := newKeyIntern()
	buf := []byte("rg:{u:alice}:fw")
	a := k.get(buf)
	copy(buf, "XXXXXXXXX")
	if a != "rg:{u:alice}:fw" {
		t.Fatalf("interned string changed with its source buffer: %q", a)
	}
	if b := k.get([]byte("rg:{u:alice}:fw")); b != a {
		t.Fatalf("%q != %q", b, a)
	}
	if n := testing.AllocsPerRun(100, func() { _ = k.get([]byte("rg:{u:alice}:fw")) }); n != 0 && !race.Enabled {
		t.Fatalf("a known key allocates %v times", n)
	}
	for i := range keyInternShards * keyInternShardMax * 2 {
		_ = k.get([]byte("rg:{u:" + strconv.Itoa(i) + "}:fw"))
	}
	for i := range k.shards {
		if n := k.shards[i].n; n > keyInternShardMax {
			t.Fatalf("shard %d holds %d keys, bound %d", i, n, keyInternShardMax)
		}
	}
}

// nopStore admits everything without allocating, so that an allocation
// guard around the limiter counts the limiter's own.
type nopStore struct{}

func (nopStore) Decide(_ context.Context, b *Batch, res []Result) (bool, error) {
	for i := range b.Checks {
		res[i] = Result{Allowed: true, Remaining: 1}
	}
	return true, nil
}
func (nopStore) Peek(context.Context, Check) (Result, error) { return Result{}, nil }
func (nopStore) Reset(context.Context, Check) error          { return nil }
func (nopStore) Ping(context.Context) error                  { return nil }
func (nopStore) Name() string                                { return "nop" }
func (nopStore) Close() error                                { return nil }

// TestLimiterAllocs: matching three rules and building their keys (an
// escaped identity among them) allocates nothing once the keys are known.
func TestLimiterAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are only meaningful without -race")
	}
	rules := []*Rule{
		{Name: "per-user", Key: []KeyPart{{Kind: KeyUser}}, Algorithm: FixedWindow, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1},
		{Name: "per-route", Match: Match{PathPrefix: "/api/"}, Key: []KeyPart{{Kind: KeyRoute}, {Kind: KeyMethod}}, Algorithm: GCRA, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1},
		{Name: "global", Algorithm: SlidingWindow, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1},
	}
	l := NewLimiter(nopStore{}, "rg", rules)
	req := &Request{Method: []byte("GET"), Route: []byte("/api/items/{x}"), IP: []byte("192.0.2.7"), User: []byte("al ice:%")}
	var d Decision
	ctx := context.Background()
	if err := l.Decide(ctx, req, &d); err != nil || !d.Admitted || len(d.Verdicts) != 3 {
		t.Fatalf("decide: %v %+v", err, d)
	}
	n := testing.AllocsPerRun(1000, func() { _ = l.Decide(ctx, req, &d) })
	if n != 0 {
		t.Fatalf("%v allocations per decision of 3 rules, want 0", n)
	}
}

// TestKeyInternConcurrent: look-ups racing with the inserts, growth and
// restarts of their shard always return the bytes asked for, short keys
// (held in their entry) and long ones alike.
func TestKeyInternConcurrent(t *testing.T) {
	k := newKeyIntern()
	long := strings.Repeat("x", internInline)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range keyInternShards * keyInternShardMax / 2 {
				key := "rg:{u:" + strconv.Itoa((i*7+g)%(keyInternShards*keyInternShardMax)) + "}:fw"
				if i%5 == 0 {
					key += long
				}
				if s := k.get([]byte(key)); s != key {
					t.Errorf("get(%q) = %q", key, s)
					return
				}
			}
		}()
	}
	wg.Wait()
}
