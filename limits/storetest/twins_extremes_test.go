package storetest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"
)

// extremeTwin decides c at now on Redis and in memory and compares the
// answers, the records (number by number) and the TTL Redis set with the
// memory store's expiry. Redis never expires the key on its own clock:
// the TTL is checked, then removed; the key is deleted where memory's
// record has expired on the test's clock.
type extremeTwin struct {
	t    *testing.T
	mem  *memstore.Store
	rs   *redisstore.Store
	key  string
	hist []string
}

func (w *extremeTwin) memExpiry(now int64) int64 {
	if !w.mem.HoldsAt(w.key, now) {
		return 0
	}
	lo, hi := now, now+1
	for w.mem.HoldsAt(w.key, hi) {
		hi = now + (hi-now)*2
	}
	for hi-lo > 1 { // HoldsAt(lo), !HoldsAt(hi)
		m := lo + (hi-lo)/2
		if w.mem.HoldsAt(w.key, m) {
			lo = m
		} else {
			hi = m
		}
	}
	return hi
}

func (w *extremeTwin) step(c limits.Check, now int64) limits.Result {
	t, ctx := w.t, context.Background()
	t.Helper()
	cl := w.rs.Client()
	info, _ := limits.AlgorithmOfKey(w.key)
	// Redis gets memory's record before every step, without a TTL
	if !w.mem.HoldsAt(w.key, now) {
		cl.Del(ctx, w.key)
	} else {
		mv, err := w.mem.Raw(ctx, w.key)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 8*len(info.Record))
		for j, name := range info.Record {
			m, _ := strconv.ParseInt(mv.Record[name], 10, 64)
			binary.LittleEndian.PutUint64(buf[8*j:], math.Float64bits(float64(m)))
		}
		cl.Set(ctx, w.key, string(buf), 0)
	}
	onRedis := DecideOne(t, w.rs, c, now)
	pipe := cl.Pipeline()
	pt := pipe.PTTL(ctx, w.key)
	gt := pipe.Get(ctx, w.key)
	pipe.Exec(ctx)
	pttl, raw := pt.Val(), gt.Val()
	inMemory := DecideOne(t, w.mem, c, now)
	w.hist = append(w.hist, fmt.Sprintf("L=%d P=%d B=%d t=%d c=%d: %+v", c.Limit, c.PeriodUS, c.Burst, now, c.Cost, inMemory))
	fail := func(f string, a ...any) {
		t.Helper()
		t.Fatalf("%s step %d: %s\nhistory:\n%s", w.key, len(w.hist)-1, fmt.Sprintf(f, a...), joinLines(w.hist))
	}
	if onRedis != inMemory {
		fail("redis %+v, memory %+v", onRedis, inMemory)
	}
	exp := w.memExpiry(now)
	if exp != 0 && raw == "" && exp-now < 50_000 {
		return inMemory // expired on Redis's clock before we read it
	}
	if (exp == 0) != (raw == "") {
		fail("memory holds the key: %v, redis: %q", exp != 0, raw)
	}
	if exp == 0 {
		return inMemory
	}
	// the record, number by number
	mv, err := w.mem.Raw(ctx, w.key)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != 8*len(info.Record) {
		fail("redis record of %d bytes", len(raw))
	}
	for j, name := range info.Record {
		f := math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[8*j:])))
		m, _ := strconv.ParseInt(mv.Record[name], 10, 64)
		if f != float64(m) {
			fail("record %s: redis %v, memory %d", name, f, m)
		}
		if f != math.Trunc(f) || math.Abs(f) >= 1<<53 {
			fail("record %s = %v not an exact integer", name, f)
		}
	}
	switch {
	case pttl == -1:
		// kept (KEEPTTL after our PERSIST): memory's expiry stands as it was
	case pttl >= 0:
		want := max((exp-now+999)/1000, 2)
		if got := pttl.Milliseconds(); got > want || got < want-50 {
			fail("redis TTL %d ms, memory's expiry %d µs away (want %d ms)", got, exp-now, want)
		}
	}
	return inMemory
}

// TestGCRATokenBucketTwinsAtExtremes: random timelines across rule
// changes with extreme numbers; the memory store and Redis give the same
// answers, records and TTLs at every step.
func TestGCRATokenBucketTwinsAtExtremes(t *testing.T) {
	seed := Seed(t)
	rng := rand.New(rand.NewSource(seed))
	mem, rs := gtStores(t)
	seqs := 25 // each run draws anew (the seed is logged on failure)
	for seq := 0; seq < seqs; seq++ {
		n := 1 + rng.Intn(3)
		var shapes []gtCfg
		for len(shapes) < n {
			shapes = append(shapes, flShape(rng, true))
		}
		for _, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
			w := &extremeTwin{t: t, mem: mem, rs: rs, key: fmt.Sprintf("rg:{ext:%d:%d}:%s", seed, seq, algo.Suffix())}
			r2 := rand.New(rand.NewSource(seed + int64(seq)))
			now := time.Now().UnixMicro() + 3600_000_000
			for i := 0; i < 40; i++ {
				s := shapes[r2.Intn(n)]
				if i > 0 {
					switch p := r2.Intn(10); {
					case p < 4:
					case p < 8:
						now += r2.Int63n(max(1, s.P/s.L*2+2))
					default:
						now += r2.Int63n(1 + min(s.P, 1e10))
					}
				}
				var cost int64
				switch p := r2.Intn(12); {
				case p < 5:
					cost = 1
				case p < 6:
					cost = 0
				case p < 7:
					cost = s.B + 1
				default:
					cost = 1 + r2.Int63n(s.B)
				}
				c := s.check(algo, w.key)
				c.Cost = cost
				w.step(c, now)
			}
		}
	}
}
