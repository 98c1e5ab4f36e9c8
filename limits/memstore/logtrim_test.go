package memstore

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

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
		k := "rg:{per-route:/r" + strconv.Itoa(i) + "}:sl"
		if s.shardOf(k) == 0 {
			names = append(names, k)
		}
	}
	sh := &s.shards[0]
	stored := func(k string) []logEntry { return sh.m[k].log }
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
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
	grew := int64(heap()) - int64(before)
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
