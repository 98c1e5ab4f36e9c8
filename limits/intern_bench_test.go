package limits

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// BenchmarkKeyIntern is the key look-up of every decision: 10,000 known
// keys (make bench's users) asked in random order from every CPU, and
// 100,000, which no CPU cache holds (in the service the rest of the
// request's work evicts the table between two look-ups).
func BenchmarkKeyIntern(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) { benchIntern(b, n) })
	}
}

func benchIntern(b *testing.B, n int) {
	k := newKeyIntern()
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte("rgbench:{sw-per-user:user" + strconv.Itoa(i+1) + "}:sw")
		k.get(keys[i])
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 1))
		buf := make([]byte, 0, 64)
		for pb.Next() {
			buf = append(buf[:0], keys[r.IntN(len(keys))]...)
			if s := k.get(buf); len(s) != len(buf) {
				b.Fatal(s)
			}
		}
	})
}
