package memstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

func TestEvictsIdleKeys(t *testing.T) {
	s := NewSweeping(20 * time.Millisecond)
	defer s.Close()
	ctx := context.Background()
	var r [1]limits.Result
	for i := 0; i < 10000; i++ {
		c := limits.Check{Key: "rg:{e:" + strconv.Itoa(i) + "}:fw", Algorithm: limits.FixedWindow, Limit: 5,
			PeriodUS: limits.PeriodUS(100 * time.Millisecond), Burst: 5, Cost: 1}
		if _, err := s.Decide(ctx, &limits.Batch{Checks: []limits.Check{c}}, r[:]); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n == 0 {
		t.Fatal("no keys stored")
	}
	deadline := time.Now().Add(3 * time.Second)
	for s.Len() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("%d idle keys still stored after their windows ended", n)
	}
}

// TestEveryAlgorithmHasATwin: the memory store implements every algorithm
// of the algorithm table, and nothing else.
func TestEveryAlgorithmHasATwin(t *testing.T) {
	for _, a := range limits.Algorithms {
		if algos[a] == nil {
			t.Errorf("%s: no Go twin registered", a)
		}
	}
	if len(algos) != len(limits.Algorithms) {
		t.Errorf("%d twins registered for %d algorithms", len(algos), len(limits.Algorithms))
	}
}

// TestMaxKeysBounds: a flood of new keys, each with a long TTL, keeps the
// store at SetMaxKeys (about: a whole number per shard), counting what it
// dropped; the key just written is kept, and a key drops an expired one
// before a live one.
func TestMaxKeysBounds(t *testing.T) {
	s := New()
	defer s.Close()
	s.SetMaxKeys(10 * memShards)
	ctx := context.Background()
	var r [1]limits.Result
	check := func(key string, period time.Duration) limits.Check {
		return limits.Check{Key: key, Algorithm: limits.FixedWindow, Limit: 5,
			PeriodUS: limits.PeriodUS(period), Burst: 5, Cost: 1}
	}
	const n = 20000
	for i := range n {
		c := check("rg:{flood:"+strconv.Itoa(i)+"}:fw", time.Hour)
		if _, err := s.Decide(ctx, &limits.Batch{Checks: []limits.Check{c}}, r[:]); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.TTL(c.Key); !ok {
			t.Fatalf("key %d dropped as it was written", i)
		}
	}
	if got := s.Len(); got > 10*memShards {
		t.Fatalf("%d keys after %d new ones, want at most %d", got, n, 10*memShards)
	}
	if got, want := s.Evictions(), uint64(n-10*memShards); got != want {
		t.Fatalf("%d evictions, want %d (every key beyond the bound was live)", got, want)
	}

	// One key per shard: in a shard holding a live key and an expired one,
	// a new key takes the expired one's place.
	s.SetMaxKeys(2 * memShards)
	var same []string
	for i := 0; len(same) < 3; i++ {
		k := "rg:{s:" + strconv.Itoa(i) + "}:fw"
		if s.shardOf(k) == 0 {
			same = append(same, k)
		}
	}
	sh := &s.shards[0]
	sh.mu.Lock()
	clear(sh.m)
	now := s.now()
	sh.m[same[0]] = &state{expireUS: now + time.Hour.Microseconds()}
	sh.m[same[1]] = &state{expireUS: now - 1}
	sh.units = 2 // what the two weigh
	sh.mu.Unlock()
	before := s.Evictions()
	if _, err := s.Decide(ctx, &limits.Batch{Checks: []limits.Check{check(same[2], time.Hour)}}, r[:]); err != nil {
		t.Fatal(err)
	}
	sh.mu.Lock()
	_, live := sh.m[same[0]]
	_, expired := sh.m[same[1]]
	_, added := sh.m[same[2]]
	sh.mu.Unlock()
	if !live || expired || !added || s.Evictions() != before {
		t.Fatalf("live kept %v, expired kept %v, new added %v, evictions +%d: want the expired key dropped, nothing counted",
			live, expired, added, s.Evictions()-before)
	}

	// A live lease record is kept even when it expires first: a counter
	// goes instead.
	var more []string
	for i := 0; len(more) < 3; i++ {
		k := "rg:{l:" + strconv.Itoa(i) + "}:fw"
		if s.shardOf(k) == 1 {
			more = append(more, k)
		}
	}
	sh = &s.shards[1]
	sh.mu.Lock()
	clear(sh.m)
	sh.m[more[0]] = &state{expireUS: now + time.Minute.Microseconds(), lease: []memSlice{{}}}
	sh.m[more[1]] = &state{expireUS: now + time.Hour.Microseconds()}
	sh.units = 2
	sh.mu.Unlock()
	if _, err := s.Decide(ctx, &limits.Batch{Checks: []limits.Check{check(more[2], time.Hour)}}, r[:]); err != nil {
		t.Fatal(err)
	}
	sh.mu.Lock()
	_, lease := sh.m[more[0]]
	_, counter := sh.m[more[1]]
	sh.mu.Unlock()
	if !lease || counter || s.Evictions() != before+1 {
		t.Fatalf("lease kept %v, counter kept %v, evictions +%d: want the counter dropped and counted", lease, counter, s.Evictions()-before)
	}
}

// TestMaxKeysKeepsTheBatch: making room for one key of a decision never
// drops another key the same decision wrote. Each batch is a limit-1 key
// A, the soonest to expire, and a fresh key in A's full shard: A must
// stay counted, so only the first batch is admitted.
func TestMaxKeysKeepsTheBatch(t *testing.T) {
	s := New()
	defer s.Close()
	s.SetMaxKeys(4 * memShards)
	ctx := context.Background()
	fill := func(i int) limits.Check {
		return limits.Check{Key: "rg:{fill:" + strconv.Itoa(i) + "}:fw", Algorithm: limits.FixedWindow, Limit: 5,
			PeriodUS: storetest.SteadyPeriod(), Burst: 5, Cost: 1}
	}
	var r [2]limits.Result
	for i := range 4000 {
		if _, err := s.Decide(ctx, &limits.Batch{Checks: []limits.Check{fill(i)}}, r[:1]); err != nil {
			t.Fatal(err)
		}
	}
	// gcra: no window boundary that could make A's limit whole again in
	// the loop; its record expires within a minute, before the fills'
	a := limits.Check{Key: "rg:{a:1}:gc", Algorithm: limits.GCRA, Limit: 1, PeriodUS: limits.PeriodUS(time.Minute), Burst: 1, Cost: 1}
	admitted := 0
	for n, i := 0, 4000; n < 200; i++ {
		c := fill(i)
		if s.shardOf(c.Key) != s.shardOf(a.Key) {
			continue
		}
		n++
		ok, err := s.Decide(ctx, &limits.Batch{Checks: []limits.Check{a, c}}, r[:])
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			admitted++
		}
	}
	if admitted != 1 {
		t.Fatalf("%d of 200 batches admitted with a limit of 1 on their first key, want 1", admitted)
	}
}

// TestMaxKeysKeepsALeasedCounter: a lease take charges the window counter
// and then writes the lease record; making room for the record must not
// drop the counter (or every take would find the whole limit again).
func TestMaxKeysKeepsALeasedCounter(t *testing.T) {
	s := New()
	defer s.Close()
	s.SetMaxKeys(memShards) // one key per shard: the record's insert must make room
	ctx := context.Background()
	var r [1]limits.Result
	for i := range 2000 {
		c := limits.Check{Key: "rg:{fill:" + strconv.Itoa(i) + "}:fw", Algorithm: limits.FixedWindow, Limit: 5,
			PeriodUS: limits.PeriodUS(time.Hour), Burst: 5, Cost: 1}
		if _, err := s.Decide(ctx, &limits.Batch{Checks: []limits.Check{c}}, r[:]); err != nil {
			t.Fatal(err)
		}
	}
	// A key whose lease record lives in its own shard.
	key := ""
	for i := 0; key == ""; i++ {
		if k := "rg:{leased:" + strconv.Itoa(i) + "}:fw"; s.shardOf(k) == s.shardOf(limits.LeaseKey(k)) {
			key = k
		}
	}
	var granted int64
	for i := range 20 {
		g, err := s.TakeLease(ctx, &limits.LeaseTake{
			Check: limits.Check{Key: key, Algorithm: limits.FixedWindow, Limit: 10,
				PeriodUS: limits.PeriodUS(time.Minute), Burst: 10, Cost: 1},
			Want: 10, ID: "i" + strconv.Itoa(i) + "-1",
		})
		if err != nil {
			t.Fatal(err)
		}
		granted += g.Granted
	}
	if granted > 10 {
		t.Fatalf("20 takes of a limit of 10 in one window granted %d", granted)
	}
}
