package storetest

import (
	"fmt"
	"math/big"
	"math/rand"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// Several sets of numbers on one key (a fleet mid-reload), at random.

var flPeriods = []int64{1000, 3000, 1_000_000, 7_000_123, 60_000_000, 3_600_000_000, 86_400_000_000}

const flDay = int64(86_400_000_000)

func flShape(rng *rand.Rand, extreme bool) gtCfg {
	for {
		var c gtCfg
		c.P = flPeriods[rng.Intn(len(flPeriods))]
		if extreme && rng.Intn(4) == 0 {
			c.P = []int64{1000, 400 * flDay, 1}[rng.Intn(3)]
			if c.P == 1 {
				c.P = 1 + rng.Int63n(400*flDay)
			}
		}
		switch rng.Intn(4) {
		case 0:
			c.L = 1 + rng.Int63n(10)
		case 1:
			c.L = 1 + rng.Int63n(1000)
		case 2:
			c.L = 1 + rng.Int63n(1_000_000)
		default:
			if extreme {
				c.L = 1e9 - rng.Int63n(1000)
			} else {
				c.L = 1 + rng.Int63n(100)
			}
		}
		switch rng.Intn(4) {
		case 0:
			c.B = 1
		case 1:
			c.B = 1 + rng.Int63n(20)
		case 2:
			c.B = c.L
		default:
			c.B = 1 + rng.Int63n(1e9)
		}
		// validation: P <= 400 days, B*P/L <= 400 days
		x := new(big.Int).Mul(big.NewInt(c.B), big.NewInt(c.P))
		x.Div(x, big.NewInt(c.L))
		if c.P <= 400*flDay && x.Cmp(big.NewInt(400*flDay)) <= 0 {
			return c
		}
	}
}

// flFar reports whether some burst of one shape, at the interval of
// another, reaches 2^44 µs: near the 2^45 µs bound a conversion reads a
// backlog at and leaves it unwritten (held), where gcra and token_bucket
// round differently; the fleet bound holds there too.
func flFar(shapes []gtCfg) bool {
	for _, a := range shapes {
		for _, b := range shapes {
			x := new(big.Int).Mul(big.NewInt(a.B), big.NewInt(b.P))
			x.Div(x, big.NewInt(b.L))
			if x.Cmp(big.NewInt(1<<44)) >= 0 {
				return true
			}
		}
	}
	return false
}

// TestBucketFleetBound: 2 or 3 sets of numbers on one key, requests picking
// one at random; units admitted from a fresh key never exceed the largest
// burst plus the fastest rate times the time elapsed.
func TestBucketFleetBound(t *testing.T) {
	seed := Seed(t)
	rng := rand.New(rand.NewSource(seed))
	mem := memstore.NewSweeping(time.Hour)
	defer mem.Close()
	start := time.Now().UnixMicro() + 3600_000_000
	seqs := 60 // each run draws anew (the seed is logged on failure)
	for seq := 0; seq < seqs; seq++ {
		n := 2 + rng.Intn(2)
		var shapes []gtCfg
		for len(shapes) < n {
			shapes = append(shapes, flShape(rng, true))
		}
		maxB := int64(0)
		fast := shapes[0]
		for _, s := range shapes {
			maxB = max(maxB, s.B)
			if big.NewRat(s.L, s.P).Cmp(big.NewRat(fast.L, fast.P)) > 0 {
				fast = s
			}
		}
		for _, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
			key := fmt.Sprintf("rg:{flf:%d:%d}:%s", seed, seq, algo.Suffix())
			r2 := rand.New(rand.NewSource(seed + int64(seq)))
			at := int64(0)
			units := int64(0)
			var ats, got []int64
			var hist []string
			for i := 0; i < 80; i++ {
				s := shapes[r2.Intn(n)]
				if i > 0 {
					switch p := r2.Intn(10); {
					case p < 4:
					case p < 7:
						at += r2.Int63n(max(1, s.P/s.L*2+2))
					case p < 9:
						at += r2.Int63n(1 + fast.P/fast.L*3)
					default:
						at += r2.Int63n(1 + min(s.P, 1e9))
					}
				}
				var cost int64
				switch p := r2.Intn(10); {
				case p < 5:
					cost = 1
				case p < 9:
					cost = 1 + r2.Int63n(s.B)
				default:
					cost = s.B
				}
				c := s.check(algo, key)
				c.Cost = cost
				r := DecideOne(t, mem, c, start+at)
				hist = append(hist, fmt.Sprintf("%v +%d c=%d -> %+v", s, at, cost, r))
				if r.Allowed {
					units += cost
				}
				ats = append(ats, at)
				got = append(got, 0)
				if r.Allowed {
					got[len(got)-1] = cost
				}
				sum := int64(0)
				for k := len(got) - 1; k >= 0; k-- {
					sum += got[k]
					b := new(big.Rat).Add(big.NewRat(maxB, 1), new(big.Rat).Mul(big.NewRat(at-ats[k], 1), big.NewRat(fast.L, fast.P)))
					if big.NewRat(sum, 1).Cmp(b) > 0 {
						t.Fatalf("seed %d seq %d %s: %d units admitted from step %d to %d (%dµs), bound %s\nhistory:\n%s", seed, seq, algo, sum, k, len(got)-1, at-ats[k], b.FloatString(3), joinLines(hist))
					}
				}
				// bound: maxB + at*L/P of the fastest
				b := new(big.Rat).Add(big.NewRat(maxB, 1), new(big.Rat).Mul(big.NewRat(at, 1), big.NewRat(fast.L, fast.P)))
				if big.NewRat(units, 1).Cmp(b) > 0 {
					t.Fatalf("seed %d seq %d %s: %d units admitted by +%dµs, bound %s\nhistory:\n%s", seed, seq, algo, units, at, b.FloatString(3), joinLines(hist))
				}
			}
		}
	}
}

// TestGCRATokenBucketEquivalentAcrossChanges: whole intervals (T a whole
// number of µs) in every set of numbers: gcra and token_bucket answer
// alike, step by step, across random changes and alternations (a bucket's
// earned part of a token is scaled as gcra scales its part-unit; they once
// drifted a µs apart per conversion:
// TestGCRATokenBucketEquivalentAcrossRateChange).
func TestGCRATokenBucketEquivalentAcrossChanges(t *testing.T) {
	seed := Seed(t)
	rng := rand.New(rand.NewSource(seed))
	mem := memstore.NewSweeping(time.Hour)
	defer mem.Close()
	start := time.Now().UnixMicro() + 3600_000_000
	seqs := 500
	for seq := 0; seq < seqs; seq++ {
		n := 2 + rng.Intn(2)
		var shapes []gtCfg
		for len(shapes) < n {
			s := flShape(rng, true)
			if s.P%s.L != 0 {
				continue
			}
			shapes = append(shapes, s)
		}
		if flFar(shapes) {
			continue
		}
		kg := fmt.Sprintf("rg:{fle:%d:%d}:gc", seed, seq)
		kt := fmt.Sprintf("rg:{fle:%d:%d}:tb", seed, seq)
		at := int64(0)
		var hist []string
		for i := 0; i < 80; i++ {
			s := shapes[rng.Intn(n)]
			if rng.Intn(3) == 0 {
				s = shapes[0]
			}
			if i > 0 {
				switch p := rng.Intn(10); {
				case p < 4:
				case p < 8:
					at += rng.Int63n(max(1, s.P/s.L*2+2))
				default:
					at += rng.Int63n(1 + min(s.P, 1e9))
				}
			}
			var cost int64
			switch p := rng.Intn(10); {
			case p < 5:
				cost = 1
			case p < 6:
				cost = 0
			default:
				cost = 1 + rng.Int63n(s.B)
			}
			c := s.check(limits.GCRA, kg)
			c.Cost = cost
			a := DecideOne(t, mem, c, start+at)
			c = s.check(limits.TokenBucket, kt)
			c.Cost = cost
			b := DecideOne(t, mem, c, start+at)
			hist = append(hist, fmt.Sprintf("%v +%d c=%d -> gcra %+v tb %+v", s, at, cost, a, b))
			near := func(x, y int64) bool { return x-y <= 100 && y-x <= 100 }
			if !near(a.ResetUS, b.ResetUS) || !near(a.RetryUS, b.RetryUS) {
				t.Fatalf("seed %d seq %d step %d: gcra and token_bucket differ\nhistory:\n%s", seed, seq, i, joinLines(hist))
			}
		}
	}
}

// TestGCRATokenBucketEquivalentAcrossRateChange: two whole intervals (10.8e9 µs, then
// 21.6e9 µs), 11 units used under 8 a day (burst 15), a look under 4 a day
// (burst 17) 34,540,484,654 µs later. Exactly: 8 used with 2,140,484,654
// µs of the next earned at the old rate, 4,280,969,308 µs at the new one,
// so the bucket is full in 8*21.6e9 - 4,280,969,308 = 168,519,030,692 µs,
// which gcra reports. token_bucket scales rho in float64 (2140484654 *
// 2.16e10 / 1.08e10, the product past 2^53) to just under the integer and
// floors it: 168,519,030,693.
func TestGCRATokenBucketEquivalentAcrossRateChange(t *testing.T) {
	mem := memstore.NewSweeping(time.Hour)
	defer mem.Close()
	start := time.Now().UnixMicro() + 3600_000_000
	a := gtCfg{L: 8, P: 86_400_000_000, B: 15}
	b := gtCfg{L: 4, P: 86_400_000_000, B: 17}
	var got [2]limits.Result
	for i, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
		key := "rg:{fleq}:" + algo.Suffix()
		c := a.check(algo, key)
		c.Cost = 11
		if r := DecideOne(t, mem, c, start); !r.Allowed {
			t.Fatalf("%s: 11 of 15 denied: %+v", algo, r)
		}
		c = b.check(algo, key)
		got[i] = DecideOne(t, mem, c, start+34_540_484_654)
	}
	if got[0].ResetUS != 168_519_030_692 || got[1] != got[0] {
		t.Fatalf("gcra %+v, token_bucket %+v; want both reset 168519030692 µs", got[0], got[1])
	}
}
