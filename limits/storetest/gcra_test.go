package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/lua"
)

// gtEval runs a whole script file, as redis-cli --eval would.
func gtEval(t *testing.T, client *redis.Client, src, key string, args ...int64) [4]int64 {
	t.Helper()
	argv := make([]any, len(args))
	for i, a := range args {
		argv[i] = a
	}
	v, err := client.Eval(context.Background(), src, []string{key}, argv...).Result()
	if err != nil {
		t.Fatalf("eval: %v", err)
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 4 {
		t.Fatalf("reply %#v, want 4 integers", v)
	}
	var out [4]int64
	for i := range arr {
		if out[i], ok = arr[i].(int64); !ok {
			t.Fatalf("reply item %d is %T, want integer", i, arr[i])
		}
	}
	return out
}

// gtStandalone checks redis-cell's first vector against a whole script file
// run on its own: five at t=0 fit, the sixth waits a second.
func gtStandalone(t *testing.T, file, key string) {
	t.Helper()
	src, err := lua.Source(file)
	if err != nil {
		t.Fatal(err)
	}
	client := testredis.Start(t).Client(t)
	now := time.Now().UnixMicro()
	const sec = 1_000_000
	want := [][4]int64{
		{1, 4, 1 * sec, 0}, {1, 3, 2 * sec, 0}, {1, 2, 3 * sec, 0}, {1, 1, 4 * sec, 0}, {1, 0, 5 * sec, 0},
		{0, 0, 5 * sec, 1 * sec},
	}
	for i, w := range want {
		// ARGV: now, limit, period µs, burst, cost
		if got := gtEval(t, client, src, key, now, 1, sec, 5, 1); got != w {
			t.Fatalf("%s request %d: got %v, want %v", file, i, got, w)
		}
	}
	if got, w := gtEval(t, client, src, key+"6", now, 1, sec, 5, 6), [4]int64{0, 5, 0, -1}; got != w {
		t.Fatalf("%s cost 6 on a fresh key: got %v, want %v (never fits)", file, got, w)
	}
	// ARGV[1] = 0: the script reads Redis TIME itself.
	if got := gtEval(t, client, src, key+"t", 0, 1, sec, 5, 1); got != [4]int64{1, 4, sec, 0} {
		t.Fatalf("%s on Redis TIME: got %v", file, got)
	}
}

func TestGCRAStandaloneScript(t *testing.T) {
	gtStandalone(t, "gcra.lua", "rg:{demo:1.2.3.4}:gc2")
}
