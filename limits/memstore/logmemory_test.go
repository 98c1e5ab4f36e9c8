package memstore

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestMaxKeysBoundsSlidingLogMemory: memory_max_keys bounds what the
// memory store keeps, sliding_log keys' logs included. A sliding_log key
// holds one entry per admitted request, up to its limit, so a client that
// spends one key's quota after another (a route or header value each) grew
// the store by the entries while the key count stayed under the bound:
// with the defaults, up to 1e6 keys of 10,000 entries. A log now weighs a
// key for every logPerKey entries it has room for, and a store of 400 logs
// of 500 entries (160,000 admitted requests) under a bound of 2,560 stays
// within the bound's memory (about 450 B a key; 1 KiB allowed).
func TestMaxKeysBoundsSlidingLogMemory(t *testing.T) {
	s := New()
	defer s.Close()
	const bound = memShards * 40
	s.SetMaxKeys(bound)
	const keys, limit = 400, 500
	ctx := context.Background()
	var r [1]limits.Result
	now := time.Now().UnixMicro()
	before := liveHeap()
	admitted := 0
	for i := range keys {
		c := limits.Check{Key: "rg:{per-route:/r" + strconv.Itoa(i) + "}:sl2", Algorithm: limits.SlidingLog, Limit: limit,
			PeriodUS: limits.PeriodUS(time.Hour), Burst: limit, Cost: 1}
		for j := range limit {
			b := limits.Batch{Checks: []limits.Check{c}, NowUS: now + int64(j)}
			ok, err := s.Decide(ctx, &b, r[:])
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				admitted++
			}
		}
	}
	grew := int64(liveHeap()) - int64(before)
	t.Logf("%d keys kept, %d evicted, %d admitted requests: heap grew %.2f MiB (%.0f B per key of the bound)",
		s.Len(), s.Evictions(), admitted, float64(grew)/(1<<20), float64(grew)/bound)
	if admitted != keys*limit {
		t.Fatalf("%d admitted, want %d: each key's quota is spent once", admitted, keys*limit)
	}
	if grew > bound<<10 {
		t.Fatalf("heap grew %d B (%d B per key of the bound of %d): the logs are not counted against memory_max_keys",
			grew, grew/bound, bound)
	}
	if s.Evictions() == 0 {
		t.Fatal("no key was evicted: the logs weigh nothing against the bound")
	}
	var units int64
	for i := range s.shards {
		units += s.shards[i].units
	}
	if units > bound+memShards*(1+limit/logPerKey*2) {
		t.Fatalf("the shards weigh %d, bound %d", units, bound)
	}
}

// TestUnitsFollowTheKeys: what the shards weigh is what their keys weigh,
// through admissions, resets, sweeps and evictions.
func TestUnitsFollowTheKeys(t *testing.T) {
	s := New()
	defer s.Close()
	s.SetMaxKeys(memShards * 4)
	ctx := context.Background()
	now := time.Now().UnixMicro()
	var r [2]limits.Result
	for i := range 300 {
		log := limits.Check{Key: "log" + strconv.Itoa(i%40), Algorithm: limits.SlidingLog, Limit: 30,
			PeriodUS: 1_000_000, Burst: 30, Cost: 1}
		fw := limits.Check{Key: "fw" + strconv.Itoa(i), Algorithm: limits.FixedWindow, Limit: 5, PeriodUS: 1_000_000, Cost: 1}
		b := limits.Batch{Checks: []limits.Check{log, fw}, NowUS: now + int64(i)*10_000}
		if _, err := s.Decide(ctx, &b, r[:]); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 {
			if err := s.Reset(ctx, log); err != nil {
				t.Fatal(err)
			}
		}
		if i%50 == 0 {
			s.sweep(now + int64(i)*10_000)
		}
		for j := range s.shards {
			sh := &s.shards[j]
			var w int64
			for _, st := range sh.m {
				w += weight(st)
			}
			if w != sh.units {
				t.Fatalf("step %d, shard %d: units %d, its keys weigh %d", i, j, sh.units, w)
			}
		}
	}
	if s.Evictions() == 0 {
		t.Fatal("no eviction: the bound was never reached")
	}
}

// TestMaxKeysBoundsATrimmedLog: a sliding_log key's weight must follow the
// memory its log holds. An admission drops departed entries from the front
// of the log by reslicing (log[k:]), which leaves them in the array: the
// array is kept whole while cap(log), what weight counts, shrinks by k. A
// client that fills a log (its quota, once), lets all but one entry depart,
// then spends the array's spare room in a few requests leaves a log whose
// weight is a few units while it holds the whole array. Keys built so in
// one shard must not hold more than the shard's share of the bound allows
// (1 KiB a unit, as TestMaxKeysBoundsSlidingLogMemory allows).
func TestMaxKeysBoundsATrimmedLog(t *testing.T) {
	s := New()
	defer s.Close()
	const share = 1024 // units a shard keeps
	s.SetMaxKeys(memShards * share)
	const limit, keys = 4000, 100
	period := limits.PeriodUS(time.Hour)
	ctx := context.Background()
	var r [1]limits.Result
	t0 := time.Now().UnixMicro()
	// keys of one shard: the bound is kept per shard
	var names []string
	for i := 0; len(names) < keys; i++ {
		k := "rg:{per-route:/r" + strconv.Itoa(i) + "}:sl2"
		if s.shardOf(k) == 0 {
			names = append(names, k)
		}
	}
	sh := &s.shards[0]
	stored := func(k string) []logEntry { return sh.m[k].log }
	before := liveHeap()
	for _, k := range names {
		c := limits.Check{Key: k, Algorithm: limits.SlidingLog, Limit: limit, PeriodUS: period, Burst: limit, Cost: 1}
		admit := func(at int64) {
			b := limits.Batch{Checks: []limits.Check{c}, NowUS: at}
			ok, err := s.Decide(ctx, &b, r[:])
			if err != nil || !ok {
				t.Fatalf("%s at %d: admitted %v, %v", k, at-t0, ok, err)
			}
		}
		// 1. Fill the log, and stop where the array's spare room is
		// just enough for the admissions that trim its departed entries.
		at := t0
		for {
			admit(at)
			at++
			l := stored(k)
			n := len(l) + 1 // with the live entry below
			if n >= limit/2 && cap(l)-n >= 0 && cap(l)-n <= (n+slTrim-1)/slTrim+1 {
				break
			}
			if n >= limit {
				t.Fatalf("%s: no stopping point", k)
			}
		}
		// 2. One entry that stays in the window.
		admit(t0 + period/2)
		// 3. After the others departed, admissions trim them 128 at a
		// time and append in place until the array is full.
		at = t0 + period + int64(limit) + 10
		for l := stored(k); cap(l) > len(l); l = stored(k) {
			admit(at)
			at++
		}
	}
	grew := int64(liveHeap()) - int64(before)
	var held int
	for _, st := range sh.m {
		held += len(st.log)
	}
	t.Logf("shard 0: %d keys, %d units (share %d), %d entries in the logs; heap grew %.2f MiB (%.0f B a unit of the share)",
		len(sh.m), sh.units, share, held, float64(grew)/(1<<20), float64(grew)/share)
	runtime.KeepAlive(s)
	if grew > share<<10 {
		t.Fatalf("heap grew %d B for a shard that weighs %d (share %d): the trimmed logs' arrays are not counted",
			grew, sh.units, share)
	}
}

// liveHeap is the heap in use after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
