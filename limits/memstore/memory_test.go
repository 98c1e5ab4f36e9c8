package memstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
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
