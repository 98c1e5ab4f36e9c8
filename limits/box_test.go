package limits

import "testing"

// TestBoxInt: boxed values read back equal, a value seen before costs no
// allocation, and distinct values cannot grow the cache without bound.
func TestBoxInt(t *testing.T) {
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
		t.Fatalf("cache holds %d values, bound %d", n, maxBoxes)
	}
}
