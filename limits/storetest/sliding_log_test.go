package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/lua"
)

// evalStandalone runs one whole lua/<file> the way redis-cli --eval does and
// returns its reply {allowed, remaining, reset_us, retry_us}.
func evalStandalone(t *testing.T, client *redis.Client, src, key string, now, limit, period, cost int64) [4]int64 {
	t.Helper()
	v, err := client.Eval(context.Background(), src, []string{key}, now, limit, period, limit, cost).Result()
	if err != nil {
		t.Fatalf("eval: %v", err)
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 4 {
		t.Fatalf("reply %#v, want 4 integers", v)
	}
	var out [4]int64
	for i := range arr {
		n, ok := arr[i].(int64)
		if !ok {
			t.Fatalf("reply %#v: element %d is not an integer", v, i)
		}
		out[i] = n
	}
	return out
}

// standaloneStep is one hand-run of a standalone script.
type standaloneStep struct {
	at, cost int64 // at: µs after the start
	want     [4]int64
}

func runStandalone(t *testing.T, file, key string, limit, period int64, start int64, steps []standaloneStep) {
	t.Helper()
	src, err := lua.Source(file)
	if err != nil {
		t.Fatal(err)
	}
	client := testredis.Start(t).Client(t)
	for i, st := range steps {
		if got := evalStandalone(t, client, src, key, start+st.at, limit, period, st.cost); got != st.want {
			t.Fatalf("%s step %d (t=+%dµs cost %d): reply %v, want %v", file, i, st.at, st.cost, got, st.want)
		}
	}
	// ARGV[1] = 0 reads Redis TIME.
	if got := evalStandalone(t, client, src, key+"-clock", 0, limit, period, 1); got[0] != 1 || got[1] != limit-1 {
		t.Fatalf("%s with the Redis clock: reply %v, want allowed with %d left", file, got, limit-1)
	}
}

func TestSlidingLogStandaloneScript(t *testing.T) {
	const s = int64(time.Second / time.Microsecond)
	p := 60 * s
	runStandalone(t, "sliding_log.lua", "rg:{demo:1.2.3.4}:sl2", 3, p, WindowStart(time.Minute), []standaloneStep{
		{0, 1, [4]int64{1, 2, p, 0}},
		{0, 1, [4]int64{1, 1, p, 0}},
		{10 * s, 1, [4]int64{1, 0, p, 0}},
		{20 * s, 1, [4]int64{0, 0, 50 * s, 40 * s}}, // the two 0s entries leave at 60s
		{20 * s, 2, [4]int64{0, 0, 50 * s, 40 * s}},
		{20 * s, 4, [4]int64{0, 0, 50 * s, -1}},
		{60 * s, 2, [4]int64{1, 0, p, 0}}, // (0s, 60s]: only the 10s entry left
	})
}
