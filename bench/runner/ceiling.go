package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/lua"
)

// The hot-key rule (bench/policy-hotkey.yaml's hot-global) as decide.lua's
// arguments: fixed_window, 1e9 per minute, burst = limit, cost 1, not shadow.
const (
	ceilingLimit    = "1000000000"
	ceilingPeriodUS = "60000000"
)

// loadCeilingScript loads rategate's own decide script (lua.Decide, what
// every rategate decision runs) and returns its SHA.
func loadCeilingScript(ctx context.Context, rdb *redis.Client) (string, error) {
	src, err := lua.Decide()
	if err != nil {
		return "", err
	}
	sha, err := rdb.ScriptLoad(ctx, src).Result()
	if err != nil {
		return "", fmt.Errorf("redis SCRIPT LOAD decide.lua: %w", err)
	}
	return sha, nil
}

// ceilingCommand is the command redis-benchmark repeats: one decision of
// the hot-key rule on one key, Redis's clock (ARGV[1] = 0).
func ceilingCommand(sha string) []string {
	return []string{"evalsha", sha, "1", ceilingKey, "0",
		strconv.Itoa(limits.FixedWindow.Code()), ceilingLimit, ceilingPeriodUS, ceilingLimit, "1", "0"}
}

// parseRedisBenchmark reads redis-benchmark --csv output: a header line and
// one line per test ("test","rps","avg_latency_ms","min_latency_ms",
// "p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms").
// requests is the -n it was given.
func parseRedisBenchmark(out string, requests int64) (wrkResult, error) {
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) < 2 {
		return wrkResult{}, fmt.Errorf("redis-benchmark output without a result line (%v):\n%s", err, out)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	row := recs[1]
	get := func(name string) (float64, error) {
		i, ok := col[name]
		if !ok || i >= len(row) {
			return 0, fmt.Errorf("redis-benchmark output has no %s column:\n%s", name, out)
		}
		return strconv.ParseFloat(row[i], 64)
	}
	var r wrkResult
	var errs [3]error
	r.RPS, errs[0] = get("rps")
	r.P50MS, errs[1] = get("p50_latency_ms")
	r.P99MS, errs[2] = get("p99_latency_ms")
	for _, e := range errs {
		if e != nil {
			return wrkResult{}, e
		}
	}
	if r.RPS <= 0 {
		return wrkResult{}, fmt.Errorf("redis-benchmark: rps %v:\n%s", r.RPS, out)
	}
	r.Requests = requests
	return r, nil
}
