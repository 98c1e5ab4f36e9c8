package memstore

import (
	"context"
	"fmt"
	"math/big"
	"math/rand"
	"strings"
	"testing"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits/storetest"
	"github.com/rategate/rategate/lua"
)

// The exact product k*P/L behind both algorithms, in Go and in both scripts,
// against math/big over the whole validated range (k, L < 2^30, P <= 2^45).
func TestIntervalArithmetic(t *testing.T) {
	seed := storetest.Seed(t)
	rng := rand.New(rand.NewSource(seed))
	type tc struct{ k, p, l int64 }
	var cases []tc
	// k*P/L <= 2^45 is what B*P/L <= 2^45 with k <= B allows.
	inRange := func(c tc) bool {
		x := new(big.Int).Mul(big.NewInt(c.k), big.NewInt(c.p))
		return x.Div(x, big.NewInt(c.l)).Cmp(big.NewInt(1<<45)) <= 0
	}
	for _, l := range []int64{1, 2, 3, 999_999_937, 1e9, 1<<30 - 1} {
		for _, p := range []int64{1, 999, 1e6, 34_560_000_000_000, 1 << 45} {
			for _, k := range []int64{0, 1, 32767, 32768, 1e9, 1<<30 - 1} {
				if c := (tc{k, p, l}); inRange(c) {
					cases = append(cases, c)
				}
			}
		}
	}
	for len(cases) < 2000 {
		l := 1 + rng.Int63n(1<<30-1)
		p := 1 + rng.Int63n(1<<45)
		kmax := min(1<<30-1, new(big.Int).Div(new(big.Int).Mul(big.NewInt(1<<45), big.NewInt(l)), big.NewInt(p)).Int64())
		cases = append(cases, tc{rng.Int63n(kmax + 1), p, l})
	}
	want := func(c tc) (int64, int64) {
		x := new(big.Int).Mul(big.NewInt(c.k), big.NewInt(c.p))
		q, r := new(big.Int).QuoRem(x, big.NewInt(c.l), new(big.Int))
		return q.Int64(), r.Int64()
	}
	for _, c := range cases {
		wi, wf := want(c)
		if gi, gf := newInterval(c.l, c.p).times(c.k); gi != wi || gf != wf {
			t.Fatalf("Go: %d*%d/%d = %d + %d/%d, want %d + %d/%d", c.k, c.p, c.l, gi, gf, c.l, wi, wf, c.l)
		}
	}
	client := testredis.Start(t).Client(t)
	for file, fn := range map[string]string{"gcra.lua": "gc_times", "token_bucket.lua": "tb_times"} {
		src, err := lua.Source(file)
		if err != nil {
			t.Fatal(err)
		}
		body := src[:strings.Index(src, "-- @standalone")]
		script := body + fmt.Sprintf(`
local out = {}
for i = 1, #ARGV, 3 do
  local k, p, l = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local q = math.floor(p / l)
  local w, f = %s(k, q, p - q * l, l)
  out[#out + 1] = w
  out[#out + 1] = f
end
return out`, fn)
		for lo := 0; lo < len(cases); lo += 500 {
			batch := cases[lo:min(lo+500, len(cases))]
			argv := make([]any, 0, 3*len(batch))
			for _, c := range batch {
				argv = append(argv, c.k, c.p, c.l)
			}
			v, err := client.Eval(context.Background(), script, []string{"unused"}, argv...).Int64Slice()
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			for i, c := range batch {
				wi, wf := want(c)
				if v[2*i] != wi || v[2*i+1] != wf {
					t.Fatalf("%s %s: %d*%d/%d = %d + %d/%d, want %d + %d/%d", file, fn, c.k, c.p, c.l, v[2*i], v[2*i+1], c.l, wi, wf, c.l)
				}
			}
		}
	}
}
