package lua

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/limits"
)

// algorithmFiles is the algorithm table as these tests walk it: each
// algorithm's script file and function name, in code order.
var algorithmFiles = func() []struct{ file, fn string } {
	var out []struct{ file, fn string }
	for _, a := range limits.AlgorithmTable() {
		out = append(out, struct{ file, fn string }{string(a.Name) + ".lua", string(a.Name)})
	}
	return out
}()

// Code returns the driver code of an algorithm name, or 0.
func Code(name string) int { return limits.Algorithm(name).Code() }

// fwCount is the count of the fixed_window record at key, whatever the
// key's name ("" when there is none, or it holds something else).
func fwCount(tb testing.TB, c redis.Cmdable, key string) string {
	tb.Helper()
	v, err := c.Get(context.Background(), key).Bytes()
	if err != nil {
		return ""
	}
	info, _ := limits.FixedWindow.Info()
	rec, _ := info.DecodeRecord(v)
	return rec["n"]
}
