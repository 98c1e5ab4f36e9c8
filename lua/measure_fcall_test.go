package lua

// Measurements of how the decide code is shipped to Redis, inside Redis
// (INFO commandstats usec_per_call): FCALL of the function library against
// EVALSHA of DecideScript, and DecideScript (which defines only the
// algorithms its call uses) against the two variants it was chosen over: a
// script that defines every algorithm on every call, and one script per
// algorithm. Run with
//
//	go test -run '^$' -bench 'BenchmarkShipping' -benchtime 20000x -count 3 ./lua/
//
// Same workload as BenchmarkDecide: 1000 keys round robin, limit 100 per
// minute, cost 1, on the Redis clock, 16 calls per pipeline
// (SHIPPING_KEYS and SHIPPING_BATCH change the keys and the calls).

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// eagerDecide is the decide script with every algorithm defined at the top
// level, as before the lazy blocks; soloDecide the one of a single algorithm.
func eagerDecide(tb testing.TB, only string) string {
	tb.Helper()
	algos, err := algorithmParts(Source)
	if err != nil {
		tb.Fatal(err)
	}
	drv, err := Source("decide.lua")
	if err != nil {
		tb.Fatal(err)
	}
	var keep []algorithm
	var sb strings.Builder
	for _, a := range algos {
		if only == "" || a.fn == only {
			keep = append(keep, a)
			sb.WriteString(a.body)
		}
	}
	dispatch(&sb, keep)
	sb.WriteString(drv)
	return sb.String()
}

func usecPerCall(tb testing.TB, client *redis.Client, cmd string) float64 {
	tb.Helper()
	info := client.Info(context.Background(), "commandstats").Val()
	m := regexp.MustCompile(`(?m)^cmdstat_` + cmd + `:calls=\d+,usec=\d+,usec_per_call=([0-9.]+)`).FindStringSubmatch(info)
	if m == nil {
		tb.Fatalf("no cmdstat_%s in INFO commandstats", cmd)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// BenchmarkShipping's users (distinct keys of a per-user rule) and its
// decisions per pipeline, and per DecideMany call: 1000 and 16 unless the
// environment's SHIPPING_KEYS and SHIPPING_BATCH say otherwise (make bench
// runs 10,000 users, in batches of about 10 direct and 4 behind NGINX).
var benchKeys, benchBatch = envInt("SHIPPING_KEYS", 1000), envInt("SHIPPING_BATCH", 16)

// envInt is the environment's k as an integer, d when unset or not one.
func envInt(k string, d int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return v
	}
	return d
}

func BenchmarkShipping(b *testing.B) {
	type shape struct {
		name   string
		suffix []string
		checks [][5]int64
	}
	var shapes []shape
	for i, a := range algorithmFiles {
		shapes = append(shapes, shape{a.fn, []string{"k"}, [][5]int64{{int64(i + 1), 100, 60_000_000, 100, 1}}})
	}
	shapes = append(shapes, shape{"two_rules", []string{"fw", "sw"}, [][5]int64{
		{1, 100, 60_000_000, 100, 1}, {3, 1000, 3_600_000_000, 1000, 1}}})
	shapes = append(shapes, shape{"three_rules", []string{"fw", "sw", "gc"}, [][5]int64{
		{1, 100, 60_000_000, 100, 1}, {3, 1000, 3_600_000_000, 1000, 1}, {4, 10, 1_000_000, 20, 1}}})
	// bench/policy.yaml's swm rules: a user's, a route's and the global
	// sliding_window, the last two on one key each
	shapes = append(shapes, shape{"three_sliding_windows", []string{"u", "route", "global"}, [][5]int64{
		{3, 1000, 60_000_000, 1000, 1}, {3, 100_000_000, 60_000_000, 100_000_000, 1}, {3, 1_000_000_000, 60_000_000, 1_000_000_000, 1}}})
	lib := Library()
	for _, sh := range shapes {
		args := []any{int64(0)} // the Redis clock
		for _, c := range sh.checks {
			args = append(args, c[0], c[1], c[2], c[3], c[4], 0)
		}
		keysOf := func(i int) []string {
			out := make([]string, len(sh.suffix))
			for j, s := range sh.suffix {
				if s == "route" || s == "global" {
					out[j] = "rg:{bench}:" + s
				} else {
					out[j] = fmt.Sprintf("rg:{bench:%d}:%s", i%benchKeys, s)
				}
			}
			return out
		}
		variants := []struct {
			name string
			cmd  string
			src  string
		}{{"fcall", "fcall", ""}, {"fcall_many", "fcall", ""}, {"evalsha", "evalsha", built.decide}, {"evalsha_many", "evalsha", built.decideMany},
			{"evalsha_eager", "evalsha", eagerDecide(b, "")}}
		if len(sh.checks) == 1 {
			variants = append(variants, struct{ name, cmd, src string }{"evalsha_solo", "evalsha", eagerDecide(b, sh.name)})
		}
		for _, v := range variants {
			b.Run(sh.name+"/"+v.name, func(b *testing.B) {
				client := testredis.Start(b).Client(b)
				ctx := context.Background()
				sha := ""
				if v.src != "" {
					sha = client.ScriptLoad(ctx, v.src).Val()
				} else if err := client.FunctionLoadReplace(ctx, lib.Source).Err(); err != nil {
					b.Fatal(err)
				}
				client.ConfigResetStat(ctx)
				b.ResetTimer()
				decisions, calls := 0, 0
				for lo := 0; lo < b.N; lo += benchBatch {
					p := client.Pipeline()
					var cmds []*redis.Cmd
					if v.name == "fcall_many" || v.name == "evalsha_many" {
						// the batch's decisions as one call of DecideMany
						hi := min(lo+benchBatch, b.N)
						decisions, calls = decisions+hi-lo, calls+1
						var ds []manyDecision
						for i := lo; i < hi; i++ {
							ds = append(ds, manyDecision{keysOf(i), args})
						}
						keys, many := manyArgs(func(k string) string { return k }, ds)
						if sha != "" {
							cmds = append(cmds, p.EvalSha(ctx, sha, keys, many...))
						} else {
							cmds = append(cmds, p.FCall(ctx, lib.DecideMany, keys, many...))
						}
					}
					for i := lo; i < min(lo+benchBatch, b.N) && !strings.HasSuffix(v.name, "_many"); i++ {
						if sha != "" {
							cmds = append(cmds, p.EvalSha(ctx, sha, keysOf(i), args...))
						} else {
							cmds = append(cmds, p.FCall(ctx, lib.Decide, keysOf(i), args...))
						}
					}
					if _, err := p.Exec(ctx); err != nil {
						b.Fatal(err)
					}
					for _, c := range cmds {
						if c.Err() != nil {
							b.Fatal(c.Err())
						}
					}
				}
				b.StopTimer()
				perCall := 1.0 // one decision per call, except DecideMany's
				if calls > 0 {
					perCall = float64(decisions) / float64(calls)
				}
				b.ReportMetric(usecPerCall(b, client, v.cmd)/perCall, "redis-µs/decision")
			})
		}
	}
}
