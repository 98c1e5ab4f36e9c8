package lua_test

// Measurements inside Redis: what one decision costs the server, read from
// INFO commandstats (usec_per_call) and SLOWLOG (each call's duration), not
// from the client's wall clock. They are benchmarks so that `go test` does
// not run them; run them with
//
//	go test -run '^$' -bench 'BenchmarkDecide' -benchtime 20000x ./lua/
//	go test -run '^$' -bench 'BenchmarkSlidingLogFullKey' -benchtime 200x ./lua/
//
// The same file runs unchanged on older commits (it only needs lua.Decide
// and limits.Algorithm.Code), which is how docs/algorithms.md's "before" columns were
// measured. Each benchmark starts its own redis-server on loopback.

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/lua"
)

// measureAlgos are the algorithms in code order, with their key suffixes.
var measureAlgos = []struct{ name, suffix string }{
	{"fixed_window", "fw"}, {"sliding_log", "sl"}, {"sliding_window", "sw"}, {"gcra", "gc"}, {"token_bucket", "tb"},
}

// commandStats resets Redis's counters, runs fn, and returns the calls and
// the mean µs per call Redis measured for cmd ("evalsha", "fcall").
func commandStats(tb testing.TB, client *redis.Client, cmd string, fn func()) (calls int64, usecPerCall float64) {
	tb.Helper()
	ctx := context.Background()
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		tb.Fatal(err)
	}
	fn()
	info, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^cmdstat_` + cmd + `:calls=(\d+),usec=\d+,usec_per_call=([0-9.]+)`)
	m := re.FindStringSubmatch(info)
	if m == nil {
		tb.Fatalf("no cmdstat_%s in INFO commandstats:\n%s", cmd, info)
	}
	calls, _ = strconv.ParseInt(m[1], 10, 64)
	usecPerCall, _ = strconv.ParseFloat(m[2], 64)
	return calls, usecPerCall
}

// runPipelined sends n commands built by mk, 16 per pipeline, and fails on
// any error reply.
func runPipelined(tb testing.TB, client *redis.Client, n int, mk func(p redis.Pipeliner, i int) *redis.Cmd) {
	tb.Helper()
	ctx := context.Background()
	for lo := 0; lo < n; lo += 16 {
		p := client.Pipeline()
		var cmds []*redis.Cmd
		for i := lo; i < min(lo+16, n); i++ {
			cmds = append(cmds, mk(p, i))
		}
		if _, err := p.Exec(ctx); err != nil {
			tb.Fatal(err)
		}
		for _, c := range cmds {
			if err := c.Err(); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// decideArgs is decide.lua's ARGV for checks of one rule shape.
func decideArgs(now int64, checks ...[5]int64) []any {
	args := []any{now}
	for _, c := range checks {
		args = append(args, c[0], c[1], c[2], c[3], c[4], 0)
	}
	return args
}

// BenchmarkDecide measures the assembled decide script per algorithm: one
// check per call (limit 100 per minute, cost 1) against a fixed set of 1000
// keys, round robin, on the Redis clock; then calls of several checks whose
// keys share one hash tag: two_rules (fixed_window, sliding_window),
// three_rules (those and gcra 10 per second, burst 20), and gcra_denying
// (that gcra rule alone, which denies most calls once its burst is spent).
func BenchmarkDecide(b *testing.B) {
	src, err := lua.Decide()
	if err != nil {
		b.Fatal(err)
	}
	for _, a := range measureAlgos {
		b.Run(a.name, func(b *testing.B) {
			client := testredis.Start(b).Client(b)
			sha := client.ScriptLoad(context.Background(), src).Val()
			code := int64(limits.Algorithm(a.name).Code())
			args := decideArgs(0, [5]int64{code, 100, 60_000_000, 100, 1})
			b.ResetTimer()
			calls, usec := commandStats(b, client, "evalsha", func() {
				runPipelined(b, client, b.N, func(p redis.Pipeliner, i int) *redis.Cmd {
					return p.EvalSha(context.Background(), sha, []string{fmt.Sprintf("rg:{bench:%d}:%s", i%1000, a.suffix)}, args...)
				})
			})
			b.ReportMetric(usec, "redis-µs/call")
			b.ReportMetric(float64(calls), "calls")
		})
	}
	b.Run("two_rules", func(b *testing.B) {
		client := testredis.Start(b).Client(b)
		sha := client.ScriptLoad(context.Background(), src).Val()
		args := decideArgs(0,
			[5]int64{int64(limits.FixedWindow.Code()), 100, 60_000_000, 100, 1},
			[5]int64{int64(limits.Algorithm("sliding_window").Code()), 1000, 3_600_000_000, 1000, 1})
		b.ResetTimer()
		_, usec := commandStats(b, client, "evalsha", func() {
			runPipelined(b, client, b.N, func(p redis.Pipeliner, i int) *redis.Cmd {
				tag := fmt.Sprintf("rg:{bench:%d}:", i%1000)
				return p.EvalSha(context.Background(), sha, []string{tag + "fw", tag + "sw"}, args...)
			})
		})
		b.ReportMetric(usec, "redis-µs/call")
	})
	b.Run("gcra_denying", func(b *testing.B) {
		client := testredis.Start(b).Client(b)
		sha := client.ScriptLoad(context.Background(), src).Val()
		args := decideArgs(0, [5]int64{int64(limits.Algorithm("gcra").Code()), 10, 1_000_000, 20, 1})
		b.ResetTimer()
		_, usec := commandStats(b, client, "evalsha", func() {
			runPipelined(b, client, b.N, func(p redis.Pipeliner, i int) *redis.Cmd {
				return p.EvalSha(context.Background(), sha, []string{fmt.Sprintf("rg:{bench:%d}:gc", i%1000)}, args...)
			})
		})
		b.ReportMetric(usec, "redis-µs/call")
	})
	b.Run("three_rules", func(b *testing.B) {
		client := testredis.Start(b).Client(b)
		sha := client.ScriptLoad(context.Background(), src).Val()
		args := decideArgs(0,
			[5]int64{int64(limits.FixedWindow.Code()), 100, 60_000_000, 100, 1},
			[5]int64{int64(limits.Algorithm("sliding_window").Code()), 1000, 3_600_000_000, 1000, 1},
			[5]int64{int64(limits.Algorithm("gcra").Code()), 10, 1_000_000, 20, 1})
		b.ResetTimer()
		calls, usec := commandStats(b, client, "evalsha", func() {
			runPipelined(b, client, b.N, func(p redis.Pipeliner, i int) *redis.Cmd {
				tag := fmt.Sprintf("rg:{bench:%d}:", i%1000)
				return p.EvalSha(context.Background(), sha, []string{tag + "fw", tag + "sw", tag + "gc"}, args...)
			})
		})
		b.ReportMetric(usec, "redis-µs/call")
		b.ReportMetric(float64(calls), "calls")
	})
}

// oldLogMember matches the sliding_log members of commits up to c712060
// ("<time>:<seq>:<cost>"); the fill below then writes that layout directly,
// since filling an O(n)-per-decision log through the script takes hours.
var oldLogMember = regexp.MustCompile(`^\d+:\d+:\d+$`)

// fillSlidingLog fills key with n cost-1 entries, one every step µs from
// start, the way the script under test lays them out.
func fillSlidingLog(b *testing.B, client *redis.Client, sha, key string, n, start, period, step int64) {
	b.Helper()
	ctx := context.Background()
	code := int64(limits.Algorithm("sliding_log").Code())
	probe := "rg:{probe}:sl2"
	if err := client.EvalSha(ctx, sha, []string{probe}, decideArgs(start, [5]int64{code, n, period, n, 1})...).Err(); err != nil {
		b.Fatal(err)
	}
	typ := client.Type(ctx, probe).Val()
	old := false
	if typ == "zset" {
		m := client.ZRange(ctx, probe, 0, 0).Val()
		old = len(m) == 1 && oldLogMember.MatchString(m[0])
	}
	client.Del(ctx, probe)
	if old {
		for lo := int64(0); lo < n; lo += 1000 {
			var zs []redis.Z
			for i := lo; i < min(lo+1000, n); i++ {
				t := start + i*step
				zs = append(zs, redis.Z{Score: float64(t), Member: fmt.Sprintf("%d:%d:1", t, i)})
			}
			if err := client.ZAdd(ctx, key, zs...).Err(); err != nil {
				b.Fatal(err)
			}
		}
		client.PExpire(ctx, key, time.Duration(period)*time.Microsecond)
		return
	}
	runPipelined(b, client, int(n), func(p redis.Pipeliner, i int) *redis.Cmd {
		return p.EvalSha(ctx, sha, []string{key}, decideArgs(start+int64(i)*step, [5]int64{code, n, period, n, 1})...)
	})
}

// slowlogStats returns the mean and the largest duration (µs) of the
// commands SLOWLOG recorded, all of them (slowlog-log-slower-than 0).
func slowlogStats(b *testing.B, client *redis.Client) (mean, maxUS float64, n int) {
	b.Helper()
	logs, err := client.SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	var ds []float64
	for _, l := range logs {
		if len(l.Args) == 0 || !strings.EqualFold(l.Args[0], "evalsha") {
			continue
		}
		d := float64(l.Duration / time.Microsecond)
		ds = append(ds, d)
		sum += d
	}
	if len(ds) == 0 {
		b.Fatal("SLOWLOG recorded no EVALSHA")
	}
	sort.Float64s(ds)
	return sum / float64(len(ds)), ds[len(ds)-1], len(ds)
}

// BenchmarkSlidingLogFullKey measures one sliding_log decision on a key
// that holds its whole limit (cost-1 entries spread evenly over one hour):
// "denied" asks within the hour (the log is full), "steady" asks just as
// the oldest entry leaves (one entry trimmed, one admitted, each call). It
// reports Redis's own time per call and MEMORY USAGE of the full key.
func BenchmarkSlidingLogFullKey(b *testing.B) {
	src, err := lua.Decide()
	if err != nil {
		b.Fatal(err)
	}
	const period = int64(3_600_000_000)
	code := int64(limits.Algorithm("sliding_log").Code())
	for _, n := range []int64{100, 10_000, 100_000} {
		for _, mode := range []string{"denied", "steady"} {
			b.Run(fmt.Sprintf("L=%d/%s", n, mode), func(b *testing.B) {
				srv := testredis.Start(b, "slowlog-log-slower-than 0", "slowlog-max-len 100000")
				client := srv.Client(b)
				ctx := context.Background()
				sha := client.ScriptLoad(ctx, src).Val()
				key := "rg:{api:203.0.113.7}:sl2"
				start := time.Now().UnixMicro() + period // ahead of Redis's clock: nothing expires
				step := period / n
				fillSlidingLog(b, client, sha, key, n, start, period, step)
				bytes := client.MemoryUsage(ctx, key, 0).Val()
				client.SlowLogReset(ctx)
				b.ResetTimer()
				calls, usec := commandStats(b, client, "evalsha", func() {
					for i := 0; i < b.N; i++ {
						now := start + period - 1 // every entry still in the window
						if mode == "steady" {
							now = start + period + int64(i)*step // entry i leaves now
						}
						r, err := client.EvalSha(ctx, sha, []string{key}, decideArgs(now, [5]int64{code, n, period, n, 1})...).Int64Slice()
						if err != nil {
							b.Fatal(err)
						}
						if want := int64(0); mode == "steady" {
							want = 1
							if r[0] != want {
								b.Fatalf("steady call %d: %v, want admitted", i, r)
							}
						} else if r[0] != want {
							b.Fatalf("denied call %d: %v, want denied", i, r)
						}
					}
				})
				b.StopTimer()
				mean, maxUS, logged := slowlogStats(b, client)
				b.ReportMetric(usec, "redis-µs/call")
				b.ReportMetric(maxUS, "max-µs")
				b.ReportMetric(float64(bytes), "key-bytes")
				b.Logf("L=%d %s: %d calls, %.1f µs/call (commandstats), SLOWLOG mean %.1f max %.0f µs over %d; MEMORY USAGE %d B (%.1f B/entry)",
					n, mode, calls, usec, mean, maxUS, logged, bytes, float64(bytes)/float64(n))
			})
		}
	}
}

// BenchmarkSlidingLogExpireAll measures the one decision that costs more
// than O(log n): an admission just after a whole full key's entries leave at
// once (all admitted in one µs), which removes them. Each iteration fills
// the key again (not measured) and reports the decision's SLOWLOG duration.
func BenchmarkSlidingLogExpireAll(b *testing.B) {
	src, err := lua.Decide()
	if err != nil {
		b.Fatal(err)
	}
	const period = int64(3_600_000_000)
	code := int64(limits.Algorithm("sliding_log").Code())
	for _, n := range []int64{100, 10_000, 100_000} {
		b.Run(fmt.Sprintf("L=%d", n), func(b *testing.B) {
			srv := testredis.Start(b, "slowlog-log-slower-than 0", "slowlog-max-len 100")
			client := srv.Client(b)
			ctx := context.Background()
			sha := client.ScriptLoad(ctx, src).Val()
			key := "rg:{api:203.0.113.7}:sl2"
			var worst, sum float64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				client.Del(ctx, key)
				start := time.Now().UnixMicro() + period
				fillSlidingLog(b, client, sha, key, n, start, period, 0)
				client.SlowLogReset(ctx)
				b.StartTimer()
				r, err := client.EvalSha(ctx, sha, []string{key}, decideArgs(start+period, [5]int64{code, n, period, n, 1})...).Int64Slice()
				if err != nil || r[0] != 1 {
					b.Fatalf("decision after the log left: %v %v, want admitted", r, err)
				}
				b.StopTimer()
				_, maxUS, _ := slowlogStats(b, client)
				worst = max(worst, maxUS)
				sum += maxUS
				if left := client.ZCard(ctx, key).Val(); left != 1 {
					b.Fatalf("%d entries left, want 1", left)
				}
			}
			b.ReportMetric(sum/float64(b.N), "redis-µs/call")
			b.ReportMetric(worst, "max-µs")
		})
	}
}
