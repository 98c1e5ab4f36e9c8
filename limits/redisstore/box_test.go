package redisstore

import "testing"

// TestBoxInt: boxed values read back equal, a value seen before costs no
// allocation, and distinct values cannot grow the table past its bound
// (nor evict what it holds).
func TestBoxInt(t *testing.T) {
	keepBoxes(t)
	boxes.Store(&map[int64]any{}) // other tests may have filled it
	for _, v := range []int64{0, 1, 255, 256, 60_000_000, -1, 1 << 40} {
		if got := boxInt(v).(int64); got != v {
			t.Fatalf("boxInt(%d) = %d", v, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = boxInt(60_000_000) }); n != 0 {
		t.Fatalf("a known value allocates %v times", n)
	}
	for v := int64(1000); v < 1000+3*maxBoxes; v++ {
		_ = boxInt(v)
	}
	if n := len(*boxes.Load()); n > maxBoxes {
		t.Fatalf("table holds %d values, bound %d", n, maxBoxes)
	}
	if _, ok := (*boxes.Load())[60_000_000]; !ok {
		t.Fatal("a full table dropped a value it held")
	}
	if got := boxInt(1 << 50).(int64); got != 1<<50 {
		t.Fatalf("boxInt on a full table = %d", got)
	}
}

// TestPoolSize: the pool always has room for every pipeline and then some.
func TestPoolSize(t *testing.T) {
	if got := poolSize(0, CoalesceOptions{Pipelines: 200}); got != 210 {
		t.Fatalf("200 pipelines: pool %d, want 210", got)
	}
	if got := poolSize(50, CoalesceOptions{}); got != 50 {
		t.Fatalf("default pipelines, pool 50: %d", got)
	}
	if got := poolSize(3, CoalesceOptions{Disabled: true}); got != 3 {
		t.Fatalf("coalescing off: pool %d, want the URL's 3", got)
	}
}

// keepBoxes puts the boxed-value table back as it was when the test ends:
// a test that boxes many values (filling it) is its own business, and the
// package's other tests (TestBoxInt, TestManyArgsAllocs) need room for
// theirs.
func keepBoxes(t *testing.T) {
	before := boxes.Load()
	t.Cleanup(func() {
		boxesMu.Lock()
		defer boxesMu.Unlock()
		boxes.Store(before)
	})
}
